variable "name" {
  description = "Name of the MSK cluster and prefix of its configuration, key, log group and security group."
  type        = string
}

variable "vpc_id" {
  description = "ID of the VPC the brokers run in."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets, one per availability zone; the broker count is a multiple of their number."
  type        = list(string)
}

variable "client_security_group_ids" {
  description = "Security groups whose members may connect to the brokers (the EKS cluster security group)."
  type        = list(string)
}

variable "kafka_version" {
  description = "Apache Kafka version of the brokers."
  type        = string
  default     = "3.8.x"
}

variable "broker_instance_type" {
  description = "MSK broker instance type."
  type        = string
  default     = "kafka.m7g.large"
}

variable "broker_count" {
  description = "Number of brokers: a multiple of the subnet count, at least 3 for replication factor 3."
  type        = number
  default     = 3

  validation {
    condition     = var.broker_count >= 3
    error_message = "Replication factor 3 with min.insync.replicas 2 needs at least three brokers."
  }
}

variable "broker_volume_gb" {
  description = "EBS storage per broker (GiB) at creation; storage autoscaling grows it up to broker_volume_max_gb."
  type        = number
  default     = 1000
}

variable "broker_volume_max_gb" {
  description = "Upper bound (GiB) of the brokers' storage autoscaling."
  type        = number
  default     = 4000
}

variable "job_topic_retention_ms" {
  description = "Retention of the job topics (llmq.jobs.<pool>.<class>): long enough to replay a day's traffic after an incident (llmq replay); 7 days by default."
  type        = number
  default     = 604800000
}

variable "job_topic_partitions" {
  description = "Partitions of each pool's job topics, keyed by pool: the pool's most engine replicas, because KEDA never runs more consumers than partitions."
  type        = map(number)
  default     = {}
}

variable "shared_topic_partitions" {
  description = "Partitions of the shared topics llmq.usage, llmq.results, llmq.batches and llmq.dead."
  type        = number
  default     = 12
}

variable "logs_kms_key_arn" {
  description = "ARN of the customer KMS key that encrypts the broker log group."
  type        = string
}

variable "log_retention_days" {
  description = "Days the broker logs are kept in CloudWatch Logs."
  type        = number
  default     = 365
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
