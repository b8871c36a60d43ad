variable "name" {
  description = "Name of the EKS cluster; also the prefix of its IAM roles, keys and launch templates."
  type        = string
}

variable "kubernetes_version" {
  description = "Kubernetes minor version of the control plane and the node groups' AMIs."
  type        = string
  default     = "1.33"
}

variable "vpc_id" {
  description = "ID of the VPC the cluster runs in."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets (one per availability zone) for the control-plane network interfaces and every node group."
  type        = list(string)
}

variable "logs_kms_key_arn" {
  description = "ARN of the customer KMS key that encrypts the control-plane log group."
  type        = string
}

variable "log_retention_days" {
  description = "Days the control-plane logs are kept in CloudWatch Logs."
  type        = number
  default     = 365
}

variable "api_allowed_cidrs" {
  description = "CIDRs (VPN, bastion, CI runners) allowed to reach the private API endpoint on 443, besides the cluster's own nodes."
  type        = list(string)
  default     = []
}

variable "admin_role_arns" {
  description = "IAM roles given cluster-admin through EKS access entries (the cluster uses API authentication, no aws-auth ConfigMap)."
  type        = list(string)
  default     = []
}

variable "system_node_group" {
  description = "The system node group (CoreDNS, KEDA, the pool controller, monitoring): CPU instance types and node counts."
  type = object({
    instance_types = list(string)
    min_size       = number
    desired_size   = number
    max_size       = number
  })
  default = {
    instance_types = ["m7i.xlarge"]
    min_size       = 3
    desired_size   = 3
    max_size       = 6
  }
}

variable "gateway_node_group" {
  description = "The gateway node group (the FastAPI gateways and the batch service): CPU instance types and node counts."
  type = object({
    instance_types = list(string)
    min_size       = number
    desired_size   = number
    max_size       = number
  })
  default = {
    instance_types = ["c7i.2xlarge"]
    min_size       = 3
    desired_size   = 3
    max_size       = 12
  }
}

variable "gpu_node_groups" {
  description = "One GPU node group per model pool, keyed by pool name (the `llmq.dev/pool` node label)."
  type = map(object({
    instance_type   = string # e.g. p5.48xlarge (8 x H100) for the 70B TP-4 pool, g6e.xlarge for the 8B
    gpus_per_node   = number
    tensor_parallel = number # GPUs per engine replica
    min_size        = number # the warm floor: nodes kept running at the trough
    desired_size    = number # nodes at the planned peak
    max_size        = number # peak plus headroom
  }))

  validation {
    condition = alltrue([
      for g in values(var.gpu_node_groups) : g.min_size <= g.desired_size && g.desired_size <= g.max_size
    ])
    error_message = "Every GPU node group needs min_size <= desired_size <= max_size."
  }

  validation {
    condition = alltrue([
      for g in values(var.gpu_node_groups) : g.tensor_parallel >= 1 && g.gpus_per_node % g.tensor_parallel == 0
    ])
    error_message = "tensor_parallel must divide gpus_per_node: an engine replica never spans two nodes."
  }
}

variable "cpu_root_volume_gb" {
  description = "Root volume size (GiB) of the CPU nodes."
  type        = number
  default     = 100
}

variable "gpu_root_volume_gb" {
  description = "Root volume size (GiB) of the GPU nodes: the OS only, since containerd, kubelet and the weight cache move to the instance-store RAID0."
  type        = number
  default     = 100
}

variable "ebs_kms_key_arn" {
  description = "Customer KMS key for the nodes' root volumes; null uses the account's EBS default key. A customer key must grant the AWSServiceRoleForAutoScaling role in its key policy, or instances fail to launch."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
