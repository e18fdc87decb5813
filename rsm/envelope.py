"""The records an RSM writes to its command stream, and their encoding.

Every stream record is one :class:`Envelope`:

- ``COMMAND``: a user command, optionally under a client session (``session_id``,
  ``seq``, ``acked_below``: the client has every answer below this sequence number);
- ``BARRIER``: written for linearizable reads; applies nothing, moves the applied position;
- ``SESSION_OPEN``: opens a client session; its id is the session table's next id.

Each carries the writer's fencing ``token`` (non-decreasing along the stream: a new
writer fences the previous one's segment before it writes) and the leader's clock
``time_ms`` (the replicated clock: replicas take the maximum seen, never their own).

Layout: ``version u8 | kind u8 | token u64 | time_ms u64 | session_id u64 | seq u64 |
acked_below u64 | payload`` (big-endian).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Final

from scriba.errors import RsmError

FORMAT_VERSION: Final = 1
_HEADER = struct.Struct(">BBQQQQQ")
HEADER_BYTES: Final = _HEADER.size
NO_SESSION: Final = 0


class Kind(enum.IntEnum):
    COMMAND = 1
    BARRIER = 2
    SESSION_OPEN = 3


class EnvelopeCorruptError(RsmError):
    """A stream record is not an RSM envelope (bad length, version or kind)."""


@dataclass(frozen=True, slots=True)
class Envelope:
    kind: Kind
    token: int
    time_ms: int
    payload: bytes = b""
    session_id: int = NO_SESSION
    seq: int = 0
    acked_below: int = 0

    def encode(self) -> bytes:
        return _HEADER.pack(FORMAT_VERSION, self.kind, self.token, self.time_ms, self.session_id,
                            self.seq, self.acked_below) + self.payload

    @classmethod
    def decode(cls, data: bytes) -> Envelope:
        if len(data) < HEADER_BYTES:
            raise EnvelopeCorruptError(f"rsm record of {len(data)} bytes is shorter than its {HEADER_BYTES}-byte header")
        version, kind, token, time_ms, session_id, seq, acked_below = _HEADER.unpack_from(data)
        if version != FORMAT_VERSION:
            raise EnvelopeCorruptError(f"rsm record format version {version} (this code reads {FORMAT_VERSION})")
        try:
            kind_value = Kind(kind)
        except ValueError:
            raise EnvelopeCorruptError(f"rsm record kind {kind} is unknown") from None
        return cls(kind_value, token, time_ms, bytes(data[HEADER_BYTES:]), session_id, seq, acked_below)

    @property
    def size_bytes(self) -> int:
        return HEADER_BYTES + len(self.payload)
