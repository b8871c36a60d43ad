output "bucket_names" {
  description = "Bucket names keyed by purpose: files, weights, adapters."
  value       = { for key, bucket in aws_s3_bucket.this : key => bucket.id }
}

output "bucket_arns" {
  description = "Bucket ARNs keyed by purpose: files, weights, adapters."
  value       = { for key, bucket in aws_s3_bucket.this : key => bucket.arn }
}

output "kms_key_arn" {
  description = "ARN of the customer KMS key that encrypts the data buckets (readers need kms:Decrypt, writers kms:GenerateDataKey)."
  value       = aws_kms_key.this.arn
}

output "access_log_bucket" {
  description = "Name of the bucket that receives the data buckets' server access logs."
  value       = aws_s3_bucket.logs.id
}
