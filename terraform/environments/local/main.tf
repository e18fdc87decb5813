# A real multi-zone Scriba cluster on this machine, with no provider: one terraform_data
# per part, whose local-exec provisioners run `scriba local-cluster start-*` on create and
# `stop-*` on destroy (see scriba/local_cluster.py). The processes run detached; each
# part records its PIDs under data_dir, and destroy stops exactly those, bookies first
# (they depend on the metadata store), then etcd, then removes the data unless
# keep_data_on_destroy. Everything listens on 127.0.0.1 at ports computed here, so the
# metadata URI is known before anything runs.
#
# The interpreter argument list carries every argument (no shell, no quoting); the
# "command" is the last argument.

module "topology" {
  source = "../../modules/topology"

  regions           = var.regions
  placement_policy  = var.placement.policy
  ensemble_size     = var.placement.ensemble_size
  write_quorum_size = var.placement.write_quorum_size
  ack_quorum_size   = var.placement.ack_quorum_size
  metadata_store    = "etcd"
  metadata_members  = var.metadata_members
}

locals {
  data_dir = abspath(var.data_dir)
  metadata_uri = format("etcd://%s/%s", join(",", [
    for i in range(var.metadata_members) : "127.0.0.1:${var.metadata_port_base + 2 * i}"
  ]), var.metadata_prefix)

  bookies = {
    for id, b in module.topology.bookies : id => merge(b, {
      port      = var.bookie_port_base + b.index
      http_port = var.http_port_base + b.index
    })
  }

  bookie_count = length(local.bookies)
  port_ranges = {
    metadata = [var.metadata_port_base, var.metadata_port_base + 2 * var.metadata_members]
    bookie   = [var.bookie_port_base, var.bookie_port_base + local.bookie_count]
    http     = [var.http_port_base, var.http_port_base + local.bookie_count]
  }
  overlapping_ports = [
    for pair in [["metadata", "bookie"], ["metadata", "http"], ["bookie", "http"]] : join(" and ", pair)
    if local.port_ranges[pair[0]][0] < local.port_ranges[pair[1]][1] && local.port_ranges[pair[1]][0] < local.port_ranges[pair[0]][1]
  ]
}

resource "terraform_data" "metadata" {
  triggers_replace = {
    data_dir  = local.data_dir
    members   = var.metadata_members
    port_base = var.metadata_port_base
    uri       = local.metadata_uri
  }
  # input may change in place (no restart): destroy reads command and keep_data from it
  input = {
    command   = var.scriba_command
    data_dir  = local.data_dir
    keep_data = var.keep_data_on_destroy
  }

  lifecycle {
    precondition {
      condition     = length(local.overlapping_ports) == 0
      error_message = "Port ranges overlap (${join(", ", local.overlapping_ports)}): metadata ${jsonencode(local.port_ranges.metadata)}, bookie ${jsonencode(local.port_ranges.bookie)}, http ${jsonencode(local.port_ranges.http)} (each [first, end)); move a *_port_base."
    }
    precondition {
      condition     = local.port_ranges.bookie[1] <= 65536 && local.port_ranges.http[1] <= 65536
      error_message = "Bookie or HTTP ports would pass 65535 with ${local.bookie_count} bookies; lower bookie_port_base or http_port_base."
    }
  }

  provisioner "local-exec" {
    interpreter = concat(var.scriba_command, [
      "local-cluster", "start-metadata",
      "--members", tostring(var.metadata_members),
      "--port-base", tostring(var.metadata_port_base),
      "--prefix", var.metadata_prefix,
    ])
    command = local.data_dir
  }

  provisioner "local-exec" {
    when        = destroy
    interpreter = concat(self.input.command, ["local-cluster", "stop-metadata"], self.input.keep_data ? ["--keep-data"] : [])
    command     = self.input.data_dir
  }
}

# The topology file placement reads (DATA_DIR/topology.json); rewritten when the shape
# changes, removed with the metadata store's data.
resource "terraform_data" "topology_file" {
  depends_on       = [terraform_data.metadata]
  triggers_replace = [local.data_dir, module.topology.topology_json]

  provisioner "local-exec" {
    interpreter = concat(var.scriba_command, ["local-cluster", "write-topology", "--json", module.topology.topology_json])
    command     = local.data_dir
  }
}

resource "terraform_data" "bookie" {
  for_each   = local.bookies
  depends_on = [terraform_data.metadata]

  triggers_replace = {
    data_dir  = local.data_dir
    uri       = local.metadata_uri
    region    = each.value.region
    zone      = each.value.zone
    rack      = each.value.rack
    port      = each.value.port
    http_port = each.value.http_port
  }
  input = {
    command   = var.scriba_command
    data_dir  = local.data_dir
    keep_data = var.keep_data_on_destroy
    bookie_id = each.key
  }

  provisioner "local-exec" {
    interpreter = concat(var.scriba_command, [
      "local-cluster", "start-bookie",
      "--data", local.data_dir,
      "--metadata", local.metadata_uri,
      "--region", each.value.region,
      "--zone", each.value.zone,
      "--rack", each.value.rack,
      "--port", tostring(each.value.port),
      "--http-port", tostring(each.value.http_port),
    ])
    command = each.key
  }

  provisioner "local-exec" {
    when        = destroy
    interpreter = concat(self.input.command, ["local-cluster", "stop-bookie", "--data", self.input.data_dir], self.input.keep_data ? ["--keep-data"] : [])
    command     = self.input.bookie_id
  }
}
