# The cluster's shape, computed once for every module that provisions it.
#
# Input: region -> zone -> rack -> bookie count. Output: one record per bookie (id,
# region, zone, rack, index), the metadata members' zones, and the topology file that
# `scriba.placement.load_topology_file` reads: {"bookies": {id: {region, zone, rack}}}.
#
# Bookie ids are "<zone>.<rack>.<n>" (n from 1 within the rack). Names may not hold
# dots and zone names are unique across regions, so an id names exactly one slot; ids
# stay stable when racks or zones are added elsewhere. Maps iterate in key order, so
# `index` (0-based over all bookies, ordered by region, zone, rack, n) is
# deterministic; it moves when bookies are added before a slot.

locals {
  bookie_list = flatten([
    for region, zones in var.regions : [
      for zone, racks in zones : [
        for rack, count in racks : [
          for n in range(1, count + 1) : {
            id     = "${zone}.${rack}.${n}"
            region = region
            zone   = zone
            rack   = rack
          }
        ]
      ]
    ]
  ])

  bookies = { for i, b in local.bookie_list : b.id => merge(b, { index = i }) }

  zones = merge([
    for region, zones in var.regions : {
      for zone, racks in zones : zone => {
        region  = region
        racks   = keys(racks)
        bookies = sum(values(racks))
      }
    }
  ]...)

  racks = merge([
    for region, zones in var.regions : merge([
      for zone, racks in zones : {
        for rack, count in racks : "${zone}.${rack}" => {
          region     = region
          zone       = zone
          rack       = rack
          bookie_ids = [for n in range(1, count + 1) : "${zone}.${rack}.${n}"]
        }
      }
    ]...)
  ]...)

  # Metadata members go round-robin over the zones of the chosen regions, taking the
  # regions in turn (first zone of each region, then the second of each, ...), so
  # three members over three zones lose at most one member with a zone.
  metadata_regions = var.metadata_regions == null ? sort(keys(var.regions)) : var.metadata_regions
  metadata_zone_lists = [
    for region in local.metadata_regions : [for zone in sort(keys(var.regions[region])) : { region = region, zone = zone }]
  ]
  metadata_zones = flatten([
    for i in range(max([for l in local.metadata_zone_lists : length(l)]...)) : [
      for l in local.metadata_zone_lists : l[i] if i < length(l)
    ]
  ])
  metadata_members = [
    for i in range(var.metadata_members) : merge(local.metadata_zones[i % length(local.metadata_zones)], {
      index = i
      name  = "${var.metadata_store}-${i + 1}"
    })
  ]

  topology = {
    bookies = { for id, b in local.bookies : id => { region = b.region, zone = b.zone, rack = b.rack } }
  }
}
