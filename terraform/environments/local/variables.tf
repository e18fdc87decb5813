# --- the shape (passed to modules/topology, as modules/aws-cluster does) ---------------

variable "regions" {
  description = "region -> zone -> rack -> bookie count. Each bookie is a process on this machine."
  type        = map(map(map(number)))
  default = {
    region-1 = {
      zone-a = { rack-1 = 1 }
      zone-b = { rack-1 = 1 }
      zone-c = { rack-1 = 1 }
    }
  }
  nullable = false
}

variable "placement" {
  description = "What clients will use — placement policy (random, rack-aware, zone-aware, region-aware) and quorums; modules/topology checks the shape against it."
  type = object({
    policy            = optional(string, "zone-aware")
    ensemble_size     = optional(number, 3)
    write_quorum_size = optional(number, 3)
    ack_quorum_size   = optional(number, 2)
  })
  default  = {}
  nullable = false
}

variable "metadata_members" {
  description = "etcd members to run (odd: 1, 3, 5 or 7)."
  type        = number
  default     = 1
  nullable    = false
}

# --- TLS -----------------------------------------------------------------------------

variable "tls" {
  description = <<-EOT
    Mutual TLS for every process, or null (plaintext). Paths of PEM files on this machine:
    ca_cert (the CA that verifies peers), cert and key (what etcd and the bookies serve and
    dial with; its SANs must cover 127.0.0.1), and optionally client_cert / client_key, the
    certificate the outputs' metadata_uri and client_tls_flags hand to clients. allow: role
    (client, bookie, admin) -> certificate identities (CN or SAN) the bookies admit; empty: any
    certificate the CA signed. etcd serves its client and peer ports over TLS and asks for a
    client certificate; the bookies reach it with cert and key.
  EOT
  type = object({
    ca_cert     = string
    cert        = string
    key         = string
    client_cert = optional(string)
    client_key  = optional(string)
    allow       = optional(map(list(string)), {})
  })
  default = null

  validation {
    condition     = var.tls == null ? true : alltrue([for p in [var.tls.ca_cert, var.tls.cert, var.tls.key] : fileexists(p)])
    error_message = "tls: ca_cert, cert and key must be paths of existing files."
  }
  validation {
    condition     = var.tls == null ? true : (var.tls.client_cert == null) == (var.tls.client_key == null)
    error_message = "tls: client_cert and client_key go together."
  }
  validation {
    condition     = var.tls == null ? true : alltrue([for role in keys(var.tls.allow) : contains(["client", "bookie", "admin"], role)])
    error_message = "tls.allow: roles are client, bookie and admin."
  }
}

# --- this machine ----------------------------------------------------------------------

variable "data_dir" {
  description = "Directory for everything the cluster keeps: etcd data, bookie journals and ledgers, logs, PID records, topology.json. Relative paths are taken from where terraform runs."
  type        = string
  nullable    = false

  validation {
    condition     = trimspace(var.data_dir) != "" && abspath(var.data_dir) != "/"
    error_message = "data_dir: a directory other than / (destroy removes what the cluster wrote under it)."
  }
}

variable "keep_data_on_destroy" {
  description = "When true, destroy stops the processes but keeps their data (apply again to restart on it). Apply a change of this value before destroying: destroy reads it from the state."
  type        = bool
  default     = false
  nullable    = false
}

variable "metadata_port_base" {
  description = "etcd member i serves clients on 127.0.0.1:(base + 2i) and peers on base + 2i + 1."
  type        = number
  default     = 2379
  nullable    = false

  validation {
    condition     = floor(var.metadata_port_base) == var.metadata_port_base && var.metadata_port_base >= 1024 && var.metadata_port_base + 2 * var.metadata_members <= 65536
    error_message = "metadata_port_base: a whole number from 1024, with room for 2 ports per member below 65536."
  }
}

variable "bookie_port_base" {
  description = "Bookie number i (in topology index order) serves gRPC on 127.0.0.1:(base + i)."
  type        = number
  default     = 3181
  nullable    = false

  validation {
    condition     = floor(var.bookie_port_base) == var.bookie_port_base && var.bookie_port_base >= 1024 && var.bookie_port_base <= 65000
    error_message = "bookie_port_base: a whole number from 1024 to 65000."
  }
}

variable "http_port_base" {
  description = "Bookie number i serves /health and /metrics on 127.0.0.1:(base + i)."
  type        = number
  default     = 8000
  nullable    = false

  validation {
    condition     = floor(var.http_port_base) == var.http_port_base && var.http_port_base >= 1024 && var.http_port_base <= 65000
    error_message = "http_port_base: a whole number from 1024 to 65000."
  }
}

variable "metadata_prefix" {
  description = "Key prefix of the cluster in etcd (the path of the metadata URI)."
  type        = string
  default     = "scriba"
  nullable    = false

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$", var.metadata_prefix))
    error_message = "metadata_prefix: 1-63 letters, digits, '_' or '-'."
  }
}

variable "scriba_command" {
  description = "How to run the scriba CLI, as an argument list: [\"scriba\"] when it is on PATH, or [\"/path/to/.venv/bin/python\", \"-m\", \"scriba.cli\"]."
  type        = list(string)
  default     = ["scriba"]
  nullable    = false

  validation {
    condition     = length(var.scriba_command) > 0 && alltrue([for a in var.scriba_command : a != ""])
    error_message = "scriba_command: a non-empty list of non-empty arguments."
  }
}
