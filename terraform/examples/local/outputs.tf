output "metadata_uri" {
  description = "SCRIBA_METADATA=... scriba shell simple-test"
  value       = module.cluster.metadata_uri
}

output "bookies" {
  description = "Bookie id => addresses and location."
  value       = module.cluster.bookies
}

output "data_dir" {
  description = "`scriba local-cluster status DATA_DIR` shows the processes."
  value       = module.cluster.data_dir
}
