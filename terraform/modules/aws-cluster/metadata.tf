# The metadata store's first-boot scripts: metadata_members nodes over the zones
# (modules/topology picks each member's zone), each at a fixed private address so that
# members know each other, and bookies the URI, before anything boots.

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
  # clients (the bookies, Scriba's clients) over https with client certificates; peers over mutual TLS
  etcd_tls_args = local.tls_enabled ? join(" ", [
    "", "--cert-file /etc/scriba/tls/cert.pem", "--key-file /etc/scriba/tls/key.pem",
    "--trusted-ca-file /etc/scriba/tls/ca.pem", "--client-cert-auth",
    "--peer-cert-file /etc/scriba/tls/cert.pem", "--peer-key-file /etc/scriba/tls/key.pem",
    "--peer-trusted-ca-file /etc/scriba/tls/ca.pem", "--peer-client-cert-auth",
  ]) : ""

  metadata_user_data = {
    for name, m in local.metadata_members : name => join("\n", [
      local.user_data_prelude[var.metadata_store],
      var.metadata_store == "etcd" ? templatefile("${path.module}/templates/etcd.sh.tftpl", {
        name          = name
        ip            = local.metadata_ips[name]
        region        = m.region
        zone          = m.zone
        cluster_name  = var.cluster_name
        volume_id     = aws_ebs_volume.node["${name}/data"].id
        client_port   = local.metadata_ports.client
        peer_port     = local.metadata_ports.peer[0]
        peer_scheme   = local.etcd_peer_scheme
        client_scheme = local.etcd_peer_scheme
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
        volume_id   = aws_ebs_volume.node["${name}/data"].id
        client_port = local.metadata_ports.client
        servers = join("\n", [
          for other in module.topology.metadata.members : "server.${other.index + 1}=${local.metadata_ips[other.name]}:${local.metadata_ports.peer[0]}:${local.metadata_ports.peer[1]}"
        ])
      }),
    ])
  }
}
