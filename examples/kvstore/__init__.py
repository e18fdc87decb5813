"""An HA key-value store on ``scriba.rsm`` that speaks etcd's v3 gRPC API.

    python -m scriba.examples.kvstore serve --metadata etcd://127.0.0.1:2379/scriba \\
        --replica-id r1 --listen 127.0.0.1:23790       # or: scriba-kv serve ...
    etcdctl --endpoints 127.0.0.1:23790,127.0.0.1:23791,127.0.0.1:23792 put k v

- ``mvcc``, ``leases``, ``machine``: etcd's data model as a deterministic state
  machine (no I/O, no clock: the proposer's clock travels in the command);
- ``commands``: commands, queries and results (etcd's protobuf messages inside);
- ``errors``: etcd's gRPC codes and messages;
- ``server``: the gRPC servicers on one RSM replica; ``__main__``: the command line.
"""

from scriba.examples.kvstore.errors import EtcdError
from scriba.examples.kvstore.machine import KvMachine

__all__ = ["EtcdError", "KvMachine"]
