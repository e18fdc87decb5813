# terraform test with a mock AWS provider: no credentials, no network, nothing created.
# Plans (applied against the mock, which fills computed attributes) for 3 and 5 zones,
# an existing VPC, TLS, and the refusals of bad variables.

mock_provider "aws" {
  mock_data "aws_partition" {
    defaults = { partition = "aws" }
  }
  mock_data "aws_vpc" {
    defaults = { cidr_block = "10.9.0.0/16" }
  }
}

variables {
  cluster_name = "demo"
  region_name  = "eu-west-1"
  zones = {
    "eu-west-1a" = { rack-1 = 2 }
    "eu-west-1b" = { rack-1 = 2 }
    "eu-west-1c" = { rack-1 = 2 }
  }
}

run "three_zones" {
  command   = apply
  state_key = "three_zones"

  assert {
    condition     = length(aws_vpc.this) == 1 && length(aws_subnet.this) == 3 && length(aws_route_table_association.public) == 3
    error_message = "expected one VPC and 3 subnets"
  }
  assert {
    condition     = [for s in aws_subnet.this : s.cidr_block] == ["10.42.0.0/24", "10.42.1.0/24", "10.42.2.0/24"]
    error_message = "subnets: ${jsonencode([for s in aws_subnet.this : s.cidr_block])}"
  }
  assert {
    condition     = length([for i in aws_instance.node : i if i.tags["scriba:role"] == "bookie"]) == 6 && length([for i in aws_instance.node : i if i.tags["scriba:role"] == "metadata"]) == 3 && length(aws_instance.node) == 9
    error_message = "instances: ${jsonencode(keys(aws_instance.node))}"
  }
  assert {
    condition     = length([for k, v in aws_ebs_volume.node : v if endswith(k, "/journal")]) == 6 && length([for k, v in aws_ebs_volume.node : v if endswith(k, "/ledger")]) == 6 && length([for k, v in aws_ebs_volume.node : v if endswith(k, "/data")]) == 3 && length(aws_ebs_volume.node) == 15
    error_message = "volumes: ${jsonencode(keys(aws_ebs_volume.node))}"
  }
  assert {
    condition     = alltrue([for k, a in aws_volume_attachment.node : a.volume_id == aws_ebs_volume.node[k].id && a.instance_id == aws_instance.node[split("/", k)[0]].id]) && length(aws_volume_attachment.node) == 15
    error_message = "every volume is attached to its own node"
  }
  assert {
    condition     = alltrue([for v in [for k, v in aws_ebs_volume.node : v if endswith(k, "/journal")] : v.type == "gp3" && v.size == 50 && v.iops == 3000 && v.throughput == 125 && v.encrypted])
    error_message = "journal volumes: gp3, 50 GiB, 3000 IOPS, 125 MiB/s, encrypted"
  }
  assert {
    condition     = alltrue([for k, v in aws_ebs_volume.node : v.availability_zone == aws_instance.node[split("/", k)[0]].tags["scriba:zone"] && (endswith(k, "/ledger") ? v.size == 500 : true)])
    error_message = "each volume is in its node's zone; ledger volumes have 500 GiB"
  }
  assert {
    condition     = length(aws_placement_group.rack) == 3 && alltrue([for pg in aws_placement_group.rack : pg.strategy == "spread" && pg.spread_level == "rack"])
    error_message = "one spread placement group per rack"
  }
  assert {
    condition     = aws_instance.node["eu-west-1b.rack-1.2"].placement_group == aws_placement_group.rack["eu-west-1b.rack-1"].name
    error_message = "a bookie runs in its rack's placement group"
  }
  assert {
    condition     = sort(keys(aws_vpc_security_group_ingress_rule.this)) == sort(["bookie-binary-10.42.0.0/16", "bookie-binary-bookies", "bookie-grpc-10.42.0.0/16", "bookie-grpc-bookies", "bookie-http-10.42.0.0/16", "metadata-client-10.42.0.0/16", "metadata-client-bookies", "metadata-peer-2380"])
    error_message = "ingress rules: ${jsonencode(keys(aws_vpc_security_group_ingress_rule.this))}"
  }
  assert {
    condition     = alltrue([for r in aws_vpc_security_group_ingress_rule.this : r.from_port == r.to_port && r.from_port != 22])
    error_message = "every ingress rule opens one port, and none opens SSH by default"
  }
  assert {
    condition     = length(aws_vpc_security_group_egress_rule.this) == 2
    error_message = "one egress rule per group"
  }
  assert {
    condition     = output.metadata_uri == "etcd://10.42.0.10:2379,10.42.1.11:2379,10.42.2.12:2379/scriba"
    error_message = "metadata URI: ${output.metadata_uri}"
  }
  assert {
    condition     = [for m in [for i in aws_instance.node : i if i.tags["scriba:role"] == "metadata"] : m.private_ip] == ["10.42.0.10", "10.42.1.11", "10.42.2.12"]
    error_message = "metadata members at fixed addresses, one per zone"
  }
  assert {
    condition     = strcontains(aws_instance.node["eu-west-1c.rack-1.1"].user_data, "--id eu-west-1c.rack-1.1 --region eu-west-1 --zone eu-west-1c --rack rack-1") && strcontains(aws_instance.node["eu-west-1c.rack-1.1"].user_data, "--listen 0.0.0.0:3181 --binary-port 3182 ")
    error_message = "the bookie starts with its location from the topology"
  }
  assert {
    condition     = strcontains(aws_instance.node["eu-west-1c.rack-1.1"].user_data, "--metadata etcd://10.42.0.10:2379,10.42.1.11:2379,10.42.2.12:2379/scriba")
    error_message = "the bookie starts with the metadata URI"
  }
  assert {
    condition     = strcontains(aws_instance.node["eu-west-1a.rack-1.1"].user_data, "mount_volume ${aws_ebs_volume.node["eu-west-1a.rack-1.1/journal"].id} /dev/sdf /var/lib/scriba/journal") && strcontains(aws_instance.node["eu-west-1a.rack-1.1"].user_data, "mount_volume ${aws_ebs_volume.node["eu-west-1a.rack-1.1/ledger"].id} /dev/sdg /var/lib/scriba/ledgers")
    error_message = "the bookie mounts its own journal and ledger volumes"
  }
  assert {
    condition     = strcontains(aws_instance.node["etcd-2"].user_data, "--initial-cluster etcd-1=http://10.42.0.10:2380,etcd-2=http://10.42.1.11:2380,etcd-3=http://10.42.2.12:2380")
    error_message = "etcd members know each other"
  }
  assert {
    condition     = !strcontains(aws_instance.node["eu-west-1a.rack-1.1"].user_data, "/etc/scriba/tls/ca.pem") && !strcontains(aws_instance.node["eu-west-1a.rack-1.1"].user_data, "--tls-")
    error_message = "no TLS material and no TLS flags without var.tls"
  }
  assert {
    condition     = strcontains(aws_instance.node["etcd-1"].user_data, "--listen-client-urls http://0.0.0.0:2379") && !strcontains(aws_instance.node["etcd-1"].user_data, "--client-cert-auth")
    error_message = "etcd serves plain clients without var.tls"
  }
  assert {
    condition     = jsondecode(output.topology_json).bookies["eu-west-1b.rack-1.2"] == { region = "eu-west-1", zone = "eu-west-1b", rack = "rack-1" }
    error_message = "topology file: ${output.topology_json}"
  }
  assert {
    condition     = alltrue([for i in aws_instance.node : i.metadata_options[0].http_tokens == "required" && i.associate_public_ip_address])
    error_message = "IMDSv2 only; public addresses in the created VPC"
  }
}

run "five_zones_zookeeper" {
  command   = apply
  state_key = "five_zones_zookeeper"
  variables {
    zones = {
      "us-east-1a" = { rack-1 = 1, rack-2 = 1 }
      "us-east-1b" = { rack-1 = 1 }
      "us-east-1c" = { rack-1 = 1 }
      "us-east-1d" = { rack-1 = 1 }
      "us-east-1f" = { rack-1 = 1 }
    }
    region_name      = "us-east-1"
    metadata_store   = "zookeeper"
    metadata_members = 5
    ssh_cidrs        = ["192.0.2.0/24"]
    tls = {
      ca_cert_pem       = "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n"
      cert_pem          = "-----BEGIN CERTIFICATE-----\nNODE\n-----END CERTIFICATE-----\n"
      key_ssm_parameter = "/demo/tls/key"
    }
  }

  assert {
    condition     = strcontains(aws_instance.node["us-east-1b.rack-1.1"].user_data, "--metadata zk://10.42.0.10:2181,") && strcontains(aws_instance.node["us-east-1b.rack-1.1"].user_data, " --tls-cert /etc/scriba/tls/cert.pem --tls-key /etc/scriba/tls/key.pem --tls-ca /etc/scriba/tls/ca.pem --tls-require-client-cert")
    error_message = "on ZooKeeper the bookies serve mutual TLS, the store stays zk://"
  }
  assert {
    condition     = length(aws_subnet.this) == 5 && length(aws_placement_group.rack) == 6
    error_message = "5 subnets, 6 placement groups"
  }
  assert {
    condition     = length([for i in aws_instance.node : i if i.tags["scriba:role"] == "bookie"]) == 6 && length([for i in aws_instance.node : i if i.tags["scriba:role"] == "metadata"]) == 5 && length([for k, v in aws_ebs_volume.node : v if endswith(k, "/journal")]) == 6 && length([for k, v in aws_ebs_volume.node : v if endswith(k, "/ledger")]) == 6 && length([for k, v in aws_ebs_volume.node : v if endswith(k, "/data")]) == 5
    error_message = "6 bookies with 12 volumes, 5 metadata members"
  }
  assert {
    condition     = length(toset([for m in [for i in aws_instance.node : i if i.tags["scriba:role"] == "metadata"] : m.subnet_id])) == 5
    error_message = "the 5 members are in 5 zones"
  }
  # grpc x2, binary x2, http, zk client x2, zk peer 2888 + election 3888, ssh x2
  assert {
    condition     = length(aws_vpc_security_group_ingress_rule.this) == 11 && contains(keys(aws_vpc_security_group_ingress_rule.this), "metadata-peer-3888") && contains(keys(aws_vpc_security_group_ingress_rule.this), "bookie-ssh-192.0.2.0/24")
    error_message = "ingress rules: ${jsonencode(keys(aws_vpc_security_group_ingress_rule.this))}"
  }
  assert {
    condition     = startswith(output.metadata_uri, "zk://10.42.0.10:2181,") && endswith(output.metadata_uri, ":2181/scriba") && length(split(",", output.metadata_uri)) == 5
    error_message = "metadata URI: ${output.metadata_uri}"
  }
  assert {
    condition     = strcontains(aws_instance.node["zookeeper-5"].user_data, "server.5=") && strcontains(aws_instance.node["zookeeper-5"].user_data, "echo 5 > /var/lib/scriba-zookeeper/myid")
    error_message = "ZooKeeper servers know each other and their ids"
  }
  assert {
    condition     = strcontains(aws_instance.node["us-east-1b.rack-1.1"].user_data, "--name '/demo/tls/key'") && !strcontains(aws_instance.node["us-east-1b.rack-1.1"].user_data, "PRIVATE KEY")
    error_message = "the TLS key comes from SSM, not from user data"
  }
  assert {
    condition     = length(aws_iam_role_policy.tls_key) == 1 && strcontains(aws_iam_role_policy.tls_key[0].policy, "parameter/demo/tls/key")
    error_message = "the nodes may read exactly that parameter"
  }
}

run "existing_vpc_with_tls" {
  command   = apply
  state_key = "existing_vpc_with_tls"
  variables {
    vpc_id     = "vpc-0123"
    subnet_ids = { "eu-west-1a" = "subnet-a", "eu-west-1b" = "subnet-b", "eu-west-1c" = "subnet-c" }
    tls = {
      ca_cert_pem = "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n"
      cert_pem    = "-----BEGIN CERTIFICATE-----\nNODE\n-----END CERTIFICATE-----\n"
      key_pem     = "-----BEGIN PRIVATE KEY-----\nKEY\n-----END PRIVATE KEY-----\n"
      allow       = { client = ["app-1", "app-2"], bookie = ["scriba-node"], admin = ["ops"] }
    }
  }
  override_data {
    target = data.aws_subnet.existing["eu-west-1a"]
    values = { cidr_block = "10.9.1.0/24", vpc_id = "vpc-0123", availability_zone = "eu-west-1a" }
  }
  override_data {
    target = data.aws_subnet.existing["eu-west-1b"]
    values = { cidr_block = "10.9.2.0/24", vpc_id = "vpc-0123", availability_zone = "eu-west-1b" }
  }
  override_data {
    target = data.aws_subnet.existing["eu-west-1c"]
    values = { cidr_block = "10.9.3.0/24", vpc_id = "vpc-0123", availability_zone = "eu-west-1c" }
  }

  assert {
    condition     = length(aws_vpc.this) == 0 && length(aws_subnet.this) == 0 && length(aws_internet_gateway.this) == 0
    error_message = "no network created in an existing VPC"
  }
  assert {
    condition     = aws_instance.node["eu-west-1b.rack-1.1"].subnet_id == "subnet-b" && !aws_instance.node["eu-west-1b.rack-1.1"].associate_public_ip_address
    error_message = "bookies use the given subnets, without public addresses"
  }
  assert {
    condition     = output.metadata_uri == "etcd+tls://10.9.1.10:2379,10.9.2.11:2379,10.9.3.12:2379/scriba"
    error_message = "metadata URI: ${output.metadata_uri}"
  }
  assert {
    condition     = strcontains(aws_instance.node["eu-west-1b.rack-1.1"].user_data, "--metadata etcd+tls://10.9.1.10:2379,10.9.2.11:2379,10.9.3.12:2379/scriba?ca=/etc/scriba/tls/ca.pem&cert=/etc/scriba/tls/cert.pem&key=/etc/scriba/tls/key.pem ")
    error_message = "the bookie reaches etcd over TLS with the node certificate"
  }
  assert {
    condition     = strcontains(aws_instance.node["eu-west-1b.rack-1.1"].user_data, " --tls-cert /etc/scriba/tls/cert.pem --tls-key /etc/scriba/tls/key.pem --tls-ca /etc/scriba/tls/ca.pem --tls-require-client-cert --tls-allow admin=ops --tls-allow bookie=scriba-node --tls-allow client=app-1 --tls-allow client=app-2\n")
    error_message = "the bookie serves mutual TLS with the allow-lists"
  }
  assert {
    condition     = strcontains(aws_instance.node["etcd-2"].user_data, "--listen-client-urls https://0.0.0.0:2379 --advertise-client-urls https://10.9.2.11:2379") && strcontains(aws_instance.node["etcd-2"].user_data, "--trusted-ca-file /etc/scriba/tls/ca.pem --client-cert-auth")
    error_message = "etcd serves clients over https with client certificates"
  }
  assert {
    condition     = aws_vpc_security_group_ingress_rule.this["bookie-grpc-10.9.0.0/16"].cidr_ipv4 == "10.9.0.0/16"
    error_message = "clients default to the existing VPC's CIDR"
  }
  assert {
    condition     = strcontains(aws_instance.node["etcd-1"].user_data, "--peer-client-cert-auth") && strcontains(aws_instance.node["etcd-1"].user_data, "etcd-2=https://10.9.2.11:2380")
    error_message = "etcd peers use TLS"
  }
  assert {
    condition     = strcontains(aws_instance.node["eu-west-1a.rack-1.1"].user_data, base64encode("-----BEGIN PRIVATE KEY-----\nKEY\n-----END PRIVATE KEY-----\n"))
    error_message = "the key is written from the variable"
  }
  assert {
    condition     = length(aws_iam_role_policy.tls_key) == 0
    error_message = "no SSM permission without an SSM parameter"
  }
}

# --- refusals: every listed check must fail, and nothing else may -------------------

run "refused_shape_and_settings" {
  command = plan
  variables {
    zones            = { "eu-west-1a" = { rack-1 = 8 }, "eu-west-1b" = { rack-1 = 1 } }
    metadata_members = 4
    ssh_cidrs        = ["0.0.0.0/0"]
    journal_volume   = { type = "st1", size_gib = 500 }
    ledger_volume    = { iops = 20000 }
    cluster_name     = "Demo"
    bookie_port      = 8000
    vpc_cidr         = "10.0.0.0/28"
    tls              = { ca_cert_pem = "ca", cert_pem = "cert", key_pem = "key" }
  }
  expect_failures = [
    var.zones, var.metadata_members, var.ssh_cidrs, var.journal_volume, var.ledger_volume,
    var.cluster_name, var.bookie_port, var.vpc_cidr, var.tls,
  ]
}

run "refused_binary_port_on_the_grpc_port" {
  command = plan
  variables {
    bookie_binary_port = 3181
  }
  expect_failures = [var.bookie_binary_port]
}

run "refused_one_member_two_tls_keys_subnets_without_vpc" {
  command = plan
  variables {
    metadata_members = 1
    subnet_ids       = { "eu-west-1a" = "subnet-a", "eu-west-1b" = "subnet-b", "eu-west-1c" = "subnet-c" }
    tls = {
      ca_cert_pem       = "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n"
      cert_pem          = "-----BEGIN CERTIFICATE-----\nNODE\n-----END CERTIFICATE-----\n"
      key_pem           = "-----BEGIN PRIVATE KEY-----\nKEY\n-----END PRIVATE KEY-----\n"
      key_ssm_parameter = "/demo/tls/key"
    }
  }
  expect_failures = [var.metadata_members, var.tls, var.subnet_ids]
}

run "refused_tls_allow_list" {
  command = plan
  variables {
    tls = {
      ca_cert_pem = "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n"
      cert_pem    = "-----BEGIN CERTIFICATE-----\nNODE\n-----END CERTIFICATE-----\n"
      key_pem     = "-----BEGIN PRIVATE KEY-----\nKEY\n-----END PRIVATE KEY-----\n"
      allow       = { operator = ["ops"], client = ["app 1; rm -rf /"] }
    }
  }
  expect_failures = [var.tls]
}

run "refused_existing_vpc_subnets" {
  command = plan
  variables {
    vpc_id     = "vpc-0123"
    subnet_ids = { "eu-west-1a" = "subnet-a", "eu-west-1b" = "subnet-b" }
  }
  expect_failures = [var.subnet_ids]
}

run "refused_subnet_in_wrong_zone" {
  command = plan
  variables {
    vpc_id     = "vpc-0123"
    subnet_ids = { "eu-west-1a" = "subnet-a", "eu-west-1b" = "subnet-b", "eu-west-1c" = "subnet-c" }
  }
  override_data {
    target = data.aws_subnet.existing["eu-west-1a"]
    values = { cidr_block = "10.9.1.0/24", vpc_id = "vpc-0123", availability_zone = "eu-west-1a" }
  }
  override_data {
    target = data.aws_subnet.existing["eu-west-1b"]
    values = { cidr_block = "10.9.2.0/24", vpc_id = "vpc-0123", availability_zone = "eu-west-1a" }
  }
  override_data {
    target = data.aws_subnet.existing["eu-west-1c"]
    values = { cidr_block = "10.9.3.0/24", vpc_id = "vpc-0123", availability_zone = "eu-west-1c" }
  }
  expect_failures = [data.aws_subnet.existing["eu-west-1b"]]
}
