# Bookies: each in its rack's spread placement group (no two bookies of a rack share
# hardware), with its first-boot script.

resource "aws_placement_group" "rack" {
  for_each = module.topology.racks

  name         = "${var.cluster_name}-${replace(each.key, ".", "-")}"
  strategy     = "spread"
  spread_level = "rack"
  tags         = merge(local.common_tags, { "scriba:zone" = each.value.zone, "scriba:rack" = each.value.rack })
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
        journal_volume_id = aws_ebs_volume.node["${id}/journal"].id
        ledger_volume_id  = aws_ebs_volume.node["${id}/ledger"].id
        metadata_uri      = local.bookie_metadata_uri
        bookie_port       = var.bookie_port
        binary_port       = var.bookie_binary_port
        http_port         = var.http_port
        scriba_package    = var.scriba_package
        pip_index_args    = local.pip_index_args
        topology_b64      = base64encode(module.topology.topology_json)
        extra_args        = join("", concat([local.bookie_tls_args], [for a in var.bookie_extra_args : " ${a}"]))
      }),
    ])
  }
}
