variable "region" {
  description = "AWS region to build the cluster in."
  type        = string
  default     = "eu-west-1"
}

variable "cluster_name" {
  description = "Name of the cluster (prefixes resource names)."
  type        = string
  default     = "scriba-demo"
}

variable "key_name" {
  description = "An existing EC2 key pair for SSH, or null (use SSM Session Manager)."
  type        = string
  default     = null
}

variable "ssh_cidrs" {
  description = "Your address as a CIDR (e.g. 203.0.113.7/32) to allow SSH, or [] for none."
  type        = list(string)
  default     = []
}

variable "scriba_package" {
  description = "The pip requirement cloud-init installs (a version on your index, a wheel URL or git+https://...)."
  type        = string
  default     = "scriba"
}
