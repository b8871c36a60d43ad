output "cluster_name" {
  description = "Name of the EKS cluster (aws eks update-kubeconfig --name ...)."
  value       = module.eks.cluster_name
}

output "cluster_endpoint" {
  description = "The private Kubernetes API endpoint."
  value       = module.eks.cluster_endpoint
}

output "gpu_node_groups" {
  description = "GPU node group name of each model pool."
  value       = module.eks.gpu_node_groups
}

output "weight_cache_host_path" {
  description = "Mount point of the GPU nodes' NVMe RAID0 (for a hostPath weight cache under it)."
  value       = module.eks.weight_cache_host_path
}

output "kafka_bootstrap" {
  description = "MSK bootstrap servers for SASL/IAM over TLS: LLMQ_KAFKA_BOOTSTRAP."
  value       = module.msk.bootstrap_brokers_iam
}

output "kafka_topics" {
  description = "The topics llmq must create and their settings (partitions, cleanup.policy, retention.ms), keyed by topic."
  value       = module.msk.topics
}

output "job_topic_partitions" {
  description = "Partitions of each pool's job topics (the pool's most engine replicas), keyed by pool."
  value       = local.job_topic_partitions
}

output "redis_endpoint" {
  description = "Primary endpoint of the Valkey replication group (TLS, AUTH token): the host of LLMQ_REDIS_URL (rediss://)."
  value       = module.elasticache.primary_endpoint
}

output "buckets" {
  description = "S3 bucket names keyed by purpose (files, weights, adapters)."
  value       = module.s3.bucket_names
}

output "service_role_arns" {
  description = "IRSA role ARN of each service (worker, gateway, batch, controller, keda), for the eks.amazonaws.com/role-arn annotation of its service account."
  value       = module.iam.role_arns
}

output "region" {
  description = "The AWS region of the fleet (MSK IAM tokens are signed for it)."
  value       = var.region
}
