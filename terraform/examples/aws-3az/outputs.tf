output "metadata_uri" {
  description = "Give this to clients: Client.connect(URI) or `scriba shell --metadata URI ...`."
  value       = module.scriba.metadata_uri
}

output "bookie_addresses" {
  description = "Bookie id => private gRPC address."
  value       = module.scriba.bookie_addresses
}

output "topology_json" {
  description = "The topology file (each bookie's region, zone and rack)."
  value       = module.scriba.topology_json
}
