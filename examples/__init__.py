"""Example applications built on Scriba's public API (installed as ``scriba.examples``).

- ``kvstore``: an HA key-value store on ``scriba.rsm`` speaking etcd's v3 gRPC API;
- ``namenode``: an HA HDFS namespace on ``scriba.rsm`` served over WebHDFS.
"""
