# Valkey (Redis-compatible) carries the token stream back from the workers to the gateways
# (pub/sub reply channels), cancellations, heartbeats, token buckets, backlog counters and batch
# state. It is on every request's path, so: Multi-AZ with automatic failover, TLS required, an
# AUTH token, and at-rest encryption with a customer key.

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
}

resource "aws_kms_key" "this" {
  description             = "${var.name}: ElastiCache data at rest"
  enable_key_rotation     = true
  deletion_window_in_days = 30

  # The account administers the key; ElastiCache uses it through grants made with the caller's
  # rights.
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
  name          = "alias/${var.name}-elasticache"
  target_key_id = aws_kms_key.this.key_id
}

resource "aws_elasticache_subnet_group" "this" {
  name        = var.name
  description = "${var.name}: private subnets of the cache nodes"
  subnet_ids  = var.subnet_ids

  tags = var.tags
}

resource "aws_security_group" "this" {
  name        = "${var.name}-cache"
  description = "Valkey: TLS on 6379 from the cluster's pods only"
  vpc_id      = var.vpc_id

  ingress {
    description     = "Valkey over TLS from EKS nodes and pods"
    from_port       = 6379
    to_port         = 6379
    protocol        = "tcp"
    security_groups = var.client_security_group_ids
  }

  tags = merge(var.tags, { Name = "${var.name}-cache" })
}

resource "aws_cloudwatch_log_group" "this" {
  for_each = toset(["slow-log", "engine-log"])

  name              = "/aws/elasticache/${var.name}/${each.value}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.logs_kms_key_arn

  tags = var.tags
}

resource "aws_elasticache_replication_group" "this" {
  replication_group_id = var.name
  description          = "llmq token streams, cancellations, heartbeats, quotas and batch state"
  engine               = "valkey"
  engine_version       = var.engine_version
  parameter_group_name = var.parameter_group_name
  node_type            = var.node_type
  num_cache_clusters   = var.num_cache_clusters
  port                 = 6379

  subnet_group_name  = aws_elasticache_subnet_group.this.name
  security_group_ids = [aws_security_group.this.id]

  automatic_failover_enabled = true
  multi_az_enabled           = true

  at_rest_encryption_enabled = true
  kms_key_id                 = aws_kms_key.this.arn
  transit_encryption_enabled = true
  transit_encryption_mode    = "required"
  auth_token                 = var.auth_token
  auth_token_update_strategy = "ROTATE"

  auto_minor_version_upgrade = true
  snapshot_retention_limit   = var.snapshot_retention_days
  apply_immediately          = false # parameter and size changes wait for the maintenance window

  dynamic "log_delivery_configuration" {
    for_each = aws_cloudwatch_log_group.this

    content {
      destination      = log_delivery_configuration.value.name
      destination_type = "cloudwatch-logs"
      log_format       = "json"
      log_type         = log_delivery_configuration.key
    }
  }

  tags = var.tags
}
