output "metadata_uri" {
  description = "The cluster's metadata URI: `scriba shell --metadata URI ...`, `Client.connect(URI)` (with var.tls: etcd+tls:// with the CA and the client certificate, if given)."
  value       = local.metadata_uri
  depends_on  = [terraform_data.metadata]
}

output "client_tls_flags" {
  description = "With var.tls: the `scriba shell` / `scriba bench` flags of the client certificate (\"\" without TLS)."
  value       = local.client_tls_flags
}

output "bookies" {
  description = "Every bookie: id => {address, http_address, region, zone, rack}."
  value = {
    for id, b in local.bookies : id => {
      address      = "127.0.0.1:${b.port}"
      http_address = "127.0.0.1:${b.http_port}"
      region       = b.region
      zone         = b.zone
      rack         = b.rack
    }
  }
  depends_on = [terraform_data.bookie]
}

output "data_dir" {
  description = "Where the cluster keeps its data, logs and PID records (`scriba local-cluster status DATA_DIR`)."
  value       = local.data_dir
}

output "topology_file" {
  description = "Path of the topology file (scriba.placement.load_topology_file reads it)."
  value       = "${local.data_dir}/topology.json"
  depends_on  = [terraform_data.topology_file]
}

output "topology_json" {
  description = "The topology file's text."
  value       = module.topology.topology_json
}

output "summary" {
  description = "Counts: regions, zones, racks, bookies, metadata members."
  value       = module.topology.summary
}
