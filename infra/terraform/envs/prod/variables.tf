variable "region" {
  description = "AWS region of the fleet."
  type        = string
  default     = "us-east-1"
}

variable "cluster_name" {
  description = "Name of the EKS cluster, and prefix of every other resource."
  type        = string
  default     = "llmq-prod"
}

variable "availability_zones" {
  description = "The three availability zones of the fleet, in var.region (pick zones with GPU capacity, e.g. where the p5 capacity reservations are). Named explicitly so that a zone AWS adds never moves subnets."
  type        = list(string)
  default     = ["us-east-1a", "us-east-1b", "us-east-1c"]

  validation {
    condition     = length(var.availability_zones) == 3
    error_message = "Give exactly three availability zones."
  }
}

variable "vpc_cidr" {
  description = "IPv4 CIDR of the VPC."
  type        = string
  default     = "10.0.0.0/16"
}

variable "kubernetes_version" {
  description = "Kubernetes minor version of the EKS cluster."
  type        = string
  default     = "1.33"
}

variable "api_allowed_cidrs" {
  description = "CIDRs (VPN, bastion, CI runners) allowed to reach the private Kubernetes API endpoint."
  type        = list(string)
  default     = []
}

variable "admin_role_arns" {
  description = "IAM roles given cluster-admin on the EKS cluster."
  type        = list(string)
  default     = []
}

variable "gpu_node_groups" {
  description = "One GPU node group per model pool, keyed by pool name; written by `llmq plan` (fleet.auto.tfvars.json)."
  type = map(object({
    instance_type   = string # e.g. p5.48xlarge (8 x H100) for the 70B TP-4 pool, g6e.xlarge for the 8B
    gpus_per_node   = number
    tensor_parallel = number # GPUs per engine replica
    min_size        = number # the warm floor: nodes kept running at the trough
    desired_size    = number # nodes at the planned peak
    max_size        = number # peak plus headroom
  }))
}

variable "redis_auth_token" {
  description = "AUTH token of the Valkey replication group (16 to 128 characters); set TF_VAR_redis_auth_token from the secret store, never in a file."
  type        = string
  sensitive   = true
}

variable "log_retention_days" {
  description = "Days every CloudWatch log group (flow logs, EKS, MSK, ElastiCache) keeps its logs."
  type        = number
  default     = 365
}

variable "tags" {
  description = "Tags added to every resource (through the provider's default_tags)."
  type        = map(string)
  default = {
    project     = "llmq"
    environment = "prod"
    managed-by  = "terraform"
  }
}
