# Kafka (MSK provisioned) carries every request: one job topic per model pool and priority class,
# plus usage, results, batch control, dead letters and the compacted registry. Clients
# authenticate with IAM (SASL/IAM on port 9098) and talk TLS only; brokers replicate over TLS.
#
# Topics are not created here (the AWS provider has no topic resource and brokers refuse
# auto-creation): llmq creates them (topics/kafka.py ensure_topics, the registry on first use),
# and must give them the settings in local.topics, which the `topics` output publishes:
#   llmq.jobs.<pool>.{interactive,batch}  partitions = the pool's most replicas (KEDA caps a
#                                         Deployment's replicas at its topic's partitions, so
#                                         fewer partitions would strand GPUs); retention 7 days,
#                                         so a lost stretch of traffic can be replayed
#   llmq.registry                         1 partition (one order over every deployment),
#                                         cleanup.policy=compact (the latest record per name is
#                                         its whole state), kept forever
#   llmq.usage/results/batches/dead       shared, var.shared_topic_partitions partitions
# Every topic: replication factor 3, min.insync.replicas 2 (producers use acks=all), so one
# broker may be lost without losing an acknowledged job.

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition

  job_topics = merge([
    for pool, partitions in var.job_topic_partitions : {
      for class in ["interactive", "batch"] : "llmq.jobs.${pool}.${class}" => {
        partitions     = partitions
        cleanup_policy = "delete"
        retention_ms   = var.job_topic_retention_ms
      }
    }
  ]...)

  shared_topics = {
    for topic in ["llmq.usage", "llmq.results", "llmq.batches", "llmq.dead"] : topic => {
      partitions     = var.shared_topic_partitions
      cleanup_policy = "delete"
      retention_ms   = var.job_topic_retention_ms
    }
  }

  topics = merge(local.job_topics, local.shared_topics, {
    "llmq.registry" = {
      partitions     = 1
      cleanup_policy = "compact"
      retention_ms   = -1
    }
  })
}

resource "aws_kms_key" "this" {
  description             = "${var.name}: MSK data at rest"
  enable_key_rotation     = true
  deletion_window_in_days = 30

  # The account administers the key; MSK uses it through grants made with the caller's rights.
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "AccountAdministers"
      Effect    = "Allow"
      Principal = { AWS = "arn:${local.partition}:iam::${local.account_id}:root" }
      Action    = "kms:*"
      Resource  = "*"
    }]
  })

  tags = var.tags
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name}-msk"
  target_key_id = aws_kms_key.this.key_id
}

resource "aws_cloudwatch_log_group" "brokers" {
  name              = "/aws/msk/${var.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.logs_kms_key_arn

  tags = var.tags
}

resource "aws_security_group" "this" {
  name        = "${var.name}-msk"
  description = "MSK brokers: Kafka over TLS with IAM auth from the cluster's pods only"
  vpc_id      = var.vpc_id

  ingress {
    description     = "Kafka, TLS with SASL/IAM, from EKS nodes and pods"
    from_port       = 9098
    to_port         = 9098
    protocol        = "tcp"
    security_groups = var.client_security_group_ids
  }

  tags = merge(var.tags, { Name = "${var.name}-msk" })
}

resource "aws_msk_configuration" "this" {
  name           = var.name
  description    = "llmq: no auto-created topics, replication 3, min ISR 2"
  kafka_versions = [var.kafka_version]

  # auto.create.topics.enable=false: a typo in a pool name must fail, not create a topic with
  # one partition that no worker reads. Retention here is the default of topics created
  # without one; llmq sets it per topic anyway.
  server_properties = <<-EOT
    auto.create.topics.enable=false
    default.replication.factor=3
    min.insync.replicas=2
    num.partitions=${var.shared_topic_partitions}
    unclean.leader.election.enable=false
    delete.topic.enable=true
    log.retention.ms=${var.job_topic_retention_ms}
    offsets.retention.minutes=10080
  EOT
}

resource "aws_msk_cluster" "this" {
  cluster_name           = var.name
  kafka_version          = var.kafka_version
  number_of_broker_nodes = var.broker_count
  enhanced_monitoring    = "PER_TOPIC_PER_PARTITION" # per-partition metrics, the lag KEDA acts on

  broker_node_group_info {
    instance_type   = var.broker_instance_type
    client_subnets  = var.subnet_ids
    security_groups = [aws_security_group.this.id]

    storage_info {
      ebs_storage_info {
        volume_size = var.broker_volume_gb
      }
    }

    connectivity_info {
      public_access {
        type = "DISABLED"
      }
    }
  }

  configuration_info {
    arn      = aws_msk_configuration.this.arn
    revision = aws_msk_configuration.this.latest_revision
  }

  client_authentication {
    unauthenticated = false
    sasl {
      iam = true
    }
  }

  encryption_info {
    encryption_at_rest_kms_key_arn = aws_kms_key.this.arn

    encryption_in_transit {
      client_broker = "TLS"
      in_cluster    = true
    }
  }

  logging_info {
    broker_logs {
      cloudwatch_logs {
        enabled   = true
        log_group = aws_cloudwatch_log_group.brokers.name
      }
    }
  }

  tags = var.tags

  lifecycle {
    # Storage autoscaling (below) grows the volumes; Terraform must not shrink them back.
    ignore_changes = [broker_node_group_info[0].storage_info[0].ebs_storage_info[0].volume_size]
  }
}

# Grow broker storage at 70% use instead of failing writes when replay retention fills disks.
resource "aws_appautoscaling_target" "storage" {
  service_namespace  = "kafka"
  resource_id        = aws_msk_cluster.this.arn
  scalable_dimension = "kafka:broker-storage:VolumeSize"
  min_capacity       = 1
  max_capacity       = var.broker_volume_max_gb
}

resource "aws_appautoscaling_policy" "storage" {
  name               = "${var.name}-broker-storage"
  policy_type        = "TargetTrackingScaling"
  service_namespace  = aws_appautoscaling_target.storage.service_namespace
  resource_id        = aws_appautoscaling_target.storage.resource_id
  scalable_dimension = aws_appautoscaling_target.storage.scalable_dimension

  target_tracking_scaling_policy_configuration {
    predefined_metric_specification {
      predefined_metric_type = "KafkaBrokerStorageUtilization"
    }
    target_value = 70
  }
}
