"""The binary data path's wire format: frames for adds, their answers and reads (no I/O).

Why: Python gRPC costs ~0.2 ms and hundreds of microseconds of CPU per message; the
hot path (adds, their acknowledgements, range reads, LAC reads and long polls, and
from version 2 the writer's explicit LAC pushes) travels instead as length-prefixed
frames over plain TCP, the way BookKeeper's v2 protocol sits beside its protobuf one.
Everything else (bookie info) stays on gRPC, which is also the fallback for a bookie
that offers no binary address.

Versions: HELLO negotiates the highest version both sides speak (``VERSION``); a
version adds frame types and never changes a frame's layout, so every header carries
``FRAME_VERSION`` (the layout's version). Version 2 adds WRITE_LAC: a client sends it
only on a link negotiated at 2 or more, a bookie refuses it (protocol error) on a link
negotiated at 1.

Frame layout (every integer little-endian, fixed width)::

    header (18 bytes): magic u16 = 0x5342 | version u8 | type u8 | flags u16
                       | length u32 (body bytes that follow) | request_id u64
    body: ``length`` bytes, laid out per type (below)

A frame longer than the receiver's cap (``FRAME_BYTES_MAX`` unless configured), with a
wrong magic, an unknown version or type, or a body that does not parse exactly is a
protocol error: the receiver logs why and closes the connection (``FrameError``).
Request-level problems are never protocol errors: they are answered with a status
(``scriba.errors.Status``, the same codes as the gRPC path) like any answer.

Bodies (``s`` = u16-length-prefixed UTF-8 string, ``k`` = u16-length-prefixed bytes):

- HELLO (client first, request_id 0): version_min u8 | version_max u8. HELLO_OK answers:
  status u16 | version u8 (the highest both speak) | s message. No common version:
  status BAD_REQUEST, then the bookie closes.
- ADD (one message of runs): runs back to back, each ``ledger_id u64 | flags u32
  (1 = recovery add) | n u32 | k master_key | entry_ids n x i64 | sizes n x u32 |
  entries (sum(sizes) bytes, the packed entries concatenated)``. A single add is a run
  of one. ADD_ACK: answers back to back, each ``ledger_id u64 | status u16 | n u32 |
  s message | entry_ids n x i64``; the client matches answers by (ledger, entry) ids.
- READ_ENTRY: ledger_id u64 | entry_id i64 | flags u32 (1 = fence) | k master_key.
  Answer: status u16 | entry_id i64 | s message | entry (the rest).
- READ_RANGE: ledger_id u64 | first i64 | last i64 | max_entries u32 | max_bytes u64,
  then from version 3 ``| k master_key`` (a version-3 bookie takes both forms).
  Answered by RANGE_CHUNK frames with the request's id, the last one without flag
  MORE: status u16 | first_entry_id i64 | n u32 | s message | sizes n x u32 | entries.
- READ_LAC: ledger_id u64 | flags u32 (1 = fence, 2 = long poll) | previous_lac i64 |
  timeout_ms u32 | piggyback_entries_max u16 | k master_key. Answer: status u16 | lac i64 |
  last_entry_id i64 | fenced u8 | s message | last_entry_len u32 | last_entry |
  n u32 | sizes n x u32 | the piggybacked entries previous_lac + 1 ... (consecutive,
  none beyond lac) concatenated.
- WRITE_LAC (version 2): ledger_id u64 | lac i64 | flags u32 (1 = hint only: raised in
  memory, not journaled) | k master_key. Answer LAC_WRITTEN: status u16 | s message.
- ERROR (either side, request_id of the offending frame or 0): status u16 | s message;
  the sender closes the connection after it.

Entries and blobs are returned as slices of the frame (``memoryview`` when the caller
passes one): nothing here copies a payload.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Final, NamedTuple

__all__ = [
    "FLAG_MORE",
    "FRAME_BYTES_MAX",
    "FRAME_VERSION",
    "HEADER",
    "MAGIC",
    "VERSION",
    "AddAnswer",
    "FrameError",
    "FrameType",
    "Header",
    "LacAnswer",
    "RangeChunk",
    "Run",
    "decode_add",
    "decode_add_ack",
    "decode_entry_answer",
    "decode_error",
    "decode_header",
    "decode_hello",
    "decode_hello_ok",
    "decode_lac_answer",
    "decode_lac_written",
    "decode_range_chunk",
    "decode_read_entry",
    "decode_read_lac",
    "decode_read_range",
    "decode_write_lac",
    "encode_add_ack",
    "encode_entry_answer",
    "encode_error",
    "encode_frame",
    "encode_hello",
    "encode_hello_ok",
    "encode_lac_answer",
    "encode_lac_written",
    "encode_range_chunk",
    "encode_read_entry",
    "encode_read_lac",
    "encode_read_range",
    "encode_run",
    "encode_write_lac",
    "negotiate",
]

MAGIC: Final = 0x5342
VERSION: Final = 3  # the highest version this code speaks (negotiated by HELLO)
VERSION_MIN: Final = 1
FRAME_VERSION: Final = 1  # the frame layout's version, in every header (versions add frame types only)
WRITE_LAC_VERSION: Final = 2  # the first version with WRITE_LAC
KEYED_RANGE_VERSION: Final = 3  # the first version whose READ_RANGE carries the master key
FRAME_BYTES_MAX: Final = 65 * 1024 * 1024  # default cap on one frame's body
FLAG_MORE: Final = 1  # RANGE_CHUNK: more chunks of this request follow

HEADER: Final = struct.Struct("<HBBHIQ")
HEADER_SIZE: Final = HEADER.size

ADD_RECOVERY: Final = 1
READ_FENCE: Final = 1
LAC_LONG_POLL: Final = 2
LAC_HINT_ONLY: Final = 1  # WRITE_LAC: raise the LAC in memory, journal nothing

_RUN_HEAD: Final = struct.Struct("<QIIH")  # ledger_id, flags, n, key length
_ANSWER_HEAD: Final = struct.Struct("<QHIH")  # ledger_id, status, n, message length
_READ_ENTRY: Final = struct.Struct("<QqIH")
_ENTRY_ANSWER: Final = struct.Struct("<HqH")
_READ_RANGE: Final = struct.Struct("<QqqIQ")
_CHUNK_HEAD: Final = struct.Struct("<HqIH")
_READ_LAC: Final = struct.Struct("<QIqIHH")
_LAC_ANSWER: Final = struct.Struct("<HqqBH")
_WRITE_LAC: Final = struct.Struct("<QqIH")
_U32: Final = struct.Struct("<I")
_U16: Final = struct.Struct("<H")
_STATUS_MESSAGE: Final = struct.Struct("<HH")
_HELLO: Final = struct.Struct("<BB")
_HELLO_OK: Final = struct.Struct("<HBH")

Buffer = bytes | bytearray | memoryview


class FrameType(IntEnum):
    HELLO = 1
    HELLO_OK = 2
    ADD = 3
    ADD_ACK = 4
    READ_ENTRY = 5
    ENTRY = 6
    READ_RANGE = 7
    RANGE_CHUNK = 8
    READ_LAC = 9
    LAC = 10
    WRITE_LAC = 11
    LAC_WRITTEN = 12
    ERROR = 15


_TYPES: Final = frozenset(int(t) for t in FrameType)


class FrameError(Exception):
    """The peer broke the protocol (the connection is closed; never a request status)."""


class Header(NamedTuple):
    """A frame's header (a tuple: made once per frame on the hot path)."""

    version: int
    type: int
    flags: int
    length: int
    request_id: int


def encode_frame(ftype: int, request_id: int, body_parts: Sequence[Buffer], flags: int = 0,
                 version: int = FRAME_VERSION) -> list[Buffer]:
    """Header + body parts, ready for ``transport.writelines`` (or ``b"".join``)."""
    length = sum(map(len, body_parts))
    return [HEADER.pack(MAGIC, version, ftype, flags, length, request_id), *body_parts]


def decode_header(buf: Buffer, offset: int = 0, *, frame_bytes_max: int = FRAME_BYTES_MAX) -> Header:
    """The header at ``offset`` (``HEADER_SIZE`` bytes must be there); ``FrameError``
    when it is not one this code accepts."""
    magic, version, ftype, flags, length, request_id = HEADER.unpack_from(buf, offset)
    if magic != MAGIC:
        raise FrameError(f"bad magic 0x{magic:04x}")
    if version != FRAME_VERSION:
        raise FrameError(f"unsupported version {version}")
    if ftype not in _TYPES:
        raise FrameError(f"unknown frame type {ftype}")
    if length > frame_bytes_max:
        raise FrameError(f"frame of {length} bytes exceeds the cap of {frame_bytes_max}")
    return Header(version, ftype, flags, length, request_id)


class _Reader:
    """Bounds-checked sequential reads of one body (``FrameError`` past its end)."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: Buffer) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)

    def take(self, st: struct.Struct) -> tuple[int, ...]:
        pos = self.pos
        if pos + st.size > self.end:
            raise FrameError(f"body truncated at byte {pos} ({self.end} bytes)")
        self.pos = pos + st.size
        return st.unpack_from(self.buf, pos)

    def bytes_(self, n: int) -> Buffer:
        pos = self.pos
        if n < 0 or pos + n > self.end:
            raise FrameError(f"body truncated at byte {pos}: {n} more bytes announced, {self.end - pos} left")
        self.pos = pos + n
        return self.buf[pos : pos + n]

    def ints(self, fmt: str, n: int, width: int) -> tuple[int, ...]:
        raw = self.bytes_(n * width)
        return struct.unpack(f"<{n}{fmt}", raw) if n else ()

    def text(self, n: int) -> str:
        return bytes(self.bytes_(n)).decode("utf-8", "replace")

    def rest(self) -> Buffer:
        pos = self.pos
        self.pos = self.end
        return self.buf[pos : self.end]

    def done(self) -> None:
        if self.pos != self.end:
            raise FrameError(f"{self.end - self.pos} stray bytes after the body")


def _s(text: str) -> tuple[bytes, int]:
    raw = text.encode()[:0xFFFF]
    return raw, len(raw)


# --- HELLO ------------------------------------------------------------------------------
def encode_hello(version_min: int = VERSION_MIN, version_max: int = VERSION) -> list[Buffer]:
    return encode_frame(FrameType.HELLO, 0, [_HELLO.pack(version_min, version_max)])


def decode_hello(body: Buffer) -> tuple[int, int]:
    r = _Reader(body)
    lo, hi = r.take(_HELLO)
    r.done()
    return lo, hi


def negotiate(version_min: int, version_max: int) -> int | None:
    """The highest version both sides speak, or None."""
    best = min(version_max, VERSION)
    return best if best >= max(version_min, VERSION_MIN) else None


def encode_hello_ok(status: int, version: int, message: str = "") -> list[Buffer]:
    raw, n = _s(message)
    return encode_frame(FrameType.HELLO_OK, 0, [_HELLO_OK.pack(status, version, n), raw])


def decode_hello_ok(body: Buffer) -> tuple[int, int, str]:
    r = _Reader(body)
    status, version, n = r.take(_HELLO_OK)
    message = r.text(n)
    r.done()
    return status, version, message


# --- ERROR ------------------------------------------------------------------------------
def encode_error(request_id: int, status: int, message: str) -> list[Buffer]:
    return _encode_status(FrameType.ERROR, request_id, status, message)


def decode_error(body: Buffer) -> tuple[int, str]:
    return _decode_status(body)


def _encode_status(ftype: int, request_id: int, status: int, message: str) -> list[Buffer]:
    """A body of ``status u16 | s message`` (ERROR, LAC_WRITTEN)."""
    raw, n = _s(message)
    return encode_frame(ftype, request_id, [_STATUS_MESSAGE.pack(status, n), raw])


def _decode_status(body: Buffer) -> tuple[int, str]:
    r = _Reader(body)
    status, n = r.take(_STATUS_MESSAGE)
    message = r.text(n)
    r.done()
    return status, message


# --- ADD / ADD_ACK ----------------------------------------------------------------------
class Run:
    """One decoded run (the attribute names of ``AddRun`` in scriba.proto, so the
    bookie's decoding serves both wire forms)."""

    __slots__ = ("entries", "entry_ids", "flags", "ledger_id", "master_key", "sizes")

    def __init__(self, ledger_id: int, flags: int, master_key: bytes, entry_ids: Sequence[int],
                 sizes: Sequence[int], entries: bytes) -> None:
        self.ledger_id = ledger_id
        self.flags = flags
        self.master_key = master_key
        self.entry_ids = entry_ids
        self.sizes = sizes
        self.entries = entries


def encode_run(ledger_id: int, flags: int, master_key: bytes, entry_ids: Sequence[int],
               entries: Sequence[bytes], parts: list[Buffer]) -> None:
    """Append one run of an ADD body to ``parts`` (the entries themselves, not copied)."""
    n = len(entry_ids)
    parts.append(_RUN_HEAD.pack(ledger_id, flags, n, len(master_key)))
    parts.append(master_key)
    parts.append(struct.pack(f"<{n}q{n}I", *entry_ids, *map(len, entries)))
    parts += entries


def decode_add(body: Buffer) -> list[Run]:
    """The runs of an ADD body. Their ``entries`` are ``bytes`` (one copy of each run's
    blob out of the frame: storage keeps entries past the frame's life)."""
    r = _Reader(body)
    runs: list[Run] = []
    while r.pos < r.end:
        ledger_id, flags, n, key_len = r.take(_RUN_HEAD)
        key = bytes(r.bytes_(key_len))
        if n * 12 > r.end - r.pos:
            raise FrameError(f"run of ledger {ledger_id}: {n} adds announced, {r.end - r.pos} bytes left")
        ids = r.ints("q", n, 8)
        sizes = r.ints("I", n, 4)
        blob = bytes(r.bytes_(sum(sizes)))
        runs.append(Run(ledger_id, flags, key, ids, sizes, blob))
    return runs


class AddAnswer(NamedTuple):
    """Adds of one ledger answered alike (the attribute names of ``AddRunResponse``)."""

    ledger_id: int
    entry_ids: Sequence[int]
    status: int
    message: str = ""


def encode_add_ack(request_id: int, answers: Sequence[tuple[int, Sequence[int], int, str]]) -> list[Buffer]:
    """An ADD_ACK frame of ``(ledger_id, entry_ids, status, message)`` answers."""
    parts: list[Buffer] = []
    for ledger_id, ids, status, message in answers:
        raw, m = _s(message)
        n = len(ids)
        parts.append(_ANSWER_HEAD.pack(ledger_id, status, n, m))
        parts.append(raw)
        parts.append(struct.pack(f"<{n}q", *ids))
    return encode_frame(FrameType.ADD_ACK, request_id, parts)


def decode_add_ack(body: Buffer) -> list[AddAnswer]:
    """The answers of an ADD_ACK body (read in place: one per ledger, on every add's
    path, so without a ``_Reader``; every length is checked before it is read)."""
    answers: list[AddAnswer] = []
    pos, end = 0, len(body)  # type: ignore[arg-type]
    head = _ANSWER_HEAD.size
    while pos < end:
        if pos + head > end:
            raise FrameError(f"body truncated at byte {pos} ({end} bytes)")
        ledger_id, status, n, m = _ANSWER_HEAD.unpack_from(body, pos)
        pos += head
        stop = pos + m + 8 * n
        if stop > end:
            raise FrameError(f"answer of ledger {ledger_id}: {m} message bytes and {n} ids announced, "
                             f"{end - pos} bytes left")
        message = bytes(body[pos : pos + m]).decode("utf-8", "replace") if m else ""  # type: ignore[index]
        ids = list(struct.unpack_from(f"<{n}q", body, pos + m)) if n else []
        answers.append(AddAnswer(ledger_id, ids, status, message))
        pos = stop
    return answers


# --- READ_ENTRY / ENTRY -----------------------------------------------------------------
def encode_read_entry(request_id: int, ledger_id: int, entry_id: int, flags: int, master_key: bytes) -> list[Buffer]:
    return encode_frame(FrameType.READ_ENTRY, request_id,
                        [_READ_ENTRY.pack(ledger_id, entry_id, flags, len(master_key)), master_key])


def decode_read_entry(body: Buffer) -> tuple[int, int, int, bytes]:
    """``(ledger_id, entry_id, flags, master_key)``."""
    (ledger_id, entry_id, flags), key = _keyed(body, _READ_ENTRY)
    return ledger_id, entry_id, flags, key


def _keyed(body: Buffer, head: struct.Struct) -> tuple[tuple[int, ...], bytes]:
    """A body that is ``head`` (its last field the key's length) then the key: the
    head's other fields and the key."""
    r = _Reader(body)
    *fields, k = r.take(head)
    key = bytes(r.bytes_(k))
    r.done()
    return tuple(fields), key


def encode_entry_answer(request_id: int, status: int, entry_id: int, message: str, entry: Buffer) -> list[Buffer]:
    raw, m = _s(message)
    return encode_frame(FrameType.ENTRY, request_id, [_ENTRY_ANSWER.pack(status, entry_id, m), raw, entry])


def decode_entry_answer(body: Buffer) -> tuple[int, int, str, Buffer]:
    """``(status, entry_id, message, entry)``."""
    r = _Reader(body)
    status, entry_id, m = r.take(_ENTRY_ANSWER)
    message = r.text(m)
    return status, entry_id, message, r.rest()


# --- READ_RANGE / RANGE_CHUNK -----------------------------------------------------------
def encode_read_range(request_id: int, ledger_id: int, first: int, last: int, max_entries: int,
                      max_bytes: int, master_key: bytes | None = None) -> list[Buffer]:
    """``master_key`` None: the form before version 3 (no key)."""
    head = _READ_RANGE.pack(ledger_id, first, last, max_entries, max_bytes)
    if master_key is None:
        return encode_frame(FrameType.READ_RANGE, request_id, [head])
    return encode_frame(FrameType.READ_RANGE, request_id, [head, _U16.pack(len(master_key)), master_key])


def decode_read_range(body: Buffer) -> tuple[int, int, int, int, int, bytes]:
    """``(ledger_id, first, last, max_entries, max_bytes, master_key)`` (the key b"" in
    the form before version 3)."""
    r = _Reader(body)
    ledger_id, first, last, max_entries, max_bytes = r.take(_READ_RANGE)
    key = b""
    if r.end > r.pos:
        (k,) = r.take(_U16)
        key = bytes(r.bytes_(k))
    r.done()
    return ledger_id, first, last, max_entries, max_bytes, key


@dataclass(frozen=True, slots=True)
class RangeChunk:
    status: int
    first_entry_id: int
    sizes: Sequence[int]
    message: str
    blob: Buffer


def encode_range_chunk(request_id: int, status: int, first_entry_id: int, entries: Sequence[Buffer],
                       message: str = "", *, more: bool) -> list[Buffer]:
    raw, m = _s(message)
    n = len(entries)
    parts: list[Buffer] = [_CHUNK_HEAD.pack(status, first_entry_id, n, m), raw,
                           struct.pack(f"<{n}I", *map(len, entries)), *entries]
    return encode_frame(FrameType.RANGE_CHUNK, request_id, parts, FLAG_MORE if more else 0)


def decode_range_chunk(body: Buffer) -> RangeChunk:
    r = _Reader(body)
    status, first, n, m = r.take(_CHUNK_HEAD)
    message = r.text(m)
    if n * 4 > r.end - r.pos:
        raise FrameError(f"range chunk: {n} entries announced, {r.end - r.pos} bytes left")
    sizes = r.ints("I", n, 4)
    blob = r.rest()
    if sum(sizes) != len(blob):
        raise FrameError(f"range chunk: sizes add up to {sum(sizes)} bytes, entries hold {len(blob)}")
    return RangeChunk(status, first, sizes, message, blob)


# --- READ_LAC / LAC ---------------------------------------------------------------------
def encode_read_lac(request_id: int, ledger_id: int, flags: int, previous_lac: int, timeout_ms: int,
                    master_key: bytes, piggyback_entries_max: int = 0) -> list[Buffer]:
    return encode_frame(FrameType.READ_LAC, request_id, [
        _READ_LAC.pack(ledger_id, flags, previous_lac, timeout_ms, piggyback_entries_max, len(master_key)),
        master_key,
    ])


def decode_read_lac(body: Buffer) -> tuple[int, int, int, int, int, bytes]:
    """``(ledger_id, flags, previous_lac, timeout_ms, piggyback_entries_max, master_key)``."""
    r = _Reader(body)
    ledger_id, flags, previous_lac, timeout_ms, entries_max, k = r.take(_READ_LAC)
    key = bytes(r.bytes_(k))
    r.done()
    return ledger_id, flags, previous_lac, timeout_ms, entries_max, key


@dataclass(frozen=True, slots=True)
class LacAnswer:
    status: int
    lac: int
    last_entry_id: int
    fenced: bool
    message: str
    last_entry: Buffer
    piggybacked_entries: tuple[Buffer, ...]


def encode_lac_answer(request_id: int, status: int, lac: int, last_entry_id: int, fenced: bool, message: str,
                      last_entry: Buffer, piggybacked_entries: Sequence[Buffer] = ()) -> list[Buffer]:
    raw, m = _s(message)
    n = len(piggybacked_entries)
    return encode_frame(FrameType.LAC, request_id, [
        _LAC_ANSWER.pack(status, lac, last_entry_id, 1 if fenced else 0, m), raw,
        _U32.pack(len(last_entry)), last_entry,
        _U32.pack(n), struct.pack(f"<{n}I", *map(len, piggybacked_entries)), *piggybacked_entries,
    ])


def decode_lac_answer(body: Buffer) -> LacAnswer:
    r = _Reader(body)
    status, lac, last_entry_id, fenced, m = r.take(_LAC_ANSWER)
    message = r.text(m)
    (n,) = r.take(_U32)
    last_entry = r.bytes_(n)
    (count,) = r.take(_U32)
    if count * 4 > r.end - r.pos:
        raise FrameError(f"lac answer: {count} piggybacked entries announced, {r.end - r.pos} bytes left")
    sizes = r.ints("I", count, 4)
    blob = r.rest()
    if sum(sizes) != len(blob):
        raise FrameError(f"lac answer: sizes add up to {sum(sizes)} bytes, entries hold {len(blob)}")
    entries: list[Buffer] = []
    start = 0
    for size in sizes:
        entries.append(blob[start:start + size])
        start += size
    return LacAnswer(status, lac, last_entry_id, bool(fenced), message, last_entry, tuple(entries))


# --- WRITE_LAC / LAC_WRITTEN (version 2) --------------------------------------------------
def encode_write_lac(request_id: int, ledger_id: int, lac: int, flags: int, master_key: bytes) -> list[Buffer]:
    return encode_frame(FrameType.WRITE_LAC, request_id, [_WRITE_LAC.pack(ledger_id, lac, flags, len(master_key)),
                                                          master_key])


def decode_write_lac(body: Buffer) -> tuple[int, int, int, bytes]:
    """``(ledger_id, lac, flags, master_key)``."""
    (ledger_id, lac, flags), key = _keyed(body, _WRITE_LAC)
    return ledger_id, lac, flags, key


def encode_lac_written(request_id: int, status: int, message: str = "") -> list[Buffer]:
    return _encode_status(FrameType.LAC_WRITTEN, request_id, status, message)


def decode_lac_written(body: Buffer) -> tuple[int, str]:
    """``(status, message)``."""
    return _decode_status(body)


class FrameReader:
    """Reassembles frames from a byte stream: ``feed(data)`` returns the frames
    completed by ``data``, each as its header and body. A body is a ``memoryview`` of an
    immutable ``bytes`` (a received chunk, or one copy of a frame that spanned chunks),
    so it stays valid. ``FrameError`` as soon as a bad header arrives (an oversized
    frame is refused from its header, before its body is buffered)."""

    __slots__ = ("_buf", "_frame_bytes_max", "_need")

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX) -> None:
        self._frame_bytes_max = frame_bytes_max
        self._buf = bytearray()
        self._need = HEADER_SIZE  # bytes ``_buf`` must hold before it is parsed again

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[tuple[Header, memoryview]]:
        out: list[tuple[Header, memoryview]] = []
        if self._buf:
            self._buf += data
            if len(self._buf) < self._need:
                return out
            data = bytes(self._buf)
            self._buf = bytearray()
        view = memoryview(data)
        pos, end = 0, len(data)
        need = HEADER_SIZE
        while end - pos >= HEADER_SIZE:
            header = decode_header(data, pos, frame_bytes_max=self._frame_bytes_max)
            stop = pos + HEADER_SIZE + header.length
            if stop > end:
                need = HEADER_SIZE + header.length
                break
            out.append((header, view[pos + HEADER_SIZE : stop]))
            pos = stop
        if pos < end:
            self._buf = bytearray(view[pos:])
            self._need = need
        return out
