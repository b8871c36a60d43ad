variable "name" {
  description = "Prefix of the role names (the cluster name)."
  type        = string
}

variable "oidc_provider_arn" {
  description = "ARN of the EKS cluster's IAM OIDC provider (the federated principal of every role here)."
  type        = string
}

variable "oidc_issuer" {
  description = "The cluster's OIDC issuer without https:// (prefix of the :sub and :aud condition keys)."
  type        = string
}

variable "service_accounts" {
  description = "Kubernetes service account (namespace and name) of each service; each role trusts only its own."
  type = object({
    worker     = object({ namespace = string, name = string })
    gateway    = object({ namespace = string, name = string })
    batch      = object({ namespace = string, name = string })
    controller = object({ namespace = string, name = string })
    keda       = object({ namespace = string, name = string })
  })
  default = {
    worker     = { namespace = "llmq", name = "llmq-worker" }
    gateway    = { namespace = "llmq", name = "llmq-gateway" }
    batch      = { namespace = "llmq", name = "llmq-batch" }
    controller = { namespace = "llmq", name = "llmq-controller" } # control/k8s_rbac.py
    keda       = { namespace = "keda", name = "keda-operator" }
  }
}

variable "msk_cluster_arn" {
  description = "ARN of the MSK cluster; topic and group ARNs are derived from it."
  type        = string
}

variable "bucket_arns" {
  description = "ARNs of the data buckets by purpose."
  type = object({
    files    = string
    weights  = string
    adapters = string
  })
}

variable "s3_kms_key_arn" {
  description = "ARN of the KMS key that encrypts the data buckets."
  type        = string
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
