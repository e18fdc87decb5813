# Security groups: each opens only what its role serves.
#   bookies:  gRPC (bookie_port) and the binary data path (bookie_binary_port) from
#             client_cidrs and from other bookies;
#             HTTP (http_port: /health, /metrics) from admin_cidrs; SSH from ssh_cidrs
#   metadata: client port from the bookies and client_cidrs; peer port(s) from members;
#             SSH from ssh_cidrs
# Egress goes to egress_cidrs (package mirrors, PyPI, the other nodes).

resource "aws_security_group" "bookie" {
  name        = "${var.cluster_name}-bookie"
  description = "Scriba bookies of ${var.cluster_name}"
  vpc_id      = local.vpc_id
  tags        = merge(local.common_tags, { Name = "${var.cluster_name}-bookie", "scriba:role" = "bookie" })
}

resource "aws_security_group" "metadata" {
  name        = "${var.cluster_name}-${var.metadata_store}"
  description = "Scriba metadata store (${var.metadata_store}) of ${var.cluster_name}"
  vpc_id      = local.vpc_id
  tags        = merge(local.common_tags, { Name = "${var.cluster_name}-${var.metadata_store}", "scriba:role" = "metadata" })
}

locals {
  ingress_rules = merge(
    { for c in local.client_cidrs : "bookie-grpc-${c}" => { sg = "bookie", port = var.bookie_port, cidr = c, source = null, what = "bookie gRPC from clients" } },
    { "bookie-grpc-bookies" = { sg = "bookie", port = var.bookie_port, cidr = null, source = "bookie", what = "bookie gRPC from bookies" } },
    { for c in local.client_cidrs : "bookie-binary-${c}" => { sg = "bookie", port = var.bookie_binary_port, cidr = c, source = null, what = "bookie binary data path from clients" } },
    { "bookie-binary-bookies" = { sg = "bookie", port = var.bookie_binary_port, cidr = null, source = "bookie", what = "bookie binary data path from bookies" } },
    { for c in local.admin_cidrs : "bookie-http-${c}" => { sg = "bookie", port = var.http_port, cidr = c, source = null, what = "bookie HTTP admin and metrics" } },
    { for c in local.client_cidrs : "metadata-client-${c}" => { sg = "metadata", port = local.metadata_ports.client, cidr = c, source = null, what = "${var.metadata_store} clients" } },
    { "metadata-client-bookies" = { sg = "metadata", port = local.metadata_ports.client, cidr = null, source = "bookie", what = "${var.metadata_store} clients: bookies" } },
    { for p in local.metadata_ports.peer : "metadata-peer-${p}" => { sg = "metadata", port = p, cidr = null, source = "metadata", what = "${var.metadata_store} peers" } },
    { for c in var.ssh_cidrs : "bookie-ssh-${c}" => { sg = "bookie", port = 22, cidr = c, source = null, what = "SSH" } },
    { for c in var.ssh_cidrs : "metadata-ssh-${c}" => { sg = "metadata", port = 22, cidr = c, source = null, what = "SSH" } },
  )
  security_group_ids = { bookie = aws_security_group.bookie.id, metadata = aws_security_group.metadata.id }
  egress_rules = merge(
    { for c in var.egress_cidrs : "bookie-${c}" => { sg = "bookie", cidr = c } },
    { for c in var.egress_cidrs : "metadata-${c}" => { sg = "metadata", cidr = c } },
  )
}

resource "aws_vpc_security_group_ingress_rule" "this" {
  for_each = local.ingress_rules

  security_group_id            = local.security_group_ids[each.value.sg]
  description                  = each.value.what
  ip_protocol                  = "tcp"
  from_port                    = each.value.port
  to_port                      = each.value.port
  cidr_ipv4                    = each.value.cidr
  referenced_security_group_id = each.value.source == null ? null : local.security_group_ids[each.value.source]
  tags                         = local.common_tags
}

resource "aws_vpc_security_group_egress_rule" "this" {
  for_each = local.egress_rules

  security_group_id = local.security_group_ids[each.value.sg]
  description       = "outbound"
  ip_protocol       = "-1"
  cidr_ipv4         = each.value.cidr
  tags              = local.common_tags
}
