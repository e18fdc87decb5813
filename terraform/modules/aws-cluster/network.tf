# A VPC with one public subnet per zone (or the subnets of an existing VPC).

resource "aws_vpc" "this" {
  count                = var.vpc_id == null ? 1 : 0
  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true
  tags                 = merge(local.common_tags, { Name = var.cluster_name })
}

resource "aws_internet_gateway" "this" {
  count  = var.vpc_id == null ? 1 : 0
  vpc_id = aws_vpc.this[0].id
  tags   = merge(local.common_tags, { Name = var.cluster_name })
}

resource "aws_subnet" "this" {
  for_each = var.vpc_id == null ? { for i, zone in sort(keys(var.zones)) : zone => i } : {}

  vpc_id                  = aws_vpc.this[0].id
  availability_zone       = each.key
  cidr_block              = cidrsubnet(var.vpc_cidr, var.subnet_newbits, each.value)
  map_public_ip_on_launch = false # instances ask for one explicitly (associate_public_ip)
  tags                    = merge(local.common_tags, { Name = "${var.cluster_name}-${each.key}" })
}

resource "aws_route_table" "public" {
  count  = var.vpc_id == null ? 1 : 0
  vpc_id = aws_vpc.this[0].id

  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.this[0].id
  }
  tags = merge(local.common_tags, { Name = "${var.cluster_name}-public" })
}

resource "aws_route_table_association" "public" {
  for_each       = aws_subnet.this
  subnet_id      = each.value.id
  route_table_id = aws_route_table.public[0].id
}

data "aws_vpc" "existing" {
  count = var.vpc_id == null ? 0 : 1
  id    = var.vpc_id
}

data "aws_subnet" "existing" {
  for_each = var.vpc_id == null ? {} : var.subnet_ids
  id       = each.value

  lifecycle {
    postcondition {
      condition     = self.vpc_id == var.vpc_id && self.availability_zone == each.key
      error_message = "subnet_ids[\"${each.key}\"] (${each.value}) must be in VPC ${var.vpc_id} and in availability zone ${each.key}."
    }
  }
}

locals {
  vpc_id   = var.vpc_id == null ? aws_vpc.this[0].id : var.vpc_id
  vpc_cidr = var.vpc_id == null ? var.vpc_cidr : data.aws_vpc.existing[0].cidr_block
  subnet_ids = var.vpc_id == null ? { for zone, s in aws_subnet.this : zone => s.id } : {
    for zone in keys(var.zones) : zone => var.subnet_ids[zone]
  }
  # known before apply for created subnets, so the metadata addresses are too
  subnet_cidrs = var.vpc_id == null ? {
    for i, zone in sort(keys(var.zones)) : zone => cidrsubnet(var.vpc_cidr, var.subnet_newbits, i)
    } : {
    for zone in keys(var.zones) : zone => data.aws_subnet.existing[zone].cidr_block
  }
  associate_public_ip = var.associate_public_ip != null ? var.associate_public_ip : var.vpc_id == null
  client_cidrs        = var.client_cidrs != null ? var.client_cidrs : [local.vpc_cidr]
  admin_cidrs         = var.admin_cidrs != null ? var.admin_cidrs : [local.vpc_cidr]
}
