terraform {
  # no provider: terraform_data and local-exec are built in
  required_version = ">= 1.9"
}
