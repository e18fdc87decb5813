# --- the cluster and its shape -----------------------------------------------------------

variable "cluster_name" {
  description = "Name of the cluster: prefixes every resource name and tag, and is the etcd cluster token."
  type        = string
  nullable    = false

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,30}$", var.cluster_name))
    error_message = "cluster_name: 1-31 lowercase letters, digits or '-', starting with a letter or digit."
  }
}

variable "region_name" {
  description = "Scriba's name for this region (the --region of every bookie). Default: the AWS provider's region."
  type        = string
  default     = null
}

variable "zones" {
  description = "Availability zone -> rack -> bookie count, e.g. { \"eu-west-1a\" = { rack-1 = 2 } }. At least 3 zones; at most 7 bookies per rack (each rack is a spread placement group, which holds 7 running instances per zone)."
  type        = map(map(number))
  nullable    = false

  validation {
    condition     = length(var.zones) >= 3
    error_message = "zones: give at least 3 availability zones, so the cluster and its metadata store survive the loss of one."
  }
  validation {
    condition     = alltrue(flatten([for racks in values(var.zones) : [for n in values(racks) : n >= 1 && n <= 7 && floor(n) == n]]))
    error_message = "zones: every rack holds 1 to 7 bookies (a spread placement group runs at most 7 instances per availability zone)."
  }
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

# --- metadata store ----------------------------------------------------------------------

variable "metadata_store" {
  description = "etcd (default; Ubuntu's etcd-server package) or zookeeper (Ubuntu's zookeeper package)."
  type        = string
  default     = "etcd"
  nullable    = false
}

variable "metadata_members" {
  description = "Metadata store members, spread over the zones: 3 (survives one loss) or 5 (survives two)."
  type        = number
  default     = 3
  nullable    = false

  validation {
    condition     = contains([3, 5], var.metadata_members)
    error_message = "metadata_members: 3 or 5 (an odd count, so a majority outlives a zone)."
  }
}

variable "metadata_prefix" {
  description = "Key prefix (etcd) or chroot (ZooKeeper) of this cluster: the path of the metadata URI."
  type        = string
  default     = "scriba"
  nullable    = false

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$", var.metadata_prefix))
    error_message = "metadata_prefix: 1-63 letters, digits, '_' or '-'."
  }
}

variable "metadata_ip_host_number" {
  description = "Metadata member i gets the fixed private address cidrhost(its subnet, this + i), so every node knows the store's address at boot. AWS reserves host numbers 0-3."
  type        = number
  default     = 10
  nullable    = false

  validation {
    condition     = floor(var.metadata_ip_host_number) == var.metadata_ip_host_number && var.metadata_ip_host_number >= 4 && var.metadata_ip_host_number <= 250
    error_message = "metadata_ip_host_number: a whole number from 4 (AWS reserves 0-3) to 250."
  }
}

# --- network -----------------------------------------------------------------------------

variable "vpc_id" {
  description = "An existing VPC to use (with subnet_ids). Default null: create a VPC with one public subnet per zone."
  type        = string
  default     = null
}

variable "subnet_ids" {
  description = "With vpc_id: availability zone -> existing subnet id, one for every zone in zones."
  type        = map(string)
  default     = {}
  nullable    = false

  validation {
    condition     = var.vpc_id == null ? length(var.subnet_ids) == 0 : alltrue([for z in keys(var.zones) : contains(keys(var.subnet_ids), z)])
    error_message = "subnet_ids: with vpc_id, give a subnet for every zone in zones; without vpc_id, leave it empty (the module creates the subnets)."
  }
}

variable "vpc_cidr" {
  description = "CIDR of the VPC the module creates (ignored with vpc_id)."
  type        = string
  default     = "10.42.0.0/16"
  nullable    = false

  validation {
    condition     = can(cidrhost(var.vpc_cidr, 0)) && tonumber(split("/", var.vpc_cidr)[1]) <= 24
    error_message = "vpc_cidr: an IPv4 CIDR block of /24 or larger."
  }
}

variable "subnet_newbits" {
  description = "Bits added to vpc_cidr for each zone's subnet (8: a /16 gives /24 subnets)."
  type        = number
  default     = 8
  nullable    = false

  validation {
    condition     = floor(var.subnet_newbits) == var.subnet_newbits && var.subnet_newbits >= 2 && var.subnet_newbits <= 12
    error_message = "subnet_newbits: a whole number from 2 to 12."
  }
}

variable "associate_public_ip" {
  description = "Give instances public addresses (they reach the package mirrors through the internet gateway). Default: true in a VPC the module creates, false in an existing one (which then needs a NAT gateway, a proxy or an AMI with Scriba installed)."
  type        = bool
  default     = null
}

variable "client_cidrs" {
  description = "CIDRs of clients allowed to reach the bookies' gRPC port and the metadata store's client port. Default: the VPC's CIDR."
  type        = list(string)
  default     = null

  validation {
    condition     = var.client_cidrs == null ? true : alltrue([for c in var.client_cidrs : can(cidrhost(c, 0))])
    error_message = "client_cidrs: IPv4 CIDR blocks."
  }
}

variable "admin_cidrs" {
  description = "CIDRs allowed to reach the bookies' HTTP port (/health, /metrics). Default: the VPC's CIDR."
  type        = list(string)
  default     = null

  validation {
    condition     = var.admin_cidrs == null ? true : alltrue([for c in var.admin_cidrs : can(cidrhost(c, 0))])
    error_message = "admin_cidrs: IPv4 CIDR blocks."
  }
}

variable "ssh_cidrs" {
  description = "CIDRs allowed to reach port 22. Default: none (no SSH rule; use SSM Session Manager or add CIDRs)."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for c in var.ssh_cidrs : can(cidrhost(c, 0)) && c != "0.0.0.0/0"])
    error_message = "ssh_cidrs: IPv4 CIDR blocks, and not 0.0.0.0/0."
  }
}

variable "egress_cidrs" {
  description = "Where instances may connect out (package mirrors, PyPI, the other zones)."
  type        = list(string)
  default     = ["0.0.0.0/0"]
  nullable    = false

  validation {
    condition     = length(var.egress_cidrs) > 0 && alltrue([for c in var.egress_cidrs : can(cidrhost(c, 0))])
    error_message = "egress_cidrs: at least one IPv4 CIDR block."
  }
}

variable "bookie_port" {
  description = "Bookies' gRPC port."
  type        = number
  default     = 3181
  nullable    = false

  validation {
    condition     = var.bookie_port >= 1024 && var.bookie_port <= 65535 && var.bookie_port != var.http_port
    error_message = "bookie_port: 1024-65535 and not http_port."
  }
}

variable "bookie_binary_port" {
  description = "Bookies' binary data-path port (adds and reads; clients prefer it and fall back to gRPC)."
  type        = number
  default     = 3182
  nullable    = false

  validation {
    condition     = var.bookie_binary_port >= 1024 && var.bookie_binary_port <= 65535 && var.bookie_binary_port != var.bookie_port && var.bookie_binary_port != var.http_port
    error_message = "bookie_binary_port: 1024-65535, not bookie_port and not http_port."
  }
}

variable "http_port" {
  description = "Bookies' HTTP port (/health and /metrics)."
  type        = number
  default     = 8000
  nullable    = false

  validation {
    condition     = var.http_port >= 1024 && var.http_port <= 65535
    error_message = "http_port: 1024-65535."
  }
}

# --- instances and volumes ---------------------------------------------------------------

variable "bookie_instance_type" {
  description = "Bookie instance type. Bookies are CPU-bound (Python) and need EBS bandwidth: m6i.large (2 vCPU, 8 GiB, up to 10 Gbit/s EBS burst) is a balanced start; c6i for CPU, r6i for larger write caches."
  type        = string
  default     = "m6i.large"
  nullable    = false
}

variable "metadata_instance_type" {
  description = "Metadata store instance type. etcd and ZooKeeper want steady CPU and low fsync latency: t3.medium is the cheap start (burstable: watch CPU credits), m6i.large the production choice."
  type        = string
  default     = "t3.medium"
  nullable    = false
}

variable "journal_volume" {
  description = "Each bookie's journal EBS volume (every add is fdatasync'ed here: IOPS and latency matter most). gp3 includes 3000 IOPS and 125 MiB/s; io2 gives the lowest latency at a higher price."
  type = object({
    type             = optional(string, "gp3")
    size_gib         = optional(number, 50)
    iops             = optional(number, 3000)
    throughput_mibps = optional(number, 125)
  })
  default  = {}
  nullable = false

  validation {
    condition     = contains(["gp3", "io1", "io2"], var.journal_volume.type) && var.journal_volume.size_gib >= 8 && var.journal_volume.iops >= 3000
    error_message = "journal_volume: type gp3, io1 or io2 (a journal needs provisioned IOPS), size_gib >= 8, iops >= 3000."
  }
  validation {
    condition     = var.journal_volume.type != "gp3" || (var.journal_volume.throughput_mibps >= 125 && var.journal_volume.throughput_mibps <= 1000 && var.journal_volume.iops <= 16000)
    error_message = "journal_volume: gp3 takes throughput_mibps 125-1000 and iops up to 16000."
  }
}

variable "ledger_volume" {
  description = "Each bookie's ledger (entry log + index) EBS volume: mostly sequential writes and random reads. gp3 is the default; st1 is cheaper per GiB for large, cold, sequential data (no IOPS setting)."
  type = object({
    type             = optional(string, "gp3")
    size_gib         = optional(number, 500)
    iops             = optional(number, 3000)
    throughput_mibps = optional(number, 250)
  })
  default  = {}
  nullable = false

  validation {
    condition     = contains(["gp3", "io1", "io2", "st1"], var.ledger_volume.type) && var.ledger_volume.size_gib >= (var.ledger_volume.type == "st1" ? 125 : 8)
    error_message = "ledger_volume: type gp3, io1, io2 or st1; size_gib >= 8 (st1: >= 125)."
  }
  validation {
    condition     = var.ledger_volume.type != "gp3" || (var.ledger_volume.throughput_mibps >= 125 && var.ledger_volume.throughput_mibps <= 1000 && var.ledger_volume.iops >= 3000 && var.ledger_volume.iops <= 16000)
    error_message = "ledger_volume: gp3 takes iops 3000-16000 and throughput_mibps 125-1000."
  }
}

variable "metadata_volume" {
  description = "Each metadata member's data EBS volume (etcd's WAL fsyncs every write)."
  type = object({
    type             = optional(string, "gp3")
    size_gib         = optional(number, 20)
    iops             = optional(number, 3000)
    throughput_mibps = optional(number, 125)
  })
  default  = {}
  nullable = false

  validation {
    condition     = contains(["gp3", "io1", "io2"], var.metadata_volume.type) && var.metadata_volume.size_gib >= 8
    error_message = "metadata_volume: type gp3, io1 or io2, size_gib >= 8."
  }
}

variable "ebs_kms_key_id" {
  description = "KMS key for the EBS volumes (all are encrypted). Default: the account's EBS key."
  type        = string
  default     = null
}

variable "root_volume_size_gib" {
  description = "Root volume size of every instance (OS, Scriba's virtualenv, logs)."
  type        = number
  default     = 20
  nullable    = false

  validation {
    condition     = var.root_volume_size_gib >= 8
    error_message = "root_volume_size_gib: at least 8."
  }
}

variable "ami_id" {
  description = "AMI for every instance. Default null: the newest image matching ami_name_pattern from ami_owners (Ubuntu 24.04 LTS, x86-64). The cloud-init scripts expect Ubuntu or Debian."
  type        = string
  default     = null
}

variable "ami_owners" {
  description = "Owners searched when ami_id is null (099720109477: Canonical)."
  type        = list(string)
  default     = ["099720109477"]
  nullable    = false
}

variable "ami_name_pattern" {
  description = "Name pattern searched when ami_id is null. Use an arm64 image with Graviton instance types."
  type        = string
  default     = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"
  nullable    = false
}

variable "key_name" {
  description = "EC2 key pair for SSH (with ssh_cidrs). Default: none."
  type        = string
  default     = null
}

variable "scriba_package" {
  description = "What cloud-init installs with pip into /opt/scriba: a requirement (\"scriba==0.1.0\" on your index), a wheel URL or a git+https:// URL."
  type        = string
  default     = "scriba"
  nullable    = false

  validation {
    condition     = trimspace(var.scriba_package) != "" && !can(regex("['\\n]", var.scriba_package))
    error_message = "scriba_package: a non-empty pip requirement without quotes or newlines."
  }
}

variable "pip_index_url" {
  description = "A pip index (mirror) for installing Scriba. Default: PyPI."
  type        = string
  default     = null
}

variable "bookie_extra_args" {
  description = "Extra arguments for `scriba bookie run` (e.g. [\"--gc-interval-s\", \"300\"])."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for a in var.bookie_extra_args : !can(regex("[\\n'\"]", a))])
    error_message = "bookie_extra_args: arguments without quotes or newlines."
  }
}

variable "tls" {
  description = <<-EOT
    TLS material (PEM), or null. Certificate and CA are written to /etc/scriba/tls on every node;
    the private key too, unless key_ssm_parameter names an SSM SecureString parameter that each node
    reads at boot through its instance role, which keeps the key out of user data, plan files and state
    (with key_pem the key travels in user data: plan files, the state and EC2 attribute readers see it).
    The cluster then runs mutual TLS: every bookie serves gRPC, the binary data path and HTTP with
    the certificate (--tls-cert/--tls-key/--tls-ca --tls-require-client-cert) and admits the
    identities in allow (role client, bookie or admin -> certificate CN/SAN names; empty: any
    certificate the CA signed); etcd serves clients over https with client-certificate auth and
    its peers over mutual TLS, and the bookies reach it with the node certificate
    (etcd+tls://...?ca=&cert=&key=). metadata_uri becomes etcd+tls://: clients add their own
    ?ca=&cert=&key=. ZooKeeper members are not given TLS by this module (Debian's zookeeperd needs
    a keystore): with metadata_store = "zookeeper" only the bookies' ports use it. The
    certificate's SANs must cover the nodes' private addresses.
  EOT
  type = object({
    ca_cert_pem       = string
    cert_pem          = string
    key_pem           = optional(string)
    key_ssm_parameter = optional(string)
    allow             = optional(map(list(string)), {})
  })
  default   = null
  sensitive = true

  validation {
    condition     = var.tls == null ? true : (var.tls.key_pem == null) != (var.tls.key_ssm_parameter == null)
    error_message = "tls: give exactly one of key_pem and key_ssm_parameter."
  }
  validation {
    condition     = var.tls == null ? true : strcontains(var.tls.ca_cert_pem, "BEGIN CERTIFICATE") && strcontains(var.tls.cert_pem, "BEGIN CERTIFICATE") && (var.tls.key_pem == null ? true : strcontains(var.tls.key_pem, "PRIVATE KEY"))
    error_message = "tls: ca_cert_pem and cert_pem must be PEM certificates and key_pem a PEM private key."
  }
  validation {
    condition     = var.tls == null ? true : alltrue([for role, ids in var.tls.allow : contains(["client", "bookie", "admin"], role) && alltrue([for id in ids : can(regex("^[A-Za-z0-9*][A-Za-z0-9._@*-]*$", id))])])
    error_message = "tls.allow: roles client, bookie, admin; identities of letters, digits, '.', '_', '@', '-' or '*'."
  }
}

variable "tags" {
  description = "Tags added to every resource (besides Name, scriba:cluster and scriba:role)."
  type        = map(string)
  default     = {}
  nullable    = false
}
