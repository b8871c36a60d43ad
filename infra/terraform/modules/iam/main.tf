# One IAM role per service, assumed through IRSA by exactly one Kubernetes service account, each
# allowed only what the service does (topics/catalog.py names every topic and group):
#
#   worker      reads weights and adapters; consumes llmq.jobs.* in group llmq.workers.<pool>;
#               produces usage, results, dead letters and requeued jobs
#   gateway     reads and writes files, reads adapters (checked at registration); creates the
#               topics of a new pool and the registry; produces jobs, batch events and registry
#               records; reads the registry and usage (group llmq.gateways.quota)
#   batch       reads and writes files; consumes llmq.batches and llmq.results (groups
#               llmq.batch.*); produces jobs; reads the registry
#   controller  creates a pool's topics before starting it; reads and writes the registry
#   keda        reads the worker groups' committed offsets and the job topics' end offsets
#               (consumer lag, which drives the worker Deployments' replicas)
#
# MSK IAM resources: cluster/<name>/<uuid>, topic/<name>/<uuid>/<topic>,
# group/<name>/<uuid>/<group>; the topic and group prefixes below are derived from the cluster
# ARN.

data "aws_region" "current" {}

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  cluster = var.msk_cluster_arn
  topic   = "${replace(var.msk_cluster_arn, ":cluster/", ":topic/")}/"
  group   = "${replace(var.msk_cluster_arn, ":cluster/", ":group/")}/"

  job_topics = "${local.topic}llmq.jobs.*"
  registry   = "${local.topic}llmq.registry"
  usage      = "${local.topic}llmq.usage"
  results    = "${local.topic}llmq.results"
  batches    = "${local.topic}llmq.batches"
  dead       = "${local.topic}llmq.dead"
  any_topic  = "${local.topic}llmq.*"

  s3_via  = "s3.${data.aws_region.current.region}.amazonaws.com"
  account = "arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}"

  service_accounts = { for service, account in var.service_accounts : service => account }

  policies = {
    worker     = data.aws_iam_policy_document.worker.json
    gateway    = data.aws_iam_policy_document.gateway.json
    batch      = data.aws_iam_policy_document.batch.json
    controller = data.aws_iam_policy_document.controller.json
    keda       = data.aws_iam_policy_document.keda.json
  }
}

data "aws_iam_policy_document" "trust" {
  for_each = local.service_accounts

  statement {
    actions = ["sts:AssumeRoleWithWebIdentity"]
    principals {
      type        = "Federated"
      identifiers = [var.oidc_provider_arn]
    }
    condition {
      test     = "StringEquals"
      variable = "${var.oidc_issuer}:sub"
      values   = ["system:serviceaccount:${each.value.namespace}:${each.value.name}"]
    }
    condition {
      test     = "StringEquals"
      variable = "${var.oidc_issuer}:aud"
      values   = ["sts.amazonaws.com"]
    }
  }

  # KEDA's TriggerAuthentication (podIdentity provider aws with roleArn) has the operator, which
  # already runs as this role through IRSA, assume roleArn again. A role cannot name itself as a
  # principal before it exists, hence the account principal narrowed to this role's ARN.
  dynamic "statement" {
    for_each = each.key == "keda" ? ["${local.account}:role/${var.name}-keda"] : []

    content {
      actions = ["sts:AssumeRole", "sts:TagSession"]
      principals {
        type        = "AWS"
        identifiers = ["${local.account}:root"]
      }
      condition {
        test     = "ArnEquals"
        variable = "aws:PrincipalArn"
        values   = [statement.value]
      }
    }
  }
}

resource "aws_iam_role" "this" {
  for_each = local.service_accounts

  name               = "${var.name}-${each.key}"
  description        = "llmq ${each.key}: IRSA for ${each.value.namespace}/${each.value.name}"
  assume_role_policy = data.aws_iam_policy_document.trust[each.key].json

  tags = var.tags
}

resource "aws_iam_role_policy" "this" {
  for_each = local.service_accounts

  name   = "llmq-${each.key}"
  role   = aws_iam_role.this[each.key].id
  policy = local.policies[each.key]
}

# --- worker ---------------------------------------------------------------------------------

data "aws_iam_policy_document" "worker" {
  statement {
    sid       = "KafkaConnect"
    actions   = ["kafka-cluster:Connect"]
    resources = [local.cluster]
  }

  statement {
    sid       = "ConsumeJobs"
    actions   = ["kafka-cluster:DescribeTopic", "kafka-cluster:ReadData"]
    resources = [local.job_topics]
  }

  statement {
    sid       = "ProduceOutcomes"
    actions   = ["kafka-cluster:DescribeTopic", "kafka-cluster:WriteData"]
    resources = [local.job_topics, local.usage, local.results, local.dead]
  }

  statement {
    sid       = "WorkerGroups"
    actions   = ["kafka-cluster:DescribeGroup", "kafka-cluster:AlterGroup"]
    resources = ["${local.group}llmq.workers.*"]
  }

  statement {
    sid       = "ReadWeightsAndAdapters"
    actions   = ["s3:GetObject"]
    resources = ["${var.bucket_arns.weights}/*", "${var.bucket_arns.adapters}/*"]
  }

  statement {
    sid       = "ListWeightsAndAdapters"
    actions   = ["s3:ListBucket"]
    resources = [var.bucket_arns.weights, var.bucket_arns.adapters]
  }

  statement {
    sid       = "DecryptObjects"
    actions   = ["kms:Decrypt"]
    resources = [var.s3_kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.s3_via]
    }
  }
}

# --- gateway --------------------------------------------------------------------------------

data "aws_iam_policy_document" "gateway" {
  statement {
    sid       = "KafkaConnect"
    actions   = ["kafka-cluster:Connect", "kafka-cluster:DescribeCluster"]
    resources = [local.cluster]
  }

  statement {
    sid       = "CreateTopics"
    actions   = ["kafka-cluster:DescribeTopic", "kafka-cluster:CreateTopic"]
    resources = [local.any_topic]
  }

  statement {
    sid       = "Produce"
    actions   = ["kafka-cluster:WriteData"]
    resources = [local.job_topics, local.batches, local.registry]
  }

  statement {
    sid       = "Consume"
    actions   = ["kafka-cluster:ReadData"]
    resources = [local.registry, local.usage]
  }

  statement {
    sid       = "GatewayGroups"
    actions   = ["kafka-cluster:DescribeGroup", "kafka-cluster:AlterGroup"]
    resources = ["${local.group}llmq.gateways.*"]
  }

  statement {
    sid       = "ReadWriteFiles"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
    resources = ["${var.bucket_arns.files}/*"]
  }

  statement {
    sid       = "ReadAdapters"
    actions   = ["s3:GetObject"]
    resources = ["${var.bucket_arns.adapters}/*"]
  }

  statement {
    sid       = "ListFilesAndAdapters"
    actions   = ["s3:ListBucket", "s3:ListBucketMultipartUploads"]
    resources = [var.bucket_arns.files, var.bucket_arns.adapters]
  }

  statement {
    sid       = "EncryptDecryptObjects"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [var.s3_kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.s3_via]
    }
  }
}

# --- batch service --------------------------------------------------------------------------

data "aws_iam_policy_document" "batch" {
  statement {
    sid       = "KafkaConnect"
    actions   = ["kafka-cluster:Connect"]
    resources = [local.cluster]
  }

  statement {
    sid       = "DescribeTopics"
    actions   = ["kafka-cluster:DescribeTopic"]
    resources = [local.job_topics, local.batches, local.results, local.registry]
  }

  statement {
    sid       = "Consume"
    actions   = ["kafka-cluster:ReadData"]
    resources = [local.batches, local.results, local.registry]
  }

  statement {
    sid       = "ProduceJobs"
    actions   = ["kafka-cluster:WriteData"]
    resources = [local.job_topics]
  }

  statement {
    sid       = "BatchGroups"
    actions   = ["kafka-cluster:DescribeGroup", "kafka-cluster:AlterGroup"]
    resources = ["${local.group}llmq.batch.*"]
  }

  statement {
    sid       = "ReadWriteFiles"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
    resources = ["${var.bucket_arns.files}/*"]
  }

  statement {
    sid       = "ListFiles"
    actions   = ["s3:ListBucket", "s3:ListBucketMultipartUploads"]
    resources = [var.bucket_arns.files]
  }

  statement {
    sid       = "EncryptDecryptObjects"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [var.s3_kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.s3_via]
    }
  }
}

# --- pool controller ------------------------------------------------------------------------

data "aws_iam_policy_document" "controller" {
  statement {
    sid       = "KafkaConnect"
    actions   = ["kafka-cluster:Connect", "kafka-cluster:DescribeCluster"]
    resources = [local.cluster]
  }

  statement {
    sid       = "CreateTopics"
    actions   = ["kafka-cluster:DescribeTopic", "kafka-cluster:CreateTopic"]
    resources = [local.any_topic]
  }

  statement {
    sid       = "Registry"
    actions   = ["kafka-cluster:ReadData", "kafka-cluster:WriteData"]
    resources = [local.registry]
  }
}

# --- KEDA operator --------------------------------------------------------------------------

data "aws_iam_policy_document" "keda" {
  statement {
    sid       = "KafkaConnect"
    actions   = ["kafka-cluster:Connect"]
    resources = [local.cluster]
  }

  statement {
    sid       = "JobTopicOffsets"
    actions   = ["kafka-cluster:DescribeTopic"]
    resources = [local.job_topics]
  }

  statement {
    sid       = "WorkerGroupOffsets"
    actions   = ["kafka-cluster:DescribeGroup"]
    resources = ["${local.group}llmq.workers.*"]
  }
}
