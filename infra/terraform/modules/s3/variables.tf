variable "name" {
  description = "Prefix of the bucket names (the account ID is appended, since bucket names are global) and of the key alias."
  type        = string
}

variable "files_expiration_days" {
  description = "Days after which batch input and output files (and their index entries) in the files bucket expire."
  type        = number
  default     = 30

  validation {
    condition     = var.files_expiration_days >= 1
    error_message = "files_expiration_days must be at least 1."
  }
}

variable "noncurrent_version_days" {
  description = "Days a replaced or deleted object version is kept (undo window for overwritten weights and adapters)."
  type        = number
  default     = 30
}

variable "abort_multipart_days" {
  description = "Days after which an incomplete multipart upload (an interrupted weight or file upload) is aborted and its parts deleted."
  type        = number
  default     = 7
}

variable "access_log_retention_days" {
  description = "Days the server access logs are kept in the log bucket."
  type        = number
  default     = 365
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
