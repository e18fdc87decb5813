# Names: Scriba accepts any non-empty name without "/" for a region, zone or rack. This
# module is stricter so that every name also works as a path component, an etcd key, a
# host-name label and an AWS tag: letters, digits, "_" and "-", starting with a letter
# or digit, at most 63 characters. Dots are kept for bookie ids ("zone.rack.n").

variable "regions" {
  description = "The cluster's shape: region -> zone -> rack -> number of bookies in that rack. Zone names must be unique across regions (AWS availability zones are)."
  type        = map(map(map(number)))
  nullable    = false

  validation {
    condition     = length(var.regions) > 0 && alltrue([for zones in values(var.regions) : length(zones) > 0 && alltrue([for racks in values(zones) : length(racks) > 0])])
    error_message = "regions: give at least one region, each with at least one zone, each with at least one rack."
  }
  validation {
    condition = alltrue(flatten([
      for region, zones in var.regions : [
        can(regex("^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$", region)),
        [for zone, racks in zones : [
          can(regex("^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$", zone)),
          [for rack in keys(racks) : can(regex("^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$", rack))],
        ]],
      ]
    ]))
    error_message = "regions: region, zone and rack names must be 1-63 letters, digits, '_' or '-', starting with a letter or digit (Scriba refuses '/' and empty names; '.' separates the parts of bookie ids)."
  }
  validation {
    condition     = length(flatten([for zones in values(var.regions) : keys(zones)])) == length(distinct(flatten([for zones in values(var.regions) : keys(zones)])))
    error_message = "regions: zone names must be unique across regions (a zone name identifies one zone, as an AWS availability zone does)."
  }
  validation {
    condition = alltrue(flatten([
      for zones in values(var.regions) : [
        for racks in values(zones) : [for n in values(racks) : n >= 1 && n <= 100 && floor(n) == n]
      ]
    ]))
    error_message = "regions: every rack holds a whole number of bookies from 1 to 100."
  }
}

variable "placement_policy" {
  description = "The placement policy clients will use (random, rack-aware, zone-aware, region-aware): the shape is checked against its needs."
  type        = string
  default     = "zone-aware"
  nullable    = false

  validation {
    condition     = contains(["random", "rack-aware", "zone-aware", "region-aware"], var.placement_policy)
    error_message = "placement_policy: one of random, rack-aware, zone-aware, region-aware."
  }
}

variable "ensemble_size" {
  description = "Bookies per ledger ensemble that clients will ask for; the cluster must hold at least this many."
  type        = number
  default     = 3
  nullable    = false

  validation {
    condition     = floor(var.ensemble_size) == var.ensemble_size && var.ensemble_size >= var.write_quorum_size
    error_message = "ensemble_size: a whole number at least write_quorum_size."
  }
  validation {
    condition = var.ensemble_size <= sum(concat([0], flatten([
      for zones in values(var.regions) : [for racks in values(zones) : values(racks)]
    ])))
    error_message = "ensemble_size: larger than the number of bookies the regions hold; add bookies or lower it."
  }
}

variable "write_quorum_size" {
  description = "Bookies each entry is written to. zone-aware placement needs at least this many zones, rack-aware this many racks."
  type        = number
  default     = 3
  nullable    = false

  validation {
    condition     = floor(var.write_quorum_size) == var.write_quorum_size && var.write_quorum_size >= 1
    error_message = "write_quorum_size: a whole number >= 1."
  }
  validation {
    condition     = var.placement_policy != "zone-aware" || length(flatten([for zones in values(var.regions) : keys(zones)])) >= var.write_quorum_size
    error_message = "write_quorum_size: zone-aware placement needs at least write_quorum_size zones, so that every write set spans a zone per copy; add zones or lower the write quorum."
  }
  validation {
    condition     = var.placement_policy != "rack-aware" || length(flatten([for zones in values(var.regions) : [for racks in values(zones) : keys(racks)]])) >= var.write_quorum_size
    error_message = "write_quorum_size: rack-aware placement needs at least write_quorum_size racks; add racks or lower the write quorum."
  }
}

variable "ack_quorum_size" {
  description = "Bookies that must confirm an entry. region-aware placement needs ack_quorum_size > write_quorum_size - write_quorum_size / 2 (so no ack quorum fits in one region)."
  type        = number
  default     = 2
  nullable    = false

  validation {
    condition     = floor(var.ack_quorum_size) == var.ack_quorum_size && var.ack_quorum_size >= 1 && var.ack_quorum_size <= var.write_quorum_size
    error_message = "ack_quorum_size: a whole number from 1 to write_quorum_size."
  }
  validation {
    condition     = var.placement_policy != "region-aware" || (length(var.regions) >= 2 && var.ack_quorum_size > var.write_quorum_size - floor(var.write_quorum_size / 2))
    error_message = "ack_quorum_size: region-aware placement needs at least 2 regions and ack_quorum_size > write_quorum_size - floor(write_quorum_size / 2) (an acknowledged entry must be in 2 regions)."
  }
}

variable "metadata_store" {
  description = "Metadata store kind: etcd or zookeeper."
  type        = string
  default     = "etcd"
  nullable    = false

  validation {
    condition     = contains(["etcd", "zookeeper"], var.metadata_store)
    error_message = "metadata_store: etcd or zookeeper."
  }
}

variable "metadata_members" {
  description = "Members of the metadata store (1 for trying out, 3 or 5 in production): an odd number, so a majority survives the loss of a minority."
  type        = number
  default     = 3
  nullable    = false

  validation {
    condition     = floor(var.metadata_members) == var.metadata_members && var.metadata_members >= 1 && var.metadata_members <= 7 && var.metadata_members % 2 == 1
    error_message = "metadata_members: an odd number from 1 to 7 (an even count adds no fault tolerance: 4 members survive one failure, as 3 do)."
  }
}

variable "metadata_regions" {
  description = "Regions whose zones host the metadata members (default: all). Members go round-robin over the zones, alternating regions."
  type        = list(string)
  default     = null

  validation {
    condition     = var.metadata_regions == null ? true : length(var.metadata_regions) > 0 && alltrue([for r in var.metadata_regions : contains(keys(var.regions), r)])
    error_message = "metadata_regions: a non-empty list of regions named in regions (or null for all)."
  }
}
