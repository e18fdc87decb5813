"""The entry format, shared by client and bookie (on the wire and on disk).

Layout (big-endian)::

    ledger_id  u64 | entry_id  i64 | last_add_confirmed  i64 | length  u64
    digest (4 bytes CRC32C, or 32 bytes HMAC-SHA256) | payload

``length`` is the ledger's total payload length up to and including this entry.
The digest covers the 32-byte header and the payload. A bookie stores the packed
bytes unchanged; only a client knows the digest type and key, so only a client
verifies the digest (bookies keep their own checksums for data at rest).

The password never leaves the client: bookies get a *master key* and metadata
gets a *password hash*, each a different one-way derivation.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass
from typing import Final, Protocol

import google_crc32c

from scriba.errors import BadRequestError, ConfigError, DigestMismatchError
from scriba.ids import EntryId, LedgerId

HEADER: Final = struct.Struct(">QqqQ")
HEADER_SIZE: Final = HEADER.size  # 32
ENTRY_SIZE_MAX_DEFAULT: Final = 5 * 1024 * 1024


class Digest(Protocol):
    name: str
    size: int

    def compute(self, header: bytes, payload: bytes) -> bytes: ...


class Crc32cDigest:
    name = "crc32c"
    size = 4

    def compute(self, header: bytes, payload: bytes) -> bytes:
        crc = google_crc32c.extend(google_crc32c.value(header), payload)
        return crc.to_bytes(4, "big")


class HmacSha256Digest:
    name = "hmac-sha256"
    size = 32

    def __init__(self, password: bytes) -> None:
        self._key = hashlib.sha256(b"scriba-mac-key\x00" + password).digest()

    def compute(self, header: bytes, payload: bytes) -> bytes:
        mac = hmac.new(self._key, header, hashlib.sha256)
        mac.update(payload)
        return mac.digest()


def make_digest(digest_type: str, password: bytes) -> Digest:
    if digest_type == "crc32c":
        return Crc32cDigest()
    if digest_type == "hmac-sha256":
        return HmacSha256Digest(password)
    raise ConfigError(f"digest: unknown type {digest_type!r} (crc32c or hmac-sha256)")


def master_key(password: bytes) -> bytes:
    """The key a bookie binds to a ledger on its first add (never the password)."""
    return hashlib.sha256(b"scriba-master-key\x00" + password).digest()


def password_hash(password: bytes) -> bytes:
    """What ledger metadata stores to check a password on open (never the password)."""
    return hashlib.sha256(b"scriba-password-hash\x00" + password).digest()


@dataclass(frozen=True, slots=True)
class EntryHeader:
    ledger_id: LedgerId
    entry_id: EntryId
    last_add_confirmed: EntryId
    length: int


@dataclass(frozen=True, slots=True)
class Entry:
    ledger_id: LedgerId
    entry_id: EntryId
    last_add_confirmed: EntryId
    length: int
    payload: bytes


def pack_entry(
    digest: Digest,
    ledger_id: int,
    entry_id: int,
    last_add_confirmed: int,
    length: int,
    payload: bytes,
) -> bytes:
    header = HEADER.pack(ledger_id, entry_id, last_add_confirmed, length)
    return b"".join((header, digest.compute(header, payload), payload))


def peek_header(data: bytes | memoryview) -> EntryHeader:
    """Read the header without checking the digest (what a bookie may do)."""
    if len(data) < HEADER_SIZE:
        raise BadRequestError(f"entry of {len(data)} bytes is shorter than its header")
    ledger_id, entry_id, lac, length = HEADER.unpack_from(data)
    return EntryHeader(LedgerId(ledger_id), EntryId(entry_id), EntryId(lac), length)


def unpack_entry(digest: Digest, data: bytes) -> Entry:
    """Parse and verify a packed entry; :class:`DigestMismatchError` if it does not verify."""
    if len(data) < HEADER_SIZE + digest.size:
        raise DigestMismatchError(f"entry of {len(data)} bytes is too short to carry a digest")
    header = data[:HEADER_SIZE]
    expected = data[HEADER_SIZE : HEADER_SIZE + digest.size]
    payload = data[HEADER_SIZE + digest.size :]
    if not hmac.compare_digest(digest.compute(header, payload), expected):
        ledger_id, entry_id, _, _ = HEADER.unpack(header)
        raise DigestMismatchError(
            f"digest mismatch for ledger {ledger_id} entry {entry_id} ({digest.name})"
        )
    ledger_id, entry_id, lac, length = HEADER.unpack(header)
    return Entry(LedgerId(ledger_id), EntryId(entry_id), EntryId(lac), length, payload)
