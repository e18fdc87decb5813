# A 3-AZ Scriba cluster: 2 bookies per zone (one per rack), a 3-member etcd with one
# member per zone, zone-aware placement with E3/W3/A2 (every entry lands in 3 zones,
# and is acknowledged once 2 zones have it).

provider "aws" {
  region = var.region

  default_tags {
    tags = { project = "scriba", example = "aws-3az" }
  }
}

module "scriba" {
  source = "../../modules/aws-cluster"

  cluster_name = var.cluster_name
  zones = {
    "${var.region}a" = { rack-1 = 1, rack-2 = 1 }
    "${var.region}b" = { rack-1 = 1, rack-2 = 1 }
    "${var.region}c" = { rack-1 = 1, rack-2 = 1 }
  }

  placement = { policy = "zone-aware", ensemble_size = 3, write_quorum_size = 3, ack_quorum_size = 2 }

  metadata_store   = "etcd"
  metadata_members = 3

  bookie_instance_type   = "m6i.large"
  metadata_instance_type = "t3.medium"
  journal_volume         = { type = "gp3", size_gib = 50, iops = 3000, throughput_mibps = 125 }
  ledger_volume          = { type = "gp3", size_gib = 200, iops = 3000, throughput_mibps = 250 }

  key_name       = var.key_name
  ssh_cidrs      = var.ssh_cidrs
  scriba_package = var.scriba_package
  tags           = { owner = "platform" }
}
