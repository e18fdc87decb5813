"""etcd's errors: the gRPC status code and the exact message etcd's server sends.

The state machine returns them as results (an exception from ``apply`` would stop the
replica); the gRPC layer aborts the call with ``code`` and ``message``, which is
what etcd clients match on (``etcdctl`` prints the message, ``aetcd`` maps the
code to its own exception types).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EtcdError(Exception):
    code: str  # a grpc.StatusCode name (the core stays free of grpc)
    message: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


EMPTY_KEY = EtcdError("INVALID_ARGUMENT", "etcdserver: key is not provided")
KEY_NOT_FOUND = EtcdError("INVALID_ARGUMENT", "etcdserver: key not found")
VALUE_PROVIDED = EtcdError("INVALID_ARGUMENT", "etcdserver: value is provided")
LEASE_PROVIDED = EtcdError("INVALID_ARGUMENT", "etcdserver: lease is provided")
TOO_MANY_OPS = EtcdError("INVALID_ARGUMENT", "etcdserver: too many operations in txn request")
DUPLICATE_KEY = EtcdError("INVALID_ARGUMENT", "etcdserver: duplicate key given in txn request")
INVALID_SORT = EtcdError("INVALID_ARGUMENT", "etcdserver: invalid sort option")
REQUEST_TOO_LARGE = EtcdError("INVALID_ARGUMENT", "etcdserver: request is too large")
COMPACTED = EtcdError("OUT_OF_RANGE", "etcdserver: mvcc: required revision has been compacted")
FUTURE_REV = EtcdError("OUT_OF_RANGE", "etcdserver: mvcc: required revision is a future revision")
LEASE_NOT_FOUND = EtcdError("NOT_FOUND", "etcdserver: requested lease not found")
LEASE_EXISTS = EtcdError("FAILED_PRECONDITION", "etcdserver: lease already exists")
LEASE_TTL_TOO_LARGE = EtcdError("OUT_OF_RANGE", "etcdserver: too large lease TTL")
AUTH_NOT_ENABLED = EtcdError("FAILED_PRECONDITION", "etcdserver: authentication is not enabled")
NO_LEADER = EtcdError("UNAVAILABLE", "etcdserver: no leader")
TIMEOUT = EtcdError("UNAVAILABLE", "etcdserver: request timed out")
NOT_SUPPORTED = EtcdError("UNIMPLEMENTED", "etcdserver: not supported by this store")

MAX_OPS_PER_TXN = 128
LEASE_TTL_MAX_S = 9_000_000_000
LEASE_TTL_MIN_S = 2  # etcd's minimum with its default election timeout (1.5 s, rounded up)
