variable "data_dir" {
  description = "Where the cluster keeps its data (removed by destroy)."
  type        = string
  default     = "./scriba-data"
}

variable "scriba_command" {
  description = "How to run the scriba CLI: [\"scriba\"] when it is on PATH, or [\"/path/to/.venv/bin/python\", \"-m\", \"scriba.cli\"]."
  type        = list(string)
  default     = ["scriba"]
}
