# The EKS cluster: private API endpoint only, every control-plane log type, secrets encrypted
# with a customer key, IRSA, and three kinds of managed node groups:
#   system   CPU, cluster add-ons, KEDA and the pool controller
#   gateway  CPU, the gateways and the batch service
#   gpu-*    one per model pool (var.gpu_node_groups), tainted so only GPU workers land there
# The node groups' desired sizes belong to the cluster autoscaler (KEDA scales the worker
# Deployments on Kafka lag; the autoscaler adds nodes for pending workers), so Terraform sets
# them at creation only.

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  policy_arn = "arn:${local.partition}:iam::aws:policy"

  cpu_node_groups = {
    system  = var.system_node_group
    gateway = var.gateway_node_group
  }

  # AL2023 nodes are configured by nodeadm. EKS merges its own NodeConfig (cluster name,
  # endpoint, CA) with this part; this part only assembles the instance-store NVMe devices into
  # one RAID0 array, mounted at /mnt/k8s-disks/0, onto which nodeadm moves kubelet's and
  # containerd's folders. Pod emptyDirs (the default weight cache) and hostPath caches under
  # /mnt/k8s-disks/0 therefore sit on NVMe; weights downloaded once per node are read by every
  # replica on it.
  gpu_user_data = <<-EOT
    MIME-Version: 1.0
    Content-Type: multipart/mixed; boundary="//"

    --//
    Content-Type: application/node.eks.aws

    ---
    apiVersion: node.eks.aws/v1alpha1
    kind: NodeConfig
    spec:
      instance:
        localStorage:
          strategy: RAID0

    --//--
  EOT

  # One launch template per node group; the GPU ones carry the NodeConfig above.
  launch_templates = merge(
    { for key, _ in local.cpu_node_groups : "cpu-${key}" => {
      root_volume_gb = var.cpu_root_volume_gb
      user_data      = null
    } },
    { for key, _ in var.gpu_node_groups : "gpu-${key}" => {
      root_volume_gb = var.gpu_root_volume_gb
      user_data      = base64encode(local.gpu_user_data)
    } },
  )
}

# --- Keys and logs ------------------------------------------------------------------------

resource "aws_kms_key" "secrets" {
  description             = "${var.name}: EKS secrets envelope encryption"
  enable_key_rotation     = true
  deletion_window_in_days = 30

  # The account administers the key; EKS uses it through grants made with the caller's rights.
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "AccountAdministers"
      Effect    = "Allow"
      Principal = { AWS = "arn:${local.partition}:iam::${local.account_id}:root" }
      Action    = "kms:*"
      Resource  = "*"
    }]
  })

  tags = var.tags
}

resource "aws_kms_alias" "secrets" {
  name          = "alias/${var.name}-eks-secrets"
  target_key_id = aws_kms_key.secrets.key_id
}

# Created before the cluster, so that EKS does not create it without retention or encryption.
resource "aws_cloudwatch_log_group" "cluster" {
  name              = "/aws/eks/${var.name}/cluster"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.logs_kms_key_arn

  tags = var.tags
}

# --- Cluster --------------------------------------------------------------------------------

data "aws_iam_policy_document" "cluster_assume" {
  statement {
    actions = ["sts:AssumeRole", "sts:TagSession"]
    principals {
      type        = "Service"
      identifiers = ["eks.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "cluster" {
  name               = "${var.name}-cluster"
  assume_role_policy = data.aws_iam_policy_document.cluster_assume.json

  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "cluster" {
  role       = aws_iam_role.cluster.name
  policy_arn = "${local.policy_arn}/AmazonEKSClusterPolicy"
}

resource "aws_eks_cluster" "this" {
  name     = var.name
  version  = var.kubernetes_version
  role_arn = aws_iam_role.cluster.arn

  enabled_cluster_log_types = ["api", "audit", "authenticator", "controllerManager", "scheduler"]

  access_config {
    authentication_mode                         = "API"
    bootstrap_cluster_creator_admin_permissions = true
  }

  vpc_config {
    subnet_ids              = var.subnet_ids
    endpoint_private_access = true
    endpoint_public_access  = false # reach the API from the VPC (VPN, bastion, CI in the VPC)
  }

  encryption_config {
    resources = ["secrets"]
    provider {
      key_arn = aws_kms_key.secrets.arn
    }
  }

  tags = var.tags

  depends_on = [aws_cloudwatch_log_group.cluster, aws_iam_role_policy_attachment.cluster]
}

# The private endpoint answers only the cluster security group (the nodes) unless more is let in.
resource "aws_vpc_security_group_ingress_rule" "api" {
  for_each = toset(var.api_allowed_cidrs)

  security_group_id = aws_eks_cluster.this.vpc_config[0].cluster_security_group_id
  description       = "Kubernetes API from ${each.value}"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = each.value
}

resource "aws_eks_access_entry" "admin" {
  for_each = toset(var.admin_role_arns)

  cluster_name  = aws_eks_cluster.this.name
  principal_arn = each.value

  tags = var.tags
}

resource "aws_eks_access_policy_association" "admin" {
  for_each = toset(var.admin_role_arns)

  cluster_name  = aws_eks_cluster.this.name
  principal_arn = aws_eks_access_entry.admin[each.value].principal_arn
  policy_arn    = "arn:${local.partition}:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"

  access_scope {
    type = "cluster"
  }
}

# IRSA: service accounts assume IAM roles (modules/iam) through the cluster's OIDC issuer. AWS
# validates EKS issuers against its own trusted CAs, so no thumbprint is pinned.
resource "aws_iam_openid_connect_provider" "this" {
  url            = aws_eks_cluster.this.identity[0].oidc[0].issuer
  client_id_list = ["sts.amazonaws.com"]

  tags = var.tags
}

# --- Nodes ----------------------------------------------------------------------------------

data "aws_iam_policy_document" "node_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "node" {
  name               = "${var.name}-node"
  assume_role_policy = data.aws_iam_policy_document.node_assume.json

  tags = var.tags
}

# The node role holds only what the kubelet, the VPC CNI and image pulls need (plus SSM for
# shell access without SSH); application pods get their AWS rights through IRSA, and IMDS is
# closed to them (hop limit 1 below).
resource "aws_iam_role_policy_attachment" "node" {
  for_each = toset([
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryPullOnly",
    "AmazonSSMManagedInstanceCore",
  ])

  role       = aws_iam_role.node.name
  policy_arn = "${local.policy_arn}/${each.value}"
}

resource "aws_launch_template" "node" {
  for_each = local.launch_templates

  name_prefix            = "${var.name}-${each.key}-"
  description            = "${var.name} ${each.key} nodes: IMDSv2 only, encrypted root volume"
  update_default_version = true
  user_data              = each.value.user_data

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required" # IMDSv2 only
    http_put_response_hop_limit = 1          # pods (one hop further) cannot reach the node role
    instance_metadata_tags      = "disabled"
  }

  block_device_mappings {
    device_name = "/dev/xvda"

    ebs {
      volume_size           = each.value.root_volume_gb
      volume_type           = "gp3"
      encrypted             = true
      kms_key_id            = var.ebs_kms_key_arn
      delete_on_termination = true
    }
  }

  monitoring {
    enabled = true
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(var.tags, { Name = "${var.name}-${each.key}" })
  }

  tag_specifications {
    resource_type = "volume"
    tags          = merge(var.tags, { Name = "${var.name}-${each.key}" })
  }

  tags = var.tags

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_eks_node_group" "cpu" {
  for_each = local.cpu_node_groups

  cluster_name    = aws_eks_cluster.this.name
  node_group_name = each.key
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = var.subnet_ids
  ami_type        = "AL2023_x86_64_STANDARD"
  capacity_type   = "ON_DEMAND"
  instance_types  = each.value.instance_types

  launch_template {
    id      = aws_launch_template.node["cpu-${each.key}"].id
    version = aws_launch_template.node["cpu-${each.key}"].latest_version
  }

  scaling_config {
    min_size     = each.value.min_size
    desired_size = each.value.desired_size
    max_size     = each.value.max_size
  }

  update_config {
    max_unavailable = 1
  }

  labels = {
    "llmq.dev/role" = each.key
  }

  tags = var.tags

  lifecycle {
    ignore_changes = [scaling_config[0].desired_size]
  }

  depends_on = [aws_iam_role_policy_attachment.node]
}

resource "aws_eks_node_group" "gpu" {
  for_each = var.gpu_node_groups

  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "gpu-${each.key}"
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = var.subnet_ids
  ami_type        = "AL2023_x86_64_NVIDIA" # NVIDIA driver and container toolkit preinstalled
  capacity_type   = "ON_DEMAND"
  instance_types  = [each.value.instance_type]

  launch_template {
    id      = aws_launch_template.node["gpu-${each.key}"].id
    version = aws_launch_template.node["gpu-${each.key}"].latest_version
  }

  # min_size is the warm floor kept at the trough (a cold GPU node takes minutes to boot and
  # pull weights); desired_size is the planned peak, used only when the group is created.
  scaling_config {
    min_size     = each.value.min_size
    desired_size = each.value.desired_size
    max_size     = each.value.max_size
  }

  # Replace GPU nodes a few at a time: each one drained is capacity lost until its successor
  # has loaded its weights.
  update_config {
    max_unavailable_percentage = 10
  }

  # EKS replaces nodes whose GPUs fail their health checks (XID errors, lost devices).
  node_repair_config {
    enabled = true
  }

  # The worker Deployments select their pool with llmq.dev/pool (control/k8s_manifests.py) and
  # tolerate the nvidia.com/gpu taint; nothing else may schedule here.
  labels = {
    "llmq.dev/pool"            = each.key
    "llmq.dev/role"            = "gpu-worker"
    "llmq.dev/tensor-parallel" = tostring(each.value.tensor_parallel)
  }

  taint {
    key    = "nvidia.com/gpu"
    value  = "true"
    effect = "NO_SCHEDULE"
  }

  tags = merge(var.tags, { "llmq.dev/pool" = each.key })

  lifecycle {
    ignore_changes = [scaling_config[0].desired_size] # the autoscaler owns desired
  }

  depends_on = [aws_iam_role_policy_attachment.node]
}

# Managed add-ons, kept at EKS's default versions for the cluster's Kubernetes minor. The
# NVIDIA device plugin, KEDA and the cluster autoscaler are installed with Helm, not here.
resource "aws_eks_addon" "this" {
  for_each = toset(["vpc-cni", "kube-proxy", "coredns", "eks-pod-identity-agent"])

  cluster_name                = aws_eks_cluster.this.name
  addon_name                  = each.value
  resolve_conflicts_on_create = "OVERWRITE"
  resolve_conflicts_on_update = "OVERWRITE"

  tags = var.tags

  depends_on = [aws_eks_node_group.cpu] # CoreDNS needs nodes to become active
}
