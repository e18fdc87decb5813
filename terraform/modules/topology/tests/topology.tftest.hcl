# terraform test: the computed topology and the refusals, no provider needed.

variables {
  regions = {
    eu = {
      eu-a = { r1 = 2, r2 = 1 }
      eu-b = { r1 = 1 }
      eu-c = { r1 = 1 }
    }
    us = {
      us-a = { r1 = 1 }
      us-b = { r1 = 1 }
      us-c = { r1 = 1 }
    }
  }
}

run "two_regions_three_zones_each" {
  command = plan

  assert {
    condition     = output.summary == { regions = 2, zones = 6, racks = 7, bookies = 8, metadata_members = 3 }
    error_message = "summary: ${jsonencode(output.summary)}"
  }
  assert {
    condition     = output.bookie_ids == ["eu-a.r1.1", "eu-a.r1.2", "eu-a.r2.1", "eu-b.r1.1", "eu-c.r1.1", "us-a.r1.1", "us-b.r1.1", "us-c.r1.1"]
    error_message = "bookie ids: ${jsonencode(output.bookie_ids)}"
  }
  assert {
    condition     = output.bookies["us-b.r1.1"] == { id = "us-b.r1.1", region = "us", zone = "us-b", rack = "r1", index = 6 }
    error_message = "bookie us-b.r1.1: ${jsonencode(output.bookies["us-b.r1.1"])}"
  }
  assert {
    condition     = output.racks["eu-a.r1"].bookie_ids == ["eu-a.r1.1", "eu-a.r1.2"]
    error_message = "rack eu-a.r1: ${jsonencode(output.racks["eu-a.r1"])}"
  }
  assert {
    condition     = jsonencode(output.zones["eu-a"]) == jsonencode({ bookies = 3, racks = ["r1", "r2"], region = "eu" })
    error_message = "zone eu-a: ${jsonencode(output.zones["eu-a"])}"
  }
  # the file placement reads: id -> {region, zone, rack}, nothing else
  assert {
    condition     = jsondecode(output.topology_json) == output.topology
    error_message = "topology_json does not decode to topology"
  }
  assert {
    condition     = jsondecode(output.topology_json).bookies["eu-a.r2.1"] == { region = "eu", zone = "eu-a", rack = "r2" }
    error_message = "topology file entry: ${output.topology_json}"
  }
  assert {
    condition     = length(keys(jsondecode(output.topology_json))) == 1 && length(jsondecode(output.topology_json).bookies) == 8
    error_message = "topology file shape: ${output.topology_json}"
  }
  # metadata members alternate regions, one per zone
  assert {
    condition     = [for m in output.metadata.members : "${m.name}@${m.zone}"] == ["etcd-1@eu-a", "etcd-2@us-a", "etcd-3@eu-b"]
    error_message = "members: ${jsonencode(output.metadata.members)}"
  }
}

run "five_members_in_one_region_zookeeper" {
  command = plan
  variables {
    metadata_store   = "zookeeper"
    metadata_members = 5
    metadata_regions = ["us"]
  }
  assert {
    condition     = [for m in output.metadata.members : "${m.name}@${m.zone}"] == ["zookeeper-1@us-a", "zookeeper-2@us-b", "zookeeper-3@us-c", "zookeeper-4@us-a", "zookeeper-5@us-b"]
    error_message = "members: ${jsonencode(output.metadata.members)}"
  }
}

run "single_zone_random_placement" {
  command = plan
  variables {
    regions           = { local = { z1 = { r1 = 3 } } }
    placement_policy  = "random"
    metadata_members  = 1
    write_quorum_size = 3
  }
  assert {
    condition     = output.bookie_ids == ["z1.r1.1", "z1.r1.2", "z1.r1.3"] && length(output.metadata.members) == 1
    error_message = "single zone: ${jsonencode(output.bookie_ids)}"
  }
}

# --- refusals ---------------------------------------------------------------------

run "zone_aware_needs_write_quorum_zones" {
  command = plan
  variables {
    regions           = { eu = { eu-a = { r1 = 3 }, eu-b = { r1 = 3 } } }
    write_quorum_size = 3
  }
  expect_failures = [var.write_quorum_size]
}

run "rack_aware_needs_write_quorum_racks" {
  command = plan
  variables {
    regions          = { eu = { eu-a = { r1 = 4, r2 = 4 } } }
    placement_policy = "rack-aware"
  }
  expect_failures = [var.write_quorum_size]
}

run "region_aware_needs_two_regions" {
  command = plan
  variables {
    regions          = { eu = { eu-a = { r1 = 2 }, eu-b = { r1 = 2 }, eu-c = { r1 = 2 } } }
    placement_policy = "region-aware"
  }
  expect_failures = [var.ack_quorum_size]
}

run "even_metadata_members" {
  command = plan
  variables {
    metadata_members = 4
  }
  expect_failures = [var.metadata_members]
}

run "unknown_metadata_store" {
  command = plan
  variables {
    metadata_store = "consul"
  }
  expect_failures = [var.metadata_store]
}

run "metadata_region_not_in_regions" {
  command = plan
  variables {
    metadata_regions = ["ap"]
  }
  expect_failures = [var.metadata_regions]
}

run "name_with_slash" {
  command = plan
  variables {
    regions = { eu = { "eu/a" = { r1 = 1 }, eu-b = { r1 = 1 }, eu-c = { r1 = 1 } } }
  }
  expect_failures = [var.regions]
}

run "name_with_dot" {
  command = plan
  variables {
    regions = { eu = { eu-a = { "r.1" = 1 }, eu-b = { r1 = 1 }, eu-c = { r1 = 1 } } }
  }
  expect_failures = [var.regions]
}

run "zone_in_two_regions" {
  command = plan
  variables {
    regions = { eu = { a = { r1 = 1 }, b = { r1 = 1 }, c = { r1 = 1 } }, us = { a = { r1 = 1 } } }
  }
  expect_failures = [var.regions]
}

run "empty_zone" {
  command = plan
  variables {
    regions = { eu = { eu-a = {}, eu-b = { r1 = 1 }, eu-c = { r1 = 1 } } }
  }
  expect_failures = [var.regions]
}

run "fractional_bookie_count" {
  command = plan
  variables {
    regions = { eu = { eu-a = { r1 = 1.5 }, eu-b = { r1 = 1 }, eu-c = { r1 = 1 } } }
  }
  expect_failures = [var.regions]
}

run "ensemble_larger_than_cluster" {
  command = plan
  variables {
    regions       = { eu = { eu-a = { r1 = 1 }, eu-b = { r1 = 1 }, eu-c = { r1 = 1 } } }
    ensemble_size = 4
  }
  expect_failures = [var.ensemble_size]
}

run "ack_quorum_above_write_quorum" {
  command = plan
  variables {
    ack_quorum_size = 4
  }
  expect_failures = [var.ack_quorum_size]
}
