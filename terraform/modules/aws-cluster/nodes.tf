# Every node — bookies and metadata members — is one instance in its zone's subnet with
# its data on EBS volumes of its own, which outlive the instance: a bookie has a journal
# (/dev/sdf) and a ledger (/dev/sdg) volume, a metadata member a data volume (/dev/sdf).

locals {
  nodes = merge(
    { for id, b in local.bookies : id => {
      role            = "bookie"
      zone            = b.zone
      rack            = b.rack
      instance_type   = var.bookie_instance_type
      security_group  = aws_security_group.bookie.id
      placement_group = aws_placement_group.rack["${b.zone}.${b.rack}"].name
      private_ip      = null
      user_data       = local.bookie_user_data[id]
    } },
    { for name, m in local.metadata_members : name => {
      role            = "metadata"
      zone            = m.zone
      rack            = null
      instance_type   = var.metadata_instance_type
      security_group  = aws_security_group.metadata.id
      placement_group = null
      private_ip      = local.metadata_ips[name]
      user_data       = local.metadata_user_data[name]
    } },
  )

  # "<node>/<kind>" => settings (bookie ids hold dots, member names do not: no clash)
  volumes = merge(
    { for id, b in local.bookies : "${id}/journal" => merge(var.journal_volume, { node = id, kind = "journal", zone = b.zone, device = "/dev/sdf" }) },
    { for id, b in local.bookies : "${id}/ledger" => merge(var.ledger_volume, { node = id, kind = "ledger", zone = b.zone, device = "/dev/sdg" }) },
    { for name, m in local.metadata_members : "${name}/data" => merge(var.metadata_volume, { node = name, kind = "data", zone = m.zone, device = "/dev/sdf" }) },
  )
}

resource "aws_ebs_volume" "node" {
  for_each = local.volumes

  availability_zone = each.value.zone
  type              = each.value.type
  size              = each.value.size_gib
  iops              = contains(["gp3", "io1", "io2"], each.value.type) ? each.value.iops : null
  throughput        = each.value.type == "gp3" ? each.value.throughput_mibps : null
  encrypted         = true
  kms_key_id        = var.ebs_kms_key_id
  tags = merge(local.common_tags, {
    Name          = "${var.cluster_name}-${each.value.node}-${each.value.kind}"
    "scriba:role" = each.value.kind
  })
}

resource "aws_instance" "node" {
  for_each = local.nodes

  ami                         = local.ami_id
  instance_type               = each.value.instance_type
  subnet_id                   = local.subnet_ids[each.value.zone]
  private_ip                  = each.value.private_ip
  placement_group             = each.value.placement_group
  vpc_security_group_ids      = [each.value.security_group]
  associate_public_ip_address = local.associate_public_ip
  key_name                    = var.key_name
  iam_instance_profile        = aws_iam_instance_profile.node.name
  user_data                   = each.value.user_data

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
  # User data runs at first boot only, and a newer AMI must not replace every node at
  # once: roll changes one node at a time with `terraform apply -replace=...` (the volumes
  # stay; the new instance mounts them, and a bookie keeps its id and cookie).
  lifecycle {
    ignore_changes = [ami, user_data]
  }
  tags = merge(local.common_tags, {
    Name          = "${var.cluster_name}-${each.key}"
    "scriba:role" = each.value.role
    "scriba:zone" = each.value.zone
    }, each.value.rack == null ? {} : {
    "scriba:rack" = each.value.rack
  })
}

resource "aws_volume_attachment" "node" {
  for_each = local.volumes

  device_name                    = each.value.device
  volume_id                      = aws_ebs_volume.node[each.key].id
  instance_id                    = aws_instance.node[each.value.node].id
  stop_instance_before_detaching = true
}
