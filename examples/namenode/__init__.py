"""A NameNode-style HA namespace whose edit log is a Scriba RSM, served over WebHDFS.

    scriba-namenode serve --metadata etcd://127.0.0.1:2379/scriba --id nn1 --listen 127.0.0.1:9870
    scriba-namenode haadmin --metadata etcd://127.0.0.1:2379/scriba -getAllServiceState
    scriba sandbox --with namenode          # etcd, bookies, and nn1-nn3 over the zones

Layers: ``errors`` (HDFS's exceptions), ``edits`` (typed, versioned edit records),
``permissions`` (HDFS's owner/group/mode checks), ``namespace`` (the I/O-free tree and
its rules, fsimage), ``views`` (WebHDFS JSON shapes), ``machine`` (the RSM state
machine), ``blocks`` (file data in ledgers, block locations), ``server`` (the WebHDFS
HTTP endpoint), ``ha`` (the endpoint registry and ``haadmin``), ``__main__`` (the command).

Clients: HdfsCLI (``hdfs``), fsspec's ``webhdfs`` and Hadoop's own ``WebHdfsFileSystem``
(Spark's ``webhdfs://``) are tested against it.
"""
