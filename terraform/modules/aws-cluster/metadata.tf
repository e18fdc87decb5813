# The metadata store: metadata_members instances over the zones (modules/topology picks
# each member's zone), each at a fixed private address and with a data volume.

locals {
  user_data_prelude = {
    for role in ["bookie", var.metadata_store] : role => templatefile("${path.module}/templates/prelude.sh.tftpl", {
      role          = role
      cluster_name  = var.cluster_name
      packages      = role == "bookie" ? "python3-venv" : (role == "etcd" ? "etcd-server" : "zookeeperd default-jre-headless")
      tls_enabled   = local.tls_enabled
      key_parameter = local.tls_key_parameter
      ca_cert_b64   = base64encode(local.tls_files.ca_cert_pem)
      cert_b64      = base64encode(local.tls_files.cert_pem)
      key_b64       = base64encode(local.tls_files.key_pem)
    })
  }

  etcd_peer_scheme = local.tls_enabled ? "https" : "http"
  etcd_tls_args = local.tls_enabled ? join(" ", [
    "", "--peer-cert-file /etc/scriba/tls/cert.pem", "--peer-key-file /etc/scriba/tls/key.pem",
    "--peer-trusted-ca-file /etc/scriba/tls/ca.pem", "--peer-client-cert-auth",
  ]) : ""

  metadata_user_data = {
    for name, m in local.metadata_members : name => join("\n", [
      local.user_data_prelude[var.metadata_store],
      var.metadata_store == "etcd" ? templatefile("${path.module}/templates/etcd.sh.tftpl", {
        name         = name
        ip           = local.metadata_ips[name]
        region       = m.region
        zone         = m.zone
        cluster_name = var.cluster_name
        volume_id    = aws_ebs_volume.metadata[name].id
        client_port  = local.metadata_ports.client
        peer_port    = local.metadata_ports.peer[0]
        peer_scheme  = local.etcd_peer_scheme
        initial_cluster = join(",", [
          for other in module.topology.metadata.members : "${other.name}=${local.etcd_peer_scheme}://${local.metadata_ips[other.name]}:${local.metadata_ports.peer[0]}"
        ])
        tls_args = local.etcd_tls_args
        }) : templatefile("${path.module}/templates/zookeeper.sh.tftpl", {
        name        = name
        myid        = m.index + 1
        ip          = local.metadata_ips[name]
        region      = m.region
        zone        = m.zone
        volume_id   = aws_ebs_volume.metadata[name].id
        client_port = local.metadata_ports.client
        servers = join("\n", [
          for other in module.topology.metadata.members : "server.${other.index + 1}=${local.metadata_ips[other.name]}:${local.metadata_ports.peer[0]}:${local.metadata_ports.peer[1]}"
        ])
      }),
    ])
  }
}

resource "aws_ebs_volume" "metadata" {
  for_each = local.metadata_members

  availability_zone = each.value.zone
  type              = var.metadata_volume.type
  size              = var.metadata_volume.size_gib
  iops              = contains(["gp3", "io1", "io2"], var.metadata_volume.type) ? var.metadata_volume.iops : null
  throughput        = var.metadata_volume.type == "gp3" ? var.metadata_volume.throughput_mibps : null
  encrypted         = true
  kms_key_id        = var.ebs_kms_key_id
  tags              = merge(local.common_tags, { Name = "${var.cluster_name}-${each.key}-data", "scriba:role" = "metadata" })
}

resource "aws_instance" "metadata" {
  for_each = local.metadata_members

  ami                         = local.ami_id
  instance_type               = var.metadata_instance_type
  subnet_id                   = local.subnet_ids[each.value.zone]
  private_ip                  = local.metadata_ips[each.key]
  vpc_security_group_ids      = [aws_security_group.metadata.id]
  associate_public_ip_address = local.associate_public_ip
  key_name                    = var.key_name
  iam_instance_profile        = aws_iam_instance_profile.node.name
  user_data                   = local.metadata_user_data[each.key]

  metadata_options {
    http_endpoint = "enabled"
    http_tokens   = "required" # IMDSv2 only
  }
  root_block_device {
    volume_type = "gp3"
    volume_size = var.root_volume_size_gib
    encrypted   = true
    kms_key_id  = var.ebs_kms_key_id
  }
  # user data runs at first boot only, and a newer AMI must not replace a member:
  # roll changes one member at a time with `terraform apply -replace=...`.
  lifecycle {
    ignore_changes = [ami, user_data]
  }
  tags = merge(local.common_tags, {
    Name          = "${var.cluster_name}-${each.key}"
    "scriba:role" = "metadata"
    "scriba:zone" = each.value.zone
  })
}

resource "aws_volume_attachment" "metadata" {
  for_each = local.metadata_members

  device_name                    = "/dev/sdf"
  volume_id                      = aws_ebs_volume.metadata[each.key].id
  instance_id                    = aws_instance.metadata[each.key].id
  stop_instance_before_detaching = true
}
