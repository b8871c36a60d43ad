# The production fleet: one VPC, one EKS cluster with a GPU node group per model pool, MSK,
# Valkey, the S3 buckets and the services' IRSA roles. The GPU node groups come from
# `llmq plan`, which writes fleet.auto.tfvars.json next to this file.

provider "aws" {
  region = var.region

  default_tags {
    tags = var.tags
  }
}

locals {
  # A pool runs at most max_size * gpus_per_node / tensor_parallel engine replicas; each job
  # topic of the pool needs that many partitions, because KEDA never scales a consumer group
  # beyond its topic's partitions (an idle replica without a partition wastes its GPUs).
  job_topic_partitions = {
    for pool, group in var.gpu_node_groups :
    pool => floor(group.max_size * group.gpus_per_node / group.tensor_parallel)
  }
}

module "network" {
  source = "../../modules/network"

  name               = var.cluster_name
  cidr               = var.vpc_cidr
  availability_zones = var.availability_zones
  log_retention_days = var.log_retention_days
}

module "eks" {
  source = "../../modules/eks"

  name               = var.cluster_name
  kubernetes_version = var.kubernetes_version
  vpc_id             = module.network.vpc_id
  subnet_ids         = module.network.private_subnet_ids
  logs_kms_key_arn   = module.network.logs_kms_key_arn
  log_retention_days = var.log_retention_days
  api_allowed_cidrs  = var.api_allowed_cidrs
  admin_role_arns    = var.admin_role_arns
  gpu_node_groups    = var.gpu_node_groups
}

module "msk" {
  source = "../../modules/msk"

  name                      = var.cluster_name
  vpc_id                    = module.network.vpc_id
  subnet_ids                = module.network.private_subnet_ids
  client_security_group_ids = [module.eks.cluster_security_group_id]
  job_topic_partitions      = local.job_topic_partitions
  logs_kms_key_arn          = module.network.logs_kms_key_arn
  log_retention_days        = var.log_retention_days
}

module "elasticache" {
  source = "../../modules/elasticache"

  name                      = var.cluster_name
  vpc_id                    = module.network.vpc_id
  subnet_ids                = module.network.private_subnet_ids
  client_security_group_ids = [module.eks.cluster_security_group_id]
  auth_token                = var.redis_auth_token
  logs_kms_key_arn          = module.network.logs_kms_key_arn
  log_retention_days        = var.log_retention_days
}

module "s3" {
  source = "../../modules/s3"

  name = var.cluster_name
}

module "iam" {
  source = "../../modules/iam"

  name              = var.cluster_name
  oidc_provider_arn = module.eks.oidc_provider_arn
  oidc_issuer       = module.eks.oidc_issuer
  msk_cluster_arn   = module.msk.cluster_arn
  bucket_arns       = module.s3.bucket_arns
  s3_kms_key_arn    = module.s3.kms_key_arn
}
