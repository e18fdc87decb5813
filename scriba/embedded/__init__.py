"""Embedded servers Scriba can start itself: etcd (the default metadata store) and ZooKeeper."""
