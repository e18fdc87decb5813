terraform {
  # 1.9: validation conditions may refer to other variables.
  required_version = ">= 1.9"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # aws_vpc_security_group_ingress_rule (5.x); tested with 5.100
      version = ">= 5.30, < 7.0"
    }
  }
}
