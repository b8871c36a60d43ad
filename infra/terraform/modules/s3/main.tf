# Three data buckets, all encrypted with one customer key, versioned, private, TLS-only and
# logged to a fourth bucket:
#   files     batch input and output files (gateway and batch service); working data, expires
#   weights   model weights, read by every GPU node at start (then cached on its NVMe)
#   adapters  teams' LoRA adapters (s3://<adapters>/adapters/<team>/...), read by workers and
#             checked by the gateway when an adapter is registered

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition

  # Days until current objects expire; null keeps them until deleted.
  buckets = {
    files    = { expiration_days = var.files_expiration_days }
    weights  = { expiration_days = null }
    adapters = { expiration_days = null }
  }
}

resource "aws_kms_key" "this" {
  description             = "${var.name}: S3 files, weights and adapters"
  enable_key_rotation     = true
  deletion_window_in_days = 30

  # The account administers the key; the service roles (modules/iam) get Decrypt and
  # GenerateDataKey through their IAM policies, which the account statement delegates to.
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
  name          = "alias/${var.name}-s3"
  target_key_id = aws_kms_key.this.key_id
}

# --- Data buckets ---------------------------------------------------------------------------

resource "aws_s3_bucket" "this" {
  #checkov:skip=CKV_AWS_144:Single-region platform; weights and adapters are re-uploadable from their sources and batch files are short-lived working data, so cross-region replication is not worth doubling storage of multi-terabyte weights
  for_each = local.buckets

  bucket = "${var.name}-${each.key}-${local.account_id}"

  tags = merge(var.tags, { "llmq.dev/bucket" = each.key })
}

resource "aws_s3_bucket_ownership_controls" "this" {
  for_each = local.buckets

  bucket = aws_s3_bucket.this[each.key].id

  rule {
    object_ownership = "BucketOwnerEnforced" # no ACLs: access is IAM only
  }
}

resource "aws_s3_bucket_public_access_block" "this" {
  for_each = local.buckets

  bucket                  = aws_s3_bucket.this[each.key].id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "this" {
  for_each = local.buckets

  bucket = aws_s3_bucket.this[each.key].id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "this" {
  for_each = local.buckets

  bucket = aws_s3_bucket.this[each.key].id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.this.arn
    }
    # A bucket key: a node pulling hundreds of weight shards makes a few KMS calls, not one per
    # object (KMS request quotas and cost).
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "this" {
  for_each = local.buckets

  bucket = aws_s3_bucket.this[each.key].id

  rule {
    id     = "housekeeping"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = var.abort_multipart_days
    }

    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_version_days
    }
  }

  dynamic "rule" {
    for_each = local.buckets[each.key].expiration_days == null ? [] : [local.buckets[each.key].expiration_days]

    content {
      id     = "expire-working-files"
      status = "Enabled"

      filter {}

      expiration {
        days = rule.value
      }
    }
  }

  depends_on = [aws_s3_bucket_versioning.this]
}

resource "aws_s3_bucket_logging" "this" {
  for_each = local.buckets

  bucket        = aws_s3_bucket.this[each.key].id
  target_bucket = aws_s3_bucket.logs.id
  target_prefix = "${each.key}/"
}

# Object-level events to EventBridge (audit, and a hook for e.g. warming weights on upload).
resource "aws_s3_bucket_notification" "this" {
  for_each = local.buckets

  bucket      = aws_s3_bucket.this[each.key].id
  eventbridge = true
}

data "aws_iam_policy_document" "tls_only" {
  for_each = local.buckets

  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.this[each.key].arn,
      "${aws_s3_bucket.this[each.key].arn}/*",
    ]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "this" {
  for_each = local.buckets

  bucket = aws_s3_bucket.this[each.key].id
  policy = data.aws_iam_policy_document.tls_only[each.key].json

  depends_on = [aws_s3_bucket_public_access_block.this]
}

# --- Access-log bucket ----------------------------------------------------------------------

resource "aws_s3_bucket" "logs" {
  #checkov:skip=CKV_AWS_18:This is the access-log target; logging it would log its own log deliveries
  #checkov:skip=CKV_AWS_144:Access logs are an audit trail of this region's buckets; a copy elsewhere is not needed for the seed fleet
  #checkov:skip=CKV_AWS_145:S3 server access log delivery supports only SSE-S3 (AES256) on the target bucket, not SSE-KMS
  bucket = "${var.name}-access-logs-${local.account_id}"

  tags = merge(var.tags, { "llmq.dev/bucket" = "access-logs" })
}

resource "aws_s3_bucket_ownership_controls" "logs" {
  bucket = aws_s3_bucket.logs.id

  rule {
    object_ownership = "BucketOwnerEnforced" # log delivery is granted by bucket policy, not ACL
  }
}

resource "aws_s3_bucket_public_access_block" "logs" {
  bucket                  = aws_s3_bucket.logs.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "logs" {
  bucket = aws_s3_bucket.logs.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "logs" {
  bucket = aws_s3_bucket.logs.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256" # the only encryption server access log delivery supports
    }
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "logs" {
  bucket = aws_s3_bucket.logs.id

  rule {
    id     = "expire-access-logs"
    status = "Enabled"

    filter {}

    expiration {
      days = var.access_log_retention_days
    }

    noncurrent_version_expiration {
      noncurrent_days = 1
    }

    abort_incomplete_multipart_upload {
      days_after_initiation = var.abort_multipart_days
    }
  }

  depends_on = [aws_s3_bucket_versioning.logs]
}

resource "aws_s3_bucket_notification" "logs" {
  bucket      = aws_s3_bucket.logs.id
  eventbridge = true
}

data "aws_iam_policy_document" "logs" {
  statement {
    sid       = "S3ServerAccessLogDelivery"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.logs.arn}/*"]
    principals {
      type        = "Service"
      identifiers = ["logging.s3.amazonaws.com"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = [for bucket in aws_s3_bucket.this : bucket.arn]
    }
  }

  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.logs.arn, "${aws_s3_bucket.logs.arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "logs" {
  bucket = aws_s3_bucket.logs.id
  policy = data.aws_iam_policy_document.logs.json

  depends_on = [aws_s3_bucket_public_access_block.logs]
}
