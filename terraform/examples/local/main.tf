# Two regions x three zones on this machine: 6 bookie processes and a 3-member etcd,
# all on 127.0.0.1, placed as the AWS example places its instances.

module "cluster" {
  source = "../../environments/local"

  regions = {
    region-1 = {
      zone-1a = { rack-1 = 1 }
      zone-1b = { rack-1 = 1 }
      zone-1c = { rack-1 = 1 }
    }
    region-2 = {
      zone-2a = { rack-1 = 1 }
      zone-2b = { rack-1 = 1 }
      zone-2c = { rack-1 = 1 }
    }
  }
  placement        = { policy = "zone-aware", ensemble_size = 3, write_quorum_size = 3, ack_quorum_size = 2 }
  metadata_members = 3

  data_dir       = var.data_dir
  scriba_command = var.scriba_command
}
