output "cluster_arn" {
  description = "ARN of the MSK cluster (the IAM policies of modules/iam derive topic and group ARNs from it)."
  value       = aws_msk_cluster.this.arn
}

output "cluster_name" {
  description = "Name of the MSK cluster."
  value       = aws_msk_cluster.this.cluster_name
}

output "bootstrap_brokers_iam" {
  description = "Bootstrap servers for SASL/IAM over TLS (port 9098): LLMQ_KAFKA_BOOTSTRAP."
  value       = aws_msk_cluster.this.bootstrap_brokers_sasl_iam
}

output "security_group_id" {
  description = "Security group of the brokers."
  value       = aws_security_group.this.id
}

output "topics" {
  description = "The topics llmq creates and the settings it must give them, keyed by topic name: partitions, cleanup.policy and retention.ms (-1: forever). Replication factor 3 and min.insync.replicas 2 come from the broker configuration."
  value       = local.topics
}
