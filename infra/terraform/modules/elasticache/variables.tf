variable "name" {
  description = "ID of the replication group and prefix of its subnet group, key, log groups and security group."
  type        = string
}

variable "vpc_id" {
  description = "ID of the VPC the cache nodes run in."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets, one per availability zone, for the cache nodes."
  type        = list(string)
}

variable "client_security_group_ids" {
  description = "Security groups whose members may connect on 6379 (the EKS cluster security group)."
  type        = list(string)
}

variable "engine_version" {
  description = "Valkey engine version (major.minor)."
  type        = string
  default     = "8.0"
}

variable "parameter_group_name" {
  description = "Parameter group of the engine version (cluster mode off: pub/sub reply channels and Lua scripts use one keyspace)."
  type        = string
  default     = "default.valkey8"
}

variable "node_type" {
  description = "Cache node instance type."
  type        = string
  default     = "cache.r7g.large"
}

variable "num_cache_clusters" {
  description = "Nodes in the replication group: one primary and its replicas, spread over the availability zones."
  type        = number
  default     = 3

  validation {
    condition     = var.num_cache_clusters >= 2
    error_message = "Automatic failover needs a primary and at least one replica."
  }
}

variable "auth_token" {
  description = "AUTH token clients present (16 to 128 printable characters, no @, \" or /); pass it from a secret store, e.g. TF_VAR_redis_auth_token."
  type        = string
  sensitive   = true

  validation {
    condition     = length(var.auth_token) >= 16 && length(var.auth_token) <= 128
    error_message = "The AUTH token must be 16 to 128 characters long."
  }
}

variable "snapshot_retention_days" {
  description = "Days of daily snapshots kept (the state in Redis is rebuildable, but snapshots shorten recovery)."
  type        = number
  default     = 7
}

variable "logs_kms_key_arn" {
  description = "ARN of the customer KMS key that encrypts the slow-log and engine-log groups."
  type        = string
}

variable "log_retention_days" {
  description = "Days the slow and engine logs are kept in CloudWatch Logs."
  type        = number
  default     = 365
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
