"""The journal's records and files (I/O through ``FileIO`` only): the record format, the
file layout, and replay. ``journal`` writes them.

File layout ``<id:016x>.jnl``: a 16-byte header (magic, version, file id) then records
``u32 body_len | u32 crc32c(len || body) | body``; ``body[0]`` is the record type; then,
in a file written with preallocation, zeros (the hole) to its end.
Replay (:func:`replay_journal`) yields complete records from a position. A file whose
records end in zeros only ends there (the zeros are cut off and replay goes on with the
next file: a bookie stopped or killed leaves its last file so). At the first torn or
corrupt record the file is cut and later files are set aside (``.discarded``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import google_crc32c

from scriba.bookie.fileio import FileIO
from scriba.errors import StorageError
from scriba.invariant import invariant
from scriba.log import get_logger

log = get_logger(__name__)

MAGIC: Final = b"SCRJ"
VERSION: Final = 1
FILE_HEADER: Final = struct.Struct(">4sIQ")
FILE_HEADER_SIZE: Final = FILE_HEADER.size  # 16
REC_HEADER: Final = struct.Struct(">II")
REC_HEADER_SIZE: Final = REC_HEADER.size
BODY_LEN_MAX: Final = 1 << 30
SUFFIX: Final = ".jnl"

# record types
ADDS: Final = 1  # u32 count | u32 len * count | entries (ids are in each entry's header)
MASTER_KEY: Final = 2  # u64 ledger | key
FENCE: Final = 3  # u64 ledger
EXPLICIT_LAC: Final = 4  # u64 ledger | i64 lac
DELETE: Final = 5  # u64 ledger, repeated

_U32 = struct.Struct(">I")
_LEDGER = struct.Struct(">Q")
_LEDGER_LAC = struct.Struct(">Qq")

_crc_value = google_crc32c.value
_crc_extend = google_crc32c.extend


class DiskFullError(StorageError):
    """A write met ENOSPC; nothing of it was acknowledged."""


@dataclass(frozen=True, slots=True, order=True)
class JournalPosition:
    file_id: int
    offset: int


def frame(body: bytes) -> bytes:
    header = _U32.pack(len(body))
    return b"".join((header, _crc_extend(_crc_value(header), body).to_bytes(4, "big"), body))


def encode_adds(entries: list[bytes]) -> bytes:
    """One ADDS record: ``1 | u32 count | u32 len * count | entries``."""
    n = len(entries)
    head = b"\x01" + struct.pack(f">I{n}I", n, *map(len, entries))
    blob = b"".join(entries)
    size = (len(head) + len(blob)).to_bytes(4, "big")
    crc = _crc_extend(_crc_extend(_crc_value(size), head), blob)
    return b"".join((size, crc.to_bytes(4, "big"), head, blob))


def decode_adds(body: bytes) -> list[bytes]:
    (n,) = _U32.unpack_from(body, 1)
    lens = struct.unpack_from(f">{n}I", body, 5)
    pos = 5 + 4 * n
    invariant(pos + sum(lens) == len(body), "journal ADDS record lengths do not add up")
    out = []
    for size in lens:
        out.append(body[pos : pos + size])
        pos += size
    return out


def encode_master_key(ledger_id: int, key: bytes) -> bytes:
    return frame(b"\x02" + _LEDGER.pack(ledger_id) + key)


def encode_fence(ledger_id: int) -> bytes:
    return frame(b"\x03" + _LEDGER.pack(ledger_id))


def encode_explicit_lac(ledger_id: int, lac: int) -> bytes:
    return frame(b"\x04" + _LEDGER_LAC.pack(ledger_id, lac))


def encode_delete(ledger_ids: list[int]) -> bytes:
    return frame(b"\x05" + b"".join(_LEDGER.pack(lid) for lid in ledger_ids))


def journal_files(journal_dir: Path) -> list[tuple[int, Path]]:
    out: list[tuple[int, Path]] = []
    for p in journal_dir.glob("*" + SUFFIX):
        try:
            out.append((int(p.stem, 16), p))
        except ValueError:
            continue
    return sorted(out)


def file_name(journal_dir: Path, file_id: int) -> Path:
    return journal_dir / f"{file_id:016x}{SUFFIX}"


# --- replay -------------------------------------------------------------------------

CHUNK_BYTES: Final = 8 * 1024 * 1024


def _records_in(fio: FileIO, fd: int, file_id: int, start: int) -> Iterator[tuple[int, bytes, int]]:
    """(type, body, end offset) of complete records; stops at the first bad one."""
    size = fio.size(fd)
    pos = start
    buf = b""
    buf_start = start
    while pos < size:
        need_hdr = pos + REC_HEADER_SIZE - buf_start
        if need_hdr > len(buf):
            buf = buf[pos - buf_start :] + fio.pread(fd, CHUNK_BYTES, buf_start + len(buf))
            buf_start = pos
            if REC_HEADER_SIZE > len(buf):
                return
        rel = pos - buf_start
        body_len, crc = REC_HEADER.unpack_from(buf, rel)
        if body_len < 1 or body_len > BODY_LEN_MAX or pos + REC_HEADER_SIZE + body_len > size:
            return
        end_rel = rel + REC_HEADER_SIZE + body_len
        if end_rel > len(buf):
            buf = buf[rel:] + fio.pread(
                fd, max(CHUNK_BYTES, end_rel - len(buf)), buf_start + len(buf)
            )
            buf_start = pos
            rel = 0
            end_rel = REC_HEADER_SIZE + body_len
            if end_rel > len(buf):
                return
        body = buf[rel + REC_HEADER_SIZE : end_rel]
        if _crc_extend(_crc_value(buf[rel : rel + 4]), body) != crc:
            return
        rtype = body[0]
        if not _body_ok(rtype, body):
            return
        pos += REC_HEADER_SIZE + body_len
        yield rtype, body, pos


def _body_ok(rtype: int, body: bytes) -> bool:
    """A checksummed body must also be well formed (else it is treated as corrupt)."""
    n = len(body)
    if rtype == ADDS:
        if n < 5:
            return False
        (count,) = _U32.unpack_from(body, 1)
        if count == 0 or 5 + 4 * count > n:
            return False
        lens = struct.unpack_from(f">{count}I", body, 5)
        return min(lens) >= 16 and 5 + 4 * count + sum(lens) == n
    if rtype == MASTER_KEY:
        return n >= 9
    if rtype == FENCE:
        return n == 9
    if rtype == EXPLICIT_LAC:
        return n == 17
    if rtype == DELETE:
        return n >= 9 and (n - 1) % 8 == 0
    return False


def replay_journal(
    journal_dir: Path, fio: FileIO, start: JournalPosition
) -> Iterator[tuple[int, bytes, JournalPosition]]:
    """Yield (type, body, position after it) of every complete record from ``start``.

    At the first torn or corrupt record the file is truncated there (durably) and any
    later journal file is renamed ``*.discarded``: nothing past a bad record is served.
    """
    files = journal_files(journal_dir)
    for i, (file_id, path) in enumerate(files):
        if file_id < start.file_id:
            continue
        fd = fio.open(path, create=False)
        try:
            size = fio.size(fd)
            offset = start.offset if file_id == start.file_id else FILE_HEADER_SIZE
            good = FILE_HEADER_SIZE <= size and _header_ok(fio.pread(fd, FILE_HEADER_SIZE, 0), file_id)
            end = offset
            if good:
                offset = max(offset, FILE_HEADER_SIZE)
                end = offset
                for rtype, body, end in _records_in(fio, fd, file_id, offset):
                    yield rtype, body, JournalPosition(file_id, end)
            if good and end == size:
                continue
            if good and _zeros_only(fio, fd, end, size):  # the unused part of a preallocated file
                fio.truncate(fd, end)
                fio.fdatasync(fd)
                continue
            log.warning("journal_truncated", file=str(path), offset=end, size=size,
                        header_ok=good)
            if good:
                fio.truncate(fd, end)
                fio.fdatasync(fd)
        finally:
            fio.close(fd)
        if not good:
            path.rename(path.with_name(path.name + ".discarded"))
        for _, later in files[i + 1 :]:
            log.warning("journal_file_discarded", file=str(later))
            later.rename(later.with_name(later.name + ".discarded"))
        fio.fsync_dir(journal_dir)
        return


def _zeros_only(fio: FileIO, fd: int, start: int, end: int) -> bool:
    """Whether bytes ``[start, end)`` of the file are all zero."""
    while start < end:
        chunk = fio.pread(fd, min(CHUNK_BYTES, end - start), start)
        if not chunk or chunk.count(0) != len(chunk):
            return False
        start += len(chunk)
    return True


def _header_ok(header: bytes, file_id: int) -> bool:
    if len(header) != FILE_HEADER_SIZE:
        return False
    magic, version, fid = FILE_HEADER.unpack(header)
    return magic == MAGIC and version == VERSION and fid == file_id
