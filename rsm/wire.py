"""The replica service's wire format (I/O-free): length-prefixed frames over TCP.

Why a small TCP protocol and not gRPC: the messages are four (propose, read, read
index, open session) plus a status, the payloads are opaque bytes, and a ``.proto``
would live in the shared core's ``scriba/proto`` (regenerated, checked and edited by
every layer); a frame codec of ~100 lines keeps the RSM self-contained and its
per-request cost low (one struct unpack, no protobuf objects).

    frame     = u32 length | payload
    request   = u64 request_id | u8 op | u8 flags | body
    response  = u64 request_id | u8 status (0 ok, 1 error) | body

Bodies: PROPOSE ``u64 session | u64 seq | u64 acked_below | command`` -> ``u8 n | position
text (n) | result``; READ ``u8 consistency | u8 n | after position (n) | request`` ->
``result``; READ_MANY ``u32 n | n * (u32 length | READ body)`` -> ``u32 n | n * (u8 status |
u32 length | result or error body)`` (the reads of one frame share one read index: one
leadership confirmation); READ_INDEX -> position text; OPEN_SESSION -> ``u64 id | position
text``; STATUS -> JSON; TRANSFER ``replica id (utf-8)`` -> empty (the leader hands leadership
to that replica and answers once it leads; a follower answers not-leader). An error body is
JSON ``{type, message, leader_id, leader_address}``
and becomes the same exception type on the caller's side (``error_from``).
Flag ``FORWARDED``: a follower passed this on; the receiver must not forward again.
"""

from __future__ import annotations

import enum
import json
import struct
from typing import Final

from scriba import errors
from scriba.errors import BadRequestError, RsmNotLeaderError, ScribaError
from scriba.rsm.membership import check_replica_id
from scriba.stream import Position

FRAME_BYTES_MAX: Final = 8 * 1024 * 1024
LENGTH = struct.Struct(">I")
REQUEST = struct.Struct(">QBB")
RESPONSE = struct.Struct(">QB")
PROPOSE = struct.Struct(">QQQ")
COUNT = struct.Struct(">I")
ITEM = struct.Struct(">I")
ANSWER = struct.Struct(">BI")
READS_PER_FRAME_MAX: Final = 4096
FORWARDED: Final = 1
CONSISTENCY_CODES: Final = {"linearizable": 0, "sequential": 1, "after": 2}
CONSISTENCY_NAMES: Final = {v: k for k, v in CONSISTENCY_CODES.items()}


class Op(enum.IntEnum):
    PROPOSE = 1
    READ = 2
    READ_INDEX = 3
    OPEN_SESSION = 4
    STATUS = 5
    READ_MANY = 6
    TRANSFER = 7


ADMIN_OPS: Final = frozenset({Op.TRANSFER})  # under mutual TLS: admin certificates only


def frame(payload: bytes) -> bytes:
    if len(payload) > FRAME_BYTES_MAX:
        raise BadRequestError(f"frame of {len(payload)} bytes exceeds {FRAME_BYTES_MAX}")
    return LENGTH.pack(len(payload)) + payload


class FrameReader:
    """Reassembles frames from a byte stream: ``feed(data)`` returns the payloads of the
    frames ``data`` completes, each a ``bytes``. ``BadRequestError`` as soon as a length over
    ``frame_bytes_max`` arrives (before its body is buffered); the connection is then to be
    dropped. A frame split over many reads is joined once, when complete."""

    __slots__ = ("_buf", "_frame_bytes_max", "_need")

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX) -> None:
        self._frame_bytes_max = frame_bytes_max
        self._buf = bytearray()
        self._need = LENGTH.size  # bytes ``_buf`` must hold before it is parsed again

    def feed(self, data: bytes) -> list[bytes]:
        if self._buf:
            self._buf += data
            if len(self._buf) < self._need:
                return []
            data = bytes(self._buf)
            self._buf = bytearray()
        out: list[bytes] = []
        pos, end, need = 0, len(data), LENGTH.size
        while end - pos >= LENGTH.size:
            (length,) = LENGTH.unpack_from(data, pos)
            if length > self._frame_bytes_max:
                raise BadRequestError(f"frame of {length} bytes exceeds {self._frame_bytes_max}")
            stop = pos + LENGTH.size + length
            if stop > end:
                need = LENGTH.size + length
                break
            out.append(data[pos + LENGTH.size:stop])
            pos = stop
        if pos < end:
            self._buf = bytearray(data[pos:])
            self._need = need
        return out


def request(request_id: int, op: Op, body: bytes, flags: int = 0) -> bytes:
    return frame(REQUEST.pack(request_id, op, flags) + body)


def parse_request(payload: bytes) -> tuple[int, Op, int, bytes]:
    if len(payload) < REQUEST.size:
        raise BadRequestError(f"request of {len(payload)} bytes is shorter than its header")
    request_id, op, flags = REQUEST.unpack_from(payload)
    try:
        return request_id, Op(op), flags, payload[REQUEST.size:]
    except ValueError:
        raise BadRequestError(f"unknown op {op}") from None


def ok(request_id: int, body: bytes) -> bytes:
    return frame(RESPONSE.pack(request_id, 0) + body)


def error(request_id: int, exc: ScribaError) -> bytes:
    return frame(RESPONSE.pack(request_id, 1) + error_body(exc))


def error_body(exc: ScribaError) -> bytes:
    doc = {"type": type(exc).__name__, "message": str(exc),
           "leader_id": getattr(exc, "leader_id", None), "leader_address": getattr(exc, "leader_address", None)}
    return json.dumps(doc).encode()


def parse_response(payload: bytes) -> tuple[int, bool, bytes]:
    if len(payload) < RESPONSE.size:
        raise BadRequestError(f"response of {len(payload)} bytes is shorter than its header")
    request_id, status = RESPONSE.unpack_from(payload)
    return request_id, status == 0, payload[RESPONSE.size:]


def error_from(body: bytes) -> ScribaError:
    try:
        doc = json.loads(body)
        name, message = str(doc["type"]), str(doc["message"])
    except (ValueError, KeyError, TypeError):
        return errors.InternalError(f"undecodable error response {body[:80]!r}")
    cls = getattr(errors, name, None)
    if cls is RsmNotLeaderError:
        return RsmNotLeaderError(message, leader_id=doc.get("leader_id"), leader_address=doc.get("leader_address"))
    if isinstance(cls, type) and issubclass(cls, ScribaError):
        try:
            return cls(message)
        except TypeError:
            pass
    return errors.InternalError(f"{name}: {message}")


# --- bodies ------------------------------------------------------------------------------
def _text(position: Position | None) -> bytes:
    raw = str(position).encode() if position is not None else b""
    return bytes([len(raw)]) + raw


def _untext(body: bytes) -> tuple[Position | None, bytes]:
    if not body:
        raise BadRequestError("body too short for a position")
    n = body[0]
    if len(body) < 1 + n:
        raise BadRequestError("body too short for its position")
    raw = body[1:1 + n].decode()
    return (Position.parse(raw) if raw else None), body[1 + n:]


def propose_body(session_id: int, seq: int, acked_below: int, command: bytes) -> bytes:
    return PROPOSE.pack(session_id, seq, acked_below) + command


def parse_propose(body: bytes) -> tuple[int, int, int, bytes]:
    if len(body) < PROPOSE.size:
        raise BadRequestError("propose body too short")
    sid, seq, acked = PROPOSE.unpack_from(body)
    return sid, seq, acked, body[PROPOSE.size:]


def committed_body(position: Position, result: bytes) -> bytes:
    return _text(position) + result


def parse_committed(body: bytes) -> tuple[Position, bytes]:
    position, rest = _untext(body)
    if position is None:
        raise BadRequestError("commit answer without a position")
    return position, rest


def read_body(consistency: str, after: Position | None, request_bytes: bytes) -> bytes:
    code = CONSISTENCY_CODES.get(consistency)
    if code is None:
        raise errors.BadConsistencyError(f"consistency {consistency!r}: one of {sorted(CONSISTENCY_CODES)}")
    return bytes([code]) + _text(after) + request_bytes


def parse_read(body: bytes) -> tuple[str, Position | None, bytes]:
    if not body or body[0] not in CONSISTENCY_NAMES:
        raise errors.BadConsistencyError(f"unknown consistency code {body[:1]!r}")
    if len(body) > 1 and body[1] == 0:  # no position: the common case, without the slicing
        return CONSISTENCY_NAMES[body[0]], None, body[2:]
    after, rest = _untext(body[1:])
    return CONSISTENCY_NAMES[body[0]], after, rest


def position_body(position: Position | None) -> bytes:
    return _text(position)


def parse_position(body: bytes) -> Position | None:
    return _untext(body)[0]


def read_many_body(reads: list[bytes]) -> bytes:
    """Several READ bodies (``read_body``) in one frame."""
    return COUNT.pack(len(reads)) + b"".join(ITEM.pack(len(r)) + r for r in reads)


def _items(body: bytes, what: str) -> tuple[int, int]:
    if len(body) < COUNT.size:
        raise BadRequestError(f"{what} body too short for its count")
    (n,) = COUNT.unpack_from(body)
    if n > READS_PER_FRAME_MAX:
        raise BadRequestError(f"{what} of {n} reads exceeds {READS_PER_FRAME_MAX} per frame")
    return n, COUNT.size


def parse_read_many(body: bytes) -> list[tuple[str, Position | None, bytes]]:
    n, at = _items(body, "READ_MANY")
    reads = []
    unpack, size, total = ITEM.unpack_from, ITEM.size, len(body)
    for _ in range(n):
        if total < at + size:
            raise BadRequestError("READ_MANY body too short for its reads")
        (length,) = unpack(body, at)
        at += size
        if total < at + length:
            raise BadRequestError("READ_MANY body too short for its reads")
        reads.append(parse_read(body[at:at + length]))
        at += length
    if at != total:
        raise BadRequestError(f"READ_MANY body has {total - at} bytes after its reads")
    return reads


def read_many_answer(answers: list[tuple[bool, bytes]]) -> bytes:
    """Per read: ok and its result, or not ok and an error body (``error_body``)."""
    return COUNT.pack(len(answers)) + b"".join(ANSWER.pack(0 if ok_ else 1, len(out)) + out for ok_, out in answers)


def parse_read_many_answer(body: bytes, expected: int) -> list[tuple[bool, bytes]]:
    n, at = _items(body, "READ_MANY answer")
    if n != expected:
        raise BadRequestError(f"READ_MANY answer has {n} results for {expected} reads")
    answers = []
    unpack, size, total = ANSWER.unpack_from, ANSWER.size, len(body)
    for _ in range(n):
        if total < at + size:
            raise BadRequestError("READ_MANY answer too short for its results")
        status, length = unpack(body, at)
        at += size
        if total < at + length:
            raise BadRequestError("READ_MANY answer too short for its results")
        answers.append((status == 0, body[at:at + length]))
        at += length
    return answers


def transfer_body(replica_id: str) -> bytes:
    return replica_id.encode()


def parse_transfer(body: bytes) -> str:
    """The target replica id of a TRANSFER (checked like every replica id)."""
    try:
        return check_replica_id(body.decode())
    except (UnicodeDecodeError, errors.ConfigError) as exc:
        raise BadRequestError(f"transfer target: {exc}") from None
