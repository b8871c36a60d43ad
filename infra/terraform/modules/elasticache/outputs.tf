output "primary_endpoint" {
  description = "Host name of the primary (follows failover); clients connect with TLS (rediss://) and the AUTH token: LLMQ_REDIS_URL."
  value       = aws_elasticache_replication_group.this.primary_endpoint_address
}

output "reader_endpoint" {
  description = "Host name that spreads reads over the replicas."
  value       = aws_elasticache_replication_group.this.reader_endpoint_address
}

output "port" {
  description = "TCP port of the endpoints."
  value       = aws_elasticache_replication_group.this.port
}

output "security_group_id" {
  description = "Security group of the cache nodes."
  value       = aws_security_group.this.id
}
