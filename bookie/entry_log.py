"""Entry log files: append-only, rotated, each record checksummed at rest.

File ``<id:08x>.elog``: a 16-byte header (magic, version, log id) then records
``u32 len | u32 crc32c(entry) | entry`` where ``entry`` is the packed entry (its
header names ledger and entry). A location is ``(log_id, offset of the record, len)``.
Reads verify the CRC and the ledger/entry ids: a mismatch raises ``CorruptEntryError``;
corrupt bytes are never returned.

Writes come from one thread at a time (the checkpoint/compaction flusher); reads from
any thread (``pread`` on a shared descriptor). Compaction reads a sealed log in chunks
(:meth:`EntryLogs.scan_chunk`); the current log is sealed (:meth:`EntryLogs.seal_current`)
before it can be compacted.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from enum import Enum
from itertools import accumulate, repeat
from operator import add
from pathlib import Path
from typing import Final

import google_crc32c

from scriba.bookie.fileio import FileIO
from scriba.errors import CorruptEntryError

MAGIC: Final = b"SCRE"
VERSION: Final = 1
FILE_HEADER: Final = struct.Struct(">4sIQ")
FILE_HEADER_SIZE: Final = FILE_HEADER.size
REC_HEADER: Final = struct.Struct(">II")
REC_HEADER_SIZE: Final = REC_HEADER.size
SUFFIX: Final = ".elog"
WRITE_CHUNK_BYTES: Final = 4 * 1024 * 1024
_WRITE_CHUNK_ENTRIES: Final = 4096  # the whole-list path writes at most this many per call

_crc_value = google_crc32c.value

Location = tuple[int, int, int]  # log id, record offset, entry length
Span = tuple[int, int, int, Sequence[int]]  # log id, first index, stop index, offsets (+ end)
LOC: Final = struct.Struct(">IQI")  # a Location packed, as the index stores it
_IDS: Final = struct.Struct(">Qq")  # ledger id, entry id: the front of a packed entry
Record = tuple[int, int, int, bytes]  # ledger, entry, record offset, entry bytes


class ScanState(Enum):
    MORE = "more"
    END = "end"
    DAMAGED = "damaged"


def log_ids(log_dir: Path) -> list[int]:
    out = []
    for p in log_dir.glob("*" + SUFFIX):
        try:
            out.append(int(p.stem, 16))
        except ValueError:
            continue
    return sorted(out)


class EntryLogs:
    """All entry logs of one ledger dir: one current log to append to, any to read."""

    def __init__(self, log_dir: Path, fio: FileIO, file_bytes_max: int, next_log_id: int) -> None:
        self._dir = log_dir
        self._fio = fio
        self._file_bytes_max = file_bytes_max
        existing = log_ids(log_dir)
        self._next_id = max([next_log_id, *(i + 1 for i in existing)])
        self._readers: dict[int, int] = {}
        self._lock = threading.Lock()
        self.current_id = -1
        self._fd = -1
        self._offset = 0
        self._dirty: set[int] = set()
        self._written: dict[int, int] = {}  # bytes appended per log id (this run)

    @property
    def next_log_id(self) -> int:
        return self._next_id

    def path(self, log_id: int) -> Path:
        return self._dir / f"{log_id:08x}{SUFFIX}"

    # --- writing (one flusher thread) ---------------------------------------------

    def _roll(self) -> None:
        if self._fd >= 0:
            self._fio.close(self._fd)
        log_id = self._next_id
        self._next_id += 1
        fd = self._fio.open(self.path(log_id), create=True)
        self._fio.truncate(fd, 0)
        self._fio.write(fd, FILE_HEADER.pack(MAGIC, VERSION, log_id))
        self._fio.fsync_dir(self._dir)
        self._fd, self.current_id, self._offset = fd, log_id, FILE_HEADER_SIZE
        self._dirty.add(log_id)

    def seal_current(self) -> int:
        """Stop appending to the current log (synced first); the next append starts a new
        one. The sealed log's id (-1: none was open)."""
        sealed = self.current_id
        if self._fd >= 0:
            self.sync()
            self._fio.close(self._fd)
        self._fd, self.current_id = -1, -1
        return sealed

    def abandon_current(self) -> None:
        """After a failed write: never append to this log again (its tail may be partial)."""
        if self._fd >= 0:
            try:
                self._fio.close(self._fd)
            except OSError:
                pass
        self._fd, self.current_id = -1, -1
        self._dirty.clear()
        self._written.clear()  # never committed: not counted

    def append(self, entries: list[bytes]) -> list[bytes]:
        """Append entries (not yet durable: call :meth:`sync`); packed locations (``LOC``)."""
        locs: list[bytes] = []
        loc = LOC.pack
        for log_id, i, j, offsets in self.append_spans(entries):
            locs += map(loc, repeat(log_id), offsets[: j - i], map(len, entries[i:j]))
        return locs

    def append_spans(self, entries: list[bytes]) -> list[Span]:
        """Append entries (not yet durable: call :meth:`sync`); where they went, as spans
        ``(log id, first index, stop index, offsets)`` -- ``entries[first:stop]`` sit back to
        back in that log from ``offsets[0]``; ``offsets`` also holds the end of the last
        (a ``range`` when the entries have one size). A new log starts when one is full."""
        if self._fd < 0:
            self._roll()
        self._dirty.add(self.current_id)
        offset = self._offset
        log_id = self.current_id
        rec, crc = REC_HEADER.pack, _crc_value
        limit = self._file_bytes_max
        sizes = list(map(len, entries))
        count = len(sizes)
        if not count:
            return []
        step = sizes[0] + REC_HEADER_SIZE
        same = sizes.count(sizes[0]) == count
        end = offset + step * count if same else offset + sum(sizes) + REC_HEADER_SIZE * count
        if end <= limit:  # all in the current log: whole-list operations, no loop per entry
            headers = list(map(rec, sizes, map(crc, entries)))
            offsets: Sequence[int] = (
                range(offset, end + 1, step) if same
                else list(accumulate(map(add, sizes, repeat(REC_HEADER_SIZE)), initial=offset))
            )
            chunk = _WRITE_CHUNK_ENTRIES
            for i in range(0, count, chunk):
                j = min(i + chunk, count)
                parts = [b""] * (2 * (j - i))
                parts[0::2] = headers[i:j]
                parts[1::2] = entries[i:j]
                self._write(parts, offsets[j] - offsets[i])
            self._offset = end
            return [(log_id, 0, count, offsets)]
        spans: list[Span] = []
        pending: list[bytes] = []
        span_offsets: list[int] = []
        first = 0
        start = offset
        for k, e in enumerate(entries):
            n = sizes[k]
            if offset + REC_HEADER_SIZE + n > limit and offset > FILE_HEADER_SIZE:
                self._write(pending, offset - start)
                pending = []
                if k > first:
                    span_offsets.append(offset)
                    spans.append((log_id, first, k, span_offsets))
                span_offsets = []
                first = k
                self._offset = offset
                self._roll()
                log_id = self.current_id
                offset = start = self._offset
            pending.append(rec(n, crc(e)))
            pending.append(e)
            span_offsets.append(offset)
            offset += REC_HEADER_SIZE + n
            if offset - start >= WRITE_CHUNK_BYTES:
                self._write(pending, offset - start)
                pending = []
                start = offset
        if pending:
            self._write(pending, offset - start)
        self._offset = offset
        span_offsets.append(offset)
        spans.append((log_id, first, count, span_offsets))
        return spans

    def _write(self, parts: list[bytes], nbytes: int) -> None:
        if parts:
            self._fio.writev(self._fd, parts)
            self._written[self.current_id] = self._written.get(self.current_id, 0) + nbytes

    def sync(self) -> None:
        """fdatasync every log appended to since the last sync (rolled-over ones included)."""
        for log_id in sorted(self._dirty):
            if log_id == self.current_id:
                self._fio.fdatasync(self._fd)
            else:
                fd = self._fio.open(self.path(log_id), create=False)
                try:
                    self._fio.fdatasync(fd)
                finally:
                    self._fio.close(fd)
        self._dirty = set()

    def take_written(self) -> dict[int, int]:
        out, self._written = self._written, {}
        return out

    # --- reading (any thread) ---------------------------------------------------------

    def _reader(self, log_id: int) -> int:
        fd = self._readers.get(log_id)
        if fd is None:
            with self._lock:
                fd = self._readers.get(log_id)
                if fd is None:
                    try:
                        fd = self._fio.open(self.path(log_id), create=False)
                    except FileNotFoundError:
                        raise CorruptEntryError(
                            f"the index names entry log {log_id}, which does not exist"
                        ) from None
                    self._readers[log_id] = fd
        return fd

    def read(self, loc: Location, ledger_id: int, entry_id: int) -> bytes:
        log_id, offset, n = loc
        entries, error = self.read_span(log_id, (offset, offset + REC_HEADER_SIZE + n), ledger_id, entry_id)
        if error is not None:
            raise error
        return entries[0]

    def read_span(
        self, log_id: int, offsets: Sequence[int], ledger_id: int, first_entry_id: int
    ) -> tuple[list[bytes], CorruptEntryError | None]:
        """Entries ``first_entry_id ..`` of a ledger whose records sit back to back at
        ``offsets`` (then the end of the last), with ONE ``pread``: the entries that
        verify, in order, up to the first that does not, and the error for that one
        (None: all verified). Each record's length, checksum and ids are checked."""
        base = offsets[0]
        fd = self._reader(log_id)
        raw = self._fio.pread(fd, offsets[-1] - base, base)
        out: list[bytes] = []
        unpack_rec = REC_HEADER.unpack_from
        unpack_ids = _IDS.unpack_from
        eid = first_entry_id
        end = offsets[0] - base
        size = len(raw)
        for stop in offsets[1:]:
            start, end = end, stop - base
            n = end - start - REC_HEADER_SIZE
            if end > size:
                problem = "log too short"
            else:
                got_n, crc = unpack_rec(raw, start)
                data = raw[start + REC_HEADER_SIZE : end]
                if got_n != n or _crc_value(data) != crc:
                    problem = "checksum failed"
                elif n < _IDS.size or unpack_ids(data) != (ledger_id, eid):
                    problem = "holds another entry"
                else:
                    out.append(data)
                    eid += 1
                    continue
            return out, CorruptEntryError(
                f"ledger {ledger_id} entry {eid}: log {log_id} at {start + base}: {problem}"
            )
        return out, None

    def scan(self, log_id: int) -> tuple[list[Record], bool]:
        """(ledger, entry, record offset, entry bytes) of a log's records in order, and
        whether the scan reached the end of the file (False: stopped at a bad record)."""
        out: list[Record] = []
        offset = FILE_HEADER_SIZE
        while True:
            records, offset, state = self.scan_chunk(log_id, offset, WRITE_CHUNK_BYTES)
            out += records
            if state is not ScanState.MORE:
                return out, state is ScanState.END

    def scan_chunk(self, log_id: int, offset: int, bytes_max: int) -> tuple[list[Record], int, ScanState]:
        """The whole records from ``offset`` in about ``bytes_max`` bytes (at least one):
        (records, offset after them, END / MORE / DAMAGED (a bad record at that offset)).
        Reads in one ``pread`` (a record longer than ``bytes_max`` in one of its own)."""
        fd = self._reader(log_id)
        size = self._fio.size(fd)
        out: list[Record] = []
        if offset >= size:
            return out, offset, ScanState.END
        buf = self._fio.pread(fd, min(bytes_max, size - offset), offset)
        base = offset
        pos = 0
        unpack = REC_HEADER.unpack_from
        from_bytes = int.from_bytes
        while base + pos < size:
            if pos + REC_HEADER_SIZE > len(buf):
                if out:
                    break
                buf = self._fio.pread(fd, REC_HEADER_SIZE, base)
                if len(buf) < REC_HEADER_SIZE:
                    return out, base, ScanState.DAMAGED
            n, crc = unpack(buf, pos)
            end = pos + REC_HEADER_SIZE + n
            if n < 16 or base + end > size:
                return out, base + pos, ScanState.DAMAGED
            if end > len(buf):
                if out:
                    break
                buf = self._fio.pread(fd, REC_HEADER_SIZE + n, base)  # one long record
                if len(buf) < end:
                    return out, base, ScanState.DAMAGED
            data = buf[pos + REC_HEADER_SIZE : end]
            if _crc_value(data) != crc:
                return out, base + pos, ScanState.DAMAGED
            out.append((from_bytes(data[0:8], "big"), from_bytes(data[8:16], "big", signed=True),
                        base + pos, data))
            pos = end
        offset = base + pos
        return out, offset, ScanState.END if offset >= size else ScanState.MORE

    def record_bytes(self) -> dict[int, int]:
        """Bytes of records (file size less the header) of every log file on disk."""
        out: dict[int, int] = {}
        for log_id in log_ids(self._dir):
            try:
                fd = self._fio.open(self.path(log_id), create=False)
            except FileNotFoundError:
                continue
            try:
                out[log_id] = max(0, self._fio.size(fd) - FILE_HEADER_SIZE)
            finally:
                self._fio.close(fd)
        return out

    def remove(self, log_id: int) -> None:
        """Delete a log (the index must no longer point into it)."""
        with self._lock:
            fd = self._readers.pop(log_id, None)
        if fd is not None:
            self._fio.close(fd)
        try:
            self._fio.remove(self.path(log_id))
        except FileNotFoundError:
            pass

    def close(self) -> None:
        with self._lock:
            readers, self._readers = self._readers, {}
        for fd in readers.values():
            self._fio.close(fd)
        if self._fd >= 0:
            self._fio.close(self._fd)
            self._fd = -1
