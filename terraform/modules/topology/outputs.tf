output "bookies" {
  description = "Every bookie: id => {id, region, zone, rack, index}."
  value       = local.bookies
}

output "bookie_ids" {
  description = "Bookie ids in index order (region, zone, rack, n)."
  value       = [for b in local.bookie_list : b.id]
}

output "zones" {
  description = "Every zone: name => {region, racks, bookies (count)}."
  value       = local.zones
}

output "racks" {
  description = "Every rack: \"zone.rack\" => {region, zone, rack, bookie_ids}."
  value       = local.racks
}

output "regions" {
  description = "Region names, sorted."
  value       = sort(keys(var.regions))
}

output "metadata" {
  description = "The metadata store: kind and its members, each {index, name, region, zone}."
  value = {
    store   = var.metadata_store
    members = local.metadata_members
  }
}

output "placement" {
  description = "The placement settings the shape was checked against."
  value = {
    policy            = var.placement_policy
    ensemble_size     = var.ensemble_size
    write_quorum_size = var.write_quorum_size
    ack_quorum_size   = var.ack_quorum_size
  }
}

output "topology" {
  description = "The topology file as an object: {bookies = {id => {region, zone, rack}}}."
  value       = local.topology
}

output "topology_json" {
  description = "The topology file's text (JSON), as scriba.placement.load_topology_file reads it."
  value       = jsonencode(local.topology)
}

output "summary" {
  description = "Counts: regions, zones, racks, bookies, metadata members."
  value = {
    regions          = length(var.regions)
    zones            = length(local.zones)
    racks            = length(local.racks)
    bookies          = length(local.bookie_list)
    metadata_members = var.metadata_members
  }
}
