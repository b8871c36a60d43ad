output "role_arns" {
  description = "IAM role ARN of each service, keyed by service (worker, gateway, batch, controller, keda): the eks.amazonaws.com/role-arn annotation of its service account."
  value       = { for service, role in aws_iam_role.this : service => role.arn }
}

output "service_accounts" {
  description = "The Kubernetes service account (namespace and name) each role trusts, keyed by service."
  value       = local.service_accounts
}
