terraform {
  required_version = ">= 1.9"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 6.0"
    }
  }

  # State lives in S3 with native locking; fill in the bucket of the account before `init`.
  # backend "s3" {
  #   bucket       = "<state-bucket>"
  #   key          = "llmq/prod/terraform.tfstate"
  #   region       = "us-east-1"
  #   encrypt      = true
  #   use_lockfile = true
  # }
}
