"""Record sets: many small records packed into one ledger entry.

A stream writer packs the records queued together (or given to ``append_many``)
into one entry, up to ``record_set_bytes_max``, so small records do not each pay
a ledger entry. Readers never see record sets, only records.

Layout (little-endian, format version 1)::

    header  magic "SR" | version u8 | flags u8 (0) | count u32
            | records_before u64 | bytes_before u64 | publish_time_ms u64
    record  payload_len u32 | header_count u16
            | header_count x (key_len u16 | key utf-8 | value_len u32 | value)
            | payload

``records_before`` / ``bytes_before`` count the records and entry bytes of the
same segment before this entry (DistributedLog's position-within-segment): a
writer that recovers a crashed writer's segment reads only its last entry to learn
the segment's record count and size. ``publish_time_ms`` is never below the
previous set's in the stream (the writer keeps it monotonic).

Decoding is checked: a short, long or inconsistent buffer, or a newer format
version, raises :class:`~scriba.errors.RecordSetCorruptError`; nothing is guessed.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from scriba.errors import ConfigError, RecordSetCorruptError

MAGIC: Final = b"SR"
FORMAT_VERSION: Final = 1
_HEADER = struct.Struct("<2sBBIQQQ")
HEADER_BYTES: Final = _HEADER.size  # 32
_RECORD = struct.Struct("<IH")
RECORD_OVERHEAD_BYTES: Final = _RECORD.size  # 6
_KEY = struct.Struct("<H")
_VALUE = struct.Struct("<I")
HEADER_OVERHEAD_BYTES: Final = _KEY.size + _VALUE.size  # 6 per header
HEADERS_MAX: Final = 64
HEADER_KEY_BYTES_MAX: Final = 255
RECORDS_PER_SET_MAX: Final = 1 << 20

NO_HEADERS: Final[Mapping[str, bytes]] = MappingProxyType({})

RecordInput = tuple[bytes, Mapping[str, bytes]]


@dataclass(frozen=True, slots=True)
class RecordSetHeader:
    count: int
    records_before: int
    bytes_before: int
    publish_time_ms: int


def check_headers(headers: Mapping[str, bytes] | None) -> Mapping[str, bytes]:
    """Validate record headers (str keys, bytes values, bounded); returns them read-only."""
    if not headers:
        return NO_HEADERS
    if not isinstance(headers, Mapping):
        raise ConfigError(f"record headers must be a mapping of str to bytes, got {type(headers).__name__}")
    if len(headers) > HEADERS_MAX:
        raise ConfigError(f"record has {len(headers)} headers; at most {HEADERS_MAX}")
    for key, value in headers.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"record header key must be a non-empty str, got {key!r}")
        if len(key.encode()) > HEADER_KEY_BYTES_MAX:
            raise ConfigError(f"record header key {key[:40]!r}...: over {HEADER_KEY_BYTES_MAX} bytes")
        if not isinstance(value, bytes | bytearray):
            raise ConfigError(f"record header {key!r}: value must be bytes, got {type(value).__name__}")
    return MappingProxyType({k: bytes(v) for k, v in headers.items()})


def encoded_size(payload: bytes, headers: Mapping[str, bytes]) -> int:
    """Bytes one record takes inside a record set."""
    size = RECORD_OVERHEAD_BYTES + len(payload)
    for key, value in headers.items():
        size += HEADER_OVERHEAD_BYTES + len(key.encode()) + len(value)
    return size


def encode(
    records: Sequence[tuple[Any, ...]], *, records_before: int, bytes_before: int, publish_time_ms: int
) -> bytes:
    """One record set (see the module docstring) of ``records``: tuples whose first two
    items are a payload and its headers (a ``RecordInput``, or a writer's queue item
    with more after them). ``records`` must not be empty."""
    if not records or len(records) > RECORDS_PER_SET_MAX:
        raise ConfigError(f"a record set holds 1..{RECORDS_PER_SET_MAX} records, got {len(records)}")
    parts: list[bytes] = [
        _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(records), records_before, bytes_before, publish_time_ms)
    ]
    append = parts.append
    pack_record = _RECORD.pack
    for item in records:
        payload = item[0]
        headers = item[1]
        if not headers:
            append(pack_record(len(payload), 0))
            append(payload)
            continue
        append(pack_record(len(payload), len(headers)))
        for key, value in headers.items():
            raw_key = key.encode()
            append(_KEY.pack(len(raw_key)))
            append(raw_key)
            append(_VALUE.pack(len(value)))
            append(value)
        append(payload)
    return b"".join(parts)


def decode_header(data: bytes) -> RecordSetHeader:
    """The header alone (checked), e.g. to learn a segment's size from its last entry."""
    if len(data) < HEADER_BYTES:
        raise RecordSetCorruptError(f"record set of {len(data)} bytes is shorter than its {HEADER_BYTES}-byte header")
    magic, version, flags, count, before, bytes_before, publish_ms = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise RecordSetCorruptError(f"not a record set (magic {magic!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise RecordSetCorruptError(
            f"record set format version {version} is unknown to this build (knows {FORMAT_VERSION})"
        )
    if flags != 0:
        raise RecordSetCorruptError(f"record set flags {flags:#x} are unknown to this build")
    if count == 0 or count > RECORDS_PER_SET_MAX:
        raise RecordSetCorruptError(f"record set claims {count} records (1..{RECORDS_PER_SET_MAX})")
    return RecordSetHeader(count, before, bytes_before, publish_ms)


def decode(data: bytes) -> tuple[RecordSetHeader, list[RecordInput]]:
    """Every record of a set, in slot order; ``RecordSetCorruptError`` if anything is off."""
    header = decode_header(data)
    view = memoryview(data)
    end = len(data)
    offset = HEADER_BYTES
    records: list[RecordInput] = []
    unpack_record = _RECORD.unpack_from
    try:
        for _ in range(header.count):
            payload_len, header_count = unpack_record(data, offset)
            offset += RECORD_OVERHEAD_BYTES
            headers: Mapping[str, bytes] = NO_HEADERS
            if header_count:
                if header_count > HEADERS_MAX:
                    raise RecordSetCorruptError(f"record claims {header_count} headers (max {HEADERS_MAX})")
                found: dict[str, bytes] = {}
                for _ in range(header_count):
                    (key_len,) = _KEY.unpack_from(data, offset)
                    offset += _KEY.size
                    key = bytes(view[offset : offset + key_len]).decode()
                    offset += key_len
                    (value_len,) = _VALUE.unpack_from(data, offset)
                    offset += _VALUE.size
                    if offset + value_len > end:
                        raise RecordSetCorruptError("record header value runs past the end of the set")
                    found[key] = bytes(view[offset : offset + value_len])
                    offset += value_len
                headers = MappingProxyType(found)
            if offset + payload_len > end:
                raise RecordSetCorruptError("record payload runs past the end of the set")
            records.append((data[offset : offset + payload_len], headers))
            offset += payload_len
    except (struct.error, UnicodeDecodeError) as exc:
        raise RecordSetCorruptError(f"record set truncated or garbled at byte {offset}: {exc}") from None
    if offset != end:
        raise RecordSetCorruptError(f"record set has {end - offset} trailing bytes after {header.count} records")
    return header, records
