"""The wire format of the store's commands, queries and results (inside RSM commands).

A command or query is one op byte, for timed ops the proposer's wall clock
(``now_ms``, 8 bytes, big-endian), then an etcd protobuf message from ``aetcd.rpc``
(so requests reach the state machine exactly as the client sent them). A result is
``OK`` + the etcd response message, or ``ERR`` + ``CODE\\nmessage`` (an
:class:`~scriba.examples.kvstore.errors.EtcdError`).
"""

from __future__ import annotations

import enum
import struct
from typing import Any

from scriba.examples.kvstore.errors import EtcdError


class Op(enum.IntEnum):
    # commands (apply)
    PUT = 1
    DELETE_RANGE = 2
    TXN = 3
    COMPACT = 4
    LEASE_GRANT = 5  # timed
    LEASE_REVOKE = 6
    LEASE_KEEPALIVE = 7  # timed
    LEASE_EXPIRE = 8  # the leader's decision: payload = lease id, the deadline it saw
    # queries (query)
    RANGE = 20
    LEASE_TTL = 21  # timed
    LEASE_LIST = 22
    STATUS = 23
    LEASES_EXPIRED = 24  # timed: the leases whose deadline passed


TIMED = frozenset({Op.LEASE_GRANT, Op.LEASE_KEEPALIVE, Op.LEASE_TTL, Op.LEASES_EXPIRED})
OK, ERR = b"\x00", b"\x01"
_NOW = struct.Struct(">q")
_EXPIRE = struct.Struct(">qq")


def encode(op: Op, message: Any = None, now_ms: int = 0) -> bytes:
    body = message.SerializeToString() if message is not None else b""
    return bytes([op]) + (_NOW.pack(now_ms) if op in TIMED else b"") + body


def decode(data: bytes) -> tuple[Op, int, bytes]:
    """(op, now_ms, message bytes); raises ValueError on an unknown op."""
    op = Op(data[0])
    if op in TIMED:
        return op, _NOW.unpack_from(data, 1)[0], data[1 + _NOW.size:]
    return op, 0, data[1:]


def encode_expire(lease_id: int, deadline_ms: int) -> bytes:
    return bytes([Op.LEASE_EXPIRE]) + _EXPIRE.pack(lease_id, deadline_ms)


def decode_expire(body: bytes) -> tuple[int, int]:
    lease_id, deadline_ms = _EXPIRE.unpack(body)
    return lease_id, deadline_ms


def ok(message: Any) -> bytes:
    return OK + message.SerializeToString()


def err(error: EtcdError) -> bytes:
    return ERR + f"{error.code}\n{error.message}".encode()


def parse_result(data: bytes, message_type: Any) -> Any:
    """The response message, or raises the :class:`EtcdError` the result carries."""
    if data[:1] == ERR:
        code, _, message = data[1:].decode().partition("\n")
        raise EtcdError(code, message)
    message = message_type()
    message.ParseFromString(data[1:])
    return message
