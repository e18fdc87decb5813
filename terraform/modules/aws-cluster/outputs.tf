output "metadata_uri" {
  description = "The cluster's metadata URI (etcd://... or zk://...): give it to clients and `scriba shell --metadata`."
  value       = local.metadata_uri
}

output "bookie_addresses" {
  description = "Bookie id => private gRPC address (ip:port)."
  value       = { for id in keys(local.bookies) : id => "${aws_instance.node[id].private_ip}:${var.bookie_port}" }
}

output "bookies" {
  description = "Bookie id => {instance_id, private_ip, address, http_address, region, zone, rack, journal_volume_id, ledger_volume_id}."
  value = {
    for id, b in local.bookies : id => {
      instance_id       = aws_instance.node[id].id
      private_ip        = aws_instance.node[id].private_ip
      address           = "${aws_instance.node[id].private_ip}:${var.bookie_port}"
      http_address      = "${aws_instance.node[id].private_ip}:${var.http_port}"
      region            = b.region
      zone              = b.zone
      rack              = b.rack
      journal_volume_id = aws_ebs_volume.node["${id}/journal"].id
      ledger_volume_id  = aws_ebs_volume.node["${id}/ledger"].id
    }
  }
}

output "metadata_members" {
  description = "Metadata member name => {instance_id, private_ip, zone}."
  value = {
    for name, m in local.metadata_members : name => {
      instance_id = aws_instance.node[name].id
      private_ip  = local.metadata_ips[name]
      zone        = m.zone
    }
  }
}

output "topology_json" {
  description = "The topology file (also written to /etc/scriba/topology.json on every bookie): scriba.placement.load_topology_file reads it."
  value       = module.topology.topology_json
}

output "topology" {
  description = "The computed topology (modules/topology's outputs)."
  value       = module.topology
}

output "vpc_id" {
  description = "The VPC (created or given)."
  value       = local.vpc_id
}

output "subnet_ids" {
  description = "Availability zone => subnet id."
  value       = local.subnet_ids
}

output "security_group_ids" {
  description = "Security groups: {bookie, metadata}."
  value       = local.security_group_ids
}
