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
#
# With var.tls every part gets the servers' --tls-* flags (mutual TLS, the allow-lists):
# etcd serves https with client-certificate auth, the URI becomes etcd+tls://...?ca=, and
# each bookie reaches etcd with the node certificate in its --metadata URI (cert=, key=).

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
  metadata_hosts = join(",", [
    for i in range(var.metadata_members) : "127.0.0.1:${var.metadata_port_base + 2 * i}"
  ])
  # the URI clients get: etcd+tls with the CA and, if given, the client certificate
  metadata_uri = var.tls == null ? "etcd://${local.metadata_hosts}/${var.metadata_prefix}" : format(
    "etcd+tls://%s/%s?%s", local.metadata_hosts, var.metadata_prefix, join("&", concat(
      ["ca=${urlencode(abspath(var.tls.ca_cert))}"],
      var.tls.client_cert == null ? [] : ["cert=${urlencode(abspath(var.tls.client_cert))}", "key=${urlencode(abspath(var.tls.client_key))}"],
  )))
  # the bookies': the node certificate
  bookie_metadata_uri = var.tls == null ? local.metadata_uri : format(
    "etcd+tls://%s/%s?ca=%s&cert=%s&key=%s", local.metadata_hosts, var.metadata_prefix,
    urlencode(abspath(var.tls.ca_cert)), urlencode(abspath(var.tls.cert)), urlencode(abspath(var.tls.key)),
  )
  # the servers' flags (scriba.tls_cli)
  tls_args = var.tls == null ? [] : concat(
    ["--tls-cert", abspath(var.tls.cert), "--tls-key", abspath(var.tls.key), "--tls-ca", abspath(var.tls.ca_cert), "--tls-require-client-cert"],
    flatten([for role in sort(keys(var.tls.allow)) : [for id in sort(var.tls.allow[role]) : ["--tls-allow", "${role}=${id}"]]]),
  )
  client_tls_flags = var.tls == null ? "" : (var.tls.client_cert == null ? "--tls-ca ${abspath(var.tls.ca_cert)}" : join(" ", [
    "--tls-cert", abspath(var.tls.client_cert), "--tls-key", abspath(var.tls.client_key), "--tls-ca", abspath(var.tls.ca_cert),
  ]))

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
    tls       = jsonencode(local.tls_args)
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
    ], local.tls_args)
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
    uri       = local.bookie_metadata_uri
    tls       = jsonencode(local.tls_args)
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
      "--metadata", local.bookie_metadata_uri,
      "--region", each.value.region,
      "--zone", each.value.zone,
      "--rack", each.value.rack,
      "--port", tostring(each.value.port),
      "--http-port", tostring(each.value.http_port),
    ], local.tls_args)
    command = each.key
  }

  provisioner "local-exec" {
    when        = destroy
    interpreter = concat(self.input.command, ["local-cluster", "stop-bookie", "--data", self.input.data_dir], self.input.keep_data ? ["--keep-data"] : [])
    command     = self.input.bookie_id
  }
}
