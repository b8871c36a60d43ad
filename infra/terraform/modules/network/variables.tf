variable "name" {
  description = "Name prefix of every resource (the cluster name, e.g. llmq-prod)."
  type        = string
}

variable "cidr" {
  description = "IPv4 CIDR of the VPC. Pods take VPC addresses (VPC CNI), so it is sized for pods, not only nodes."
  type        = string
  default     = "10.0.0.0/16"
}

variable "availability_zones" {
  description = "The three availability zones of the subnets (one private and one public subnet in each)."
  type        = list(string)

  validation {
    condition     = length(var.availability_zones) == 3
    error_message = "llmq spreads brokers, cache nodes and node groups over exactly three availability zones."
  }
}

variable "interface_endpoints" {
  description = "AWS services reached through interface VPC endpoints instead of the NAT gateways: image pulls (ecr.*), IRSA token exchange (sts), logs, and the APIs the VPC CNI, the load balancer controller and the cluster autoscaler call."
  type        = set(string)
  default     = ["ecr.api", "ecr.dkr", "sts", "logs", "ec2", "elasticloadbalancing", "autoscaling"]
}

variable "log_retention_days" {
  description = "Days the VPC flow logs are kept in CloudWatch Logs."
  type        = number
  default     = 365
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
