# Bookies: one instance per bookie in its zone's subnet and its rack's spread placement
# group (no two bookies of a rack share hardware), with a journal and a ledger volume
# that outlive the instance.

resource "aws_placement_group" "rack" {
  for_each = module.topology.racks

  name         = "${var.cluster_name}-${replace(each.key, ".", "-")}"
  strategy     = "spread"
  spread_level = "rack"
  tags         = merge(local.common_tags, { "scriba:zone" = each.value.zone, "scriba:rack" = each.value.rack })
}

resource "aws_ebs_volume" "journal" {
  for_each = local.bookies

  availability_zone = each.value.zone
  type              = var.journal_volume.type
  size              = var.journal_volume.size_gib
  iops              = var.journal_volume.iops
  throughput        = var.journal_volume.type == "gp3" ? var.journal_volume.throughput_mibps : null
  encrypted         = true
  kms_key_id        = var.ebs_kms_key_id
  tags              = merge(local.common_tags, { Name = "${var.cluster_name}-${each.key}-journal", "scriba:role" = "journal" })
}

resource "aws_ebs_volume" "ledger" {
  for_each = local.bookies

  availability_zone = each.value.zone
  type              = var.ledger_volume.type
  size              = var.ledger_volume.size_gib
  iops              = contains(["gp3", "io1", "io2"], var.ledger_volume.type) ? var.ledger_volume.iops : null
  throughput        = var.ledger_volume.type == "gp3" ? var.ledger_volume.throughput_mibps : null
  encrypted         = true
  kms_key_id        = var.ebs_kms_key_id
  tags              = merge(local.common_tags, { Name = "${var.cluster_name}-${each.key}-ledger", "scriba:role" = "ledger" })
}

locals {
  pip_index_args = var.pip_index_url == null ? "" : "--index-url '${var.pip_index_url}' "
  bookie_user_data = {
    for id, b in local.bookies : id => join("\n", [
      local.user_data_prelude["bookie"],
      templatefile("${path.module}/templates/bookie.sh.tftpl", {
        bookie_id         = id
        region            = b.region
        zone              = b.zone
        rack              = b.rack
        journal_volume_id = aws_ebs_volume.journal[id].id
        ledger_volume_id  = aws_ebs_volume.ledger[id].id
        metadata_uri      = local.metadata_uri
        bookie_port       = var.bookie_port
        http_port         = var.http_port
        scriba_package    = var.scriba_package
        pip_index_args    = local.pip_index_args
        topology_b64      = base64encode(module.topology.topology_json)
        extra_args        = join("", [for a in var.bookie_extra_args : " ${a}"])
      }),
    ])
  }
}

resource "aws_instance" "bookie" {
  for_each = local.bookies

  ami                         = local.ami_id
  instance_type               = var.bookie_instance_type
  subnet_id                   = local.subnet_ids[each.value.zone]
  placement_group             = aws_placement_group.rack["${each.value.zone}.${each.value.rack}"].name
  vpc_security_group_ids      = [aws_security_group.bookie.id]
  associate_public_ip_address = local.associate_public_ip
  key_name                    = var.key_name
  iam_instance_profile        = aws_iam_instance_profile.node.name
  user_data                   = local.bookie_user_data[each.key]

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
  # user data runs at first boot only, and a newer AMI must not replace every bookie at
  # once: roll changes one bookie at a time with `terraform apply -replace=...` (the
  # volumes stay; the new instance mounts them and the bookie keeps its id and cookie).
  lifecycle {
    ignore_changes = [ami, user_data]
  }
  tags = merge(local.common_tags, {
    Name          = "${var.cluster_name}-${each.key}"
    "scriba:role" = "bookie"
    "scriba:zone" = each.value.zone
    "scriba:rack" = each.value.rack
  })
}

resource "aws_volume_attachment" "journal" {
  for_each = local.bookies

  device_name                    = "/dev/sdf"
  volume_id                      = aws_ebs_volume.journal[each.key].id
  instance_id                    = aws_instance.bookie[each.key].id
  stop_instance_before_detaching = true
}

resource "aws_volume_attachment" "ledger" {
  for_each = local.bookies

  device_name                    = "/dev/sdg"
  volume_id                      = aws_ebs_volume.ledger[each.key].id
  instance_id                    = aws_instance.bookie[each.key].id
  stop_instance_before_detaching = true
}
