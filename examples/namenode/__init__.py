"""A NameNode-style HA namespace whose edit log is a Scriba RSM, served over WebHDFS.

    python -m scriba.examples.namenode serve --metadata etcd://127.0.0.1:2379/scriba --id nn1 \\
        --listen 127.0.0.1:9870

Layers: ``errors`` (HDFS's exceptions), ``edits`` (typed, versioned edit records),
``namespace`` (the I/O-free tree and its rules, fsimage), ``views`` (WebHDFS JSON
shapes), ``machine`` (the RSM state machine), ``blocks`` (file data in ledgers),
``server`` (the WebHDFS HTTP endpoint), ``__main__`` (the command).
"""
