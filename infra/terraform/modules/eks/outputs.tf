output "cluster_name" {
  description = "Name of the EKS cluster."
  value       = aws_eks_cluster.this.name
}

output "cluster_arn" {
  description = "ARN of the EKS cluster."
  value       = aws_eks_cluster.this.arn
}

output "cluster_endpoint" {
  description = "The private Kubernetes API endpoint (reachable from inside the VPC only)."
  value       = aws_eks_cluster.this.endpoint
}

output "cluster_certificate_authority" {
  description = "Base64 CA certificate of the Kubernetes API."
  value       = aws_eks_cluster.this.certificate_authority[0].data
}

output "cluster_security_group_id" {
  description = "The security group EKS attaches to the control plane and every managed node; brokers and caches admit it."
  value       = aws_eks_cluster.this.vpc_config[0].cluster_security_group_id
}

output "oidc_provider_arn" {
  description = "ARN of the IAM OIDC provider of the cluster (the federated principal of IRSA trust policies)."
  value       = aws_iam_openid_connect_provider.this.arn
}

output "oidc_issuer" {
  description = "The cluster's OIDC issuer without https:// (the prefix of the :sub and :aud condition keys)."
  value       = replace(aws_eks_cluster.this.identity[0].oidc[0].issuer, "https://", "")
}

output "node_role_arn" {
  description = "ARN of the IAM role of every managed node."
  value       = aws_iam_role.node.arn
}

output "gpu_node_groups" {
  description = "Node group name of each model pool's GPU node group, keyed by pool."
  value       = { for pool, group in aws_eks_node_group.gpu : pool => group.node_group_name }
}

output "weight_cache_host_path" {
  description = "Where the GPU nodes' instance-store RAID0 is mounted; a hostPath weight cache (LLMQ_K8S_HOST_PATH) belongs under it, e.g. <this>/llmq/weights."
  value       = "/mnt/k8s-disks/0"
}
