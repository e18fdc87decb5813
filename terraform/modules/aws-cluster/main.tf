# A multi-zone Scriba cluster in one AWS region.
#
# modules/topology turns `zones` (availability zone -> rack -> bookie count) into the
# bookies' ids and locations, the metadata members' zones and the topology file; this
# module gives each bookie an instance in its zone's subnet, in its rack's spread
# placement group, with a journal and a ledger EBS volume of its own, and each metadata
# member an instance at a fixed private address (so every node knows the metadata URI
# at boot). cloud-init on each instance installs Scriba (or etcd / ZooKeeper), formats
# and mounts its volumes (only when they hold no filesystem: a replaced instance finds
# its data) and starts the service with the location from the topology.

data "aws_region" "current" {
  count = var.region_name == null ? 1 : 0
}

data "aws_ami" "selected" {
  count       = var.ami_id == null ? 1 : 0
  most_recent = true
  owners      = var.ami_owners

  filter {
    name   = "name"
    values = [var.ami_name_pattern]
  }
  filter {
    name   = "virtualization-type"
    values = ["hvm"]
  }
}

module "topology" {
  source = "../topology"

  regions           = { (local.region_name) = var.zones }
  placement_policy  = var.placement.policy
  ensemble_size     = var.placement.ensemble_size
  write_quorum_size = var.placement.write_quorum_size
  ack_quorum_size   = var.placement.ack_quorum_size
  metadata_store    = var.metadata_store
  metadata_members  = var.metadata_members
}

locals {
  region_name = var.region_name != null ? var.region_name : data.aws_region.current[0].name
  ami_id      = var.ami_id != null ? var.ami_id : data.aws_ami.selected[0].id

  common_tags = merge(var.tags, { "scriba:cluster" = var.cluster_name })

  bookies          = module.topology.bookies
  metadata_members = { for m in module.topology.metadata.members : m.name => m }

  metadata_ports = var.metadata_store == "etcd" ? { client = 2379, peer = [2380] } : { client = 2181, peer = [2888, 3888] }
  metadata_ips = {
    for name, m in local.metadata_members : name => cidrhost(local.subnet_cidrs[m.zone], var.metadata_ip_host_number + m.index)
  }
  etcd_tls        = var.metadata_store == "etcd" && local.tls_enabled
  metadata_scheme = var.metadata_store == "etcd" ? (local.etcd_tls ? "etcd+tls" : "etcd") : "zk"
  metadata_uri = format("%s://%s/%s", local.metadata_scheme, join(",", [
    for m in module.topology.metadata.members : "${local.metadata_ips[m.name]}:${local.metadata_ports.client}"
  ]), var.metadata_prefix)
  # what the bookies dial the store with: the node certificate on etcd+tls
  # (paths not percent-encoded: systemd would read %2F as a specifier)
  bookie_metadata_uri = local.etcd_tls ? "${local.metadata_uri}?ca=${local.tls_paths.ca}&cert=${local.tls_paths.cert}&key=${local.tls_paths.key}" : local.metadata_uri

  # TLS: the flag is not secret even though the object is
  tls_enabled       = nonsensitive(var.tls != null)
  tls_key_parameter = nonsensitive(try(var.tls.key_ssm_parameter, null))
  tls_files = local.tls_enabled ? {
    ca_cert_pem = var.tls.ca_cert_pem
    cert_pem    = var.tls.cert_pem
    key_pem     = var.tls.key_pem == null ? "" : var.tls.key_pem
  } : { ca_cert_pem = "", cert_pem = "", key_pem = "" }
  tls_paths = { ca = "/etc/scriba/tls/ca.pem", cert = "/etc/scriba/tls/cert.pem", key = "/etc/scriba/tls/key.pem" }
  # the bookies' server flags (scriba.tls_cli): mutual TLS and the allow-lists
  tls_allow = local.tls_enabled ? nonsensitive(var.tls.allow) : {}
  bookie_tls_args = local.tls_enabled ? join("", concat(
    [" --tls-cert ${local.tls_paths.cert} --tls-key ${local.tls_paths.key} --tls-ca ${local.tls_paths.ca} --tls-require-client-cert"],
    flatten([for role in sort(keys(local.tls_allow)) : [for id in sort(local.tls_allow[role]) : " --tls-allow ${role}=${id}"]]),
  )) : ""
}
