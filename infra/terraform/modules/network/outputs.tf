output "vpc_id" {
  description = "ID of the VPC."
  value       = aws_vpc.this.id
}

output "vpc_cidr" {
  description = "IPv4 CIDR of the VPC."
  value       = aws_vpc.this.cidr_block
}

output "private_subnet_ids" {
  description = "The private subnets (one per availability zone) for nodes, brokers and cache nodes."
  value       = aws_subnet.private[*].id
}

output "public_subnet_ids" {
  description = "The public subnets, which hold only the NAT gateways (and internet-facing load balancers, if any)."
  value       = aws_subnet.public[*].id
}

output "private_route_table_ids" {
  description = "The route tables of the private subnets."
  value       = aws_route_table.private[*].id
}

output "logs_kms_key_arn" {
  description = "ARN of the customer KMS key that encrypts every CloudWatch log group of the platform."
  value       = aws_kms_key.logs.arn
}

output "availability_zones" {
  description = "The availability zones of the subnets, in subnet order."
  value       = var.availability_zones
}
