"""The ledger index: (ledger, entry) -> entry-log location, per-ledger state, checkpoint.

Stored in LMDB (``lmdb``): crash-safe by its copy-on-write B+tree and meta-page switch
(a committed transaction survives a crash, an uncommitted one leaves no trace), point
reads after a restart need no scan, and it takes ~4M puts/s in a batch and ~0.7M
single-key gets/s here, far above the add rate. Every value carries a CRC32C so a bit
flipped at rest is detected (``CorruptEntryError``), never served.

Databases: ``runs`` (key ``>QQ`` ledger, first entry of a run of consecutive entries
written back to back in one entry log; value: log id, count, first record offset and
either the record stride (entries of one size) or every record offset, + crc: one put per
run instead of one per entry), ``entries`` (key ``>QQ`` ledger, entry; value ``>IQI`` log
id, offset, length: entries not in a run, e.g. out of order), ``ledgers`` (key ``>Q``;
value state + crc), ``log_totals`` (key ``>I`` log; value bytes appended to it) and
``ledger_logs`` (key ``>QI`` ledger, log; value that ledger's live bytes there): the
entry-log accounting of ``entry_log_meta.py``, ``meta`` (checkpoint journal position,
next log id, accounting version). A lookup tries the run starting at or before the entry,
then ``entries``; runs never overlap and an entry is in at most one of the two. One write
transaction per checkpoint carries runs, entries, states, accounting and position; one
per compaction step carries the moved entries' new records and the accounting.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Collection, Iterable, Sequence
from itertools import repeat
from pathlib import Path
from typing import Final

import google_crc32c
import lmdb

from scriba.bookie.entry_log import LOC, REC_HEADER_SIZE, Location, Span
from scriba.bookie.entry_log_meta import LogLedger, LogMetaUpdate
from scriba.bookie.journal import FILE_HEADER_SIZE, JournalPosition
from scriba.bookie.ledger_state import LedgerState
from scriba.errors import CorruptEntryError

_KEY: Final = struct.Struct(">QQ")
_LOC: Final = LOC
entry_key = _KEY.pack
_LEDGER: Final = struct.Struct(">Q")
_STATE: Final = struct.Struct(">Bqqq")
_POS: Final = struct.Struct(">QQ")
_LOGKEY: Final = struct.Struct(">I")
_LEDGER_LOG: Final = struct.Struct(">QI")
LOG_META_VERSION: Final = 1
_RUN: Final = struct.Struct(">IIQQ")  # log id, count, first record offset, stride (0: offsets follow)
_U64: Final = struct.Struct(">Q")
RUN_ENTRIES_MAX: Final = 4096  # entries per run record (an explicit-offsets value: 32 KiB)
_U64_ARRAY_OK: Final = array("Q").itemsize == 8

_crc = google_crc32c.value


def _seal(body: bytes) -> bytes:
    return body + _crc(body).to_bytes(4, "big")


def _open(value: bytes, what: str) -> bytes:
    body = value[:-4]
    if len(value) < 4 or _crc(body).to_bytes(4, "big") != value[-4:]:
        raise CorruptEntryError(f"index: checksum failed for {what}")
    return body


def run_records(
    ledger_id: int, first_entry: int, log_id: int, offsets: Sequence[int]
) -> list[tuple[bytes, bytes]]:
    """Index records (key, value) for entries ``first_entry ..`` written back to back in
    one log; ``offsets``: each record's offset then the end of the last (len = count + 1).
    A ``range`` (entries of one size) is stored as its stride; else every offset."""
    out: list[tuple[bytes, bytes]] = []
    count = len(offsets) - 1
    for i in range(0, count, RUN_ENTRIES_MAX):
        j = min(i + RUN_ENTRIES_MAX, count)
        part = offsets[i : j + 1]
        if isinstance(part, range):
            body = _RUN.pack(log_id, j - i, part.start, part.step)
        elif _U64_ARRAY_OK:
            arr = array("Q", part)
            if sys.byteorder == "little":
                arr.byteswap()
            body = _RUN.pack(log_id, j - i, part[0], 0) + arr.tobytes()
        else:
            body = _RUN.pack(log_id, j - i, part[0], 0) + struct.pack(f">{len(part)}Q", *part)
        out.append((_KEY.pack(ledger_id, first_entry + i), _seal(body)))
    return out


def _run_location(raw: bytes, index: int, ledger_id: int, entry_id: int) -> Location | None:
    """The location of the ``index``-th entry of a run record (None: past its end)."""
    got = _run_span(raw, index, 1, ledger_id, entry_id)
    if got is None:
        return None
    log_id, offsets = got
    return log_id, offsets[0], offsets[1] - offsets[0] - REC_HEADER_SIZE


def _run_span(
    raw: bytes, index: int, count_max: int, ledger_id: int, entry_id: int
) -> tuple[int, Sequence[int]] | None:
    """Log id and record offsets of up to ``count_max`` entries of a run record from its
    ``index``-th, then the end of the last (len = count + 1); None: past its end."""
    body = _open(raw, f"run of ledger {ledger_id} holding entry {entry_id}")
    try:
        log_id, count, base, stride = _RUN.unpack_from(body)
        if index >= count:
            return None
        stop = min(count, index + count_max)
        if stride:
            if len(body) != _RUN.size:
                raise struct.error("run value size")
            return log_id, range(base + index * stride, base + stop * stride + 1, stride)
        if len(body) != _RUN.size + 8 * (count + 1):
            raise struct.error("run value size")
        return log_id, struct.unpack_from(f">{stop - index + 1}Q", body, _RUN.size + 8 * index)
    except struct.error:
        raise CorruptEntryError(f"index: bad run for ledger {ledger_id} entry {entry_id}") from None


def _seek_run(cur: lmdb.Cursor, key: bytes) -> int | None:
    """Put ``cur`` (on ``runs``) on the run record of ``key``'s ledger that starts at or
    before ``key``'s entry; that run's first entry id (None: the ledger has none there)."""
    found = cur.set_range(key)
    if not (found and cur.key() == key):
        found = cur.prev() if found else cur.last()
    if not found:
        return None
    run_key = cur.key()
    if run_key[:8] != key[:8]:
        return None
    first: int = _KEY.unpack(run_key)[1]
    return first


def _run_singles(key: bytes, raw: bytes) -> list[tuple[bytes, bytes]]:
    """A run record as single-entry records (when a run record from its first id exists:
    its entries were re-added after that record was found corrupt; never overwrite it)."""
    lid, first = _KEY.unpack(key)
    (count,) = struct.unpack_from(">I", raw, 4)
    out: list[tuple[bytes, bytes]] = []
    for i in range(count):
        loc = _run_location(raw, i, lid, first + i)
        if loc is not None:
            out.append((_KEY.pack(lid, first + i), _LOC.pack(*loc)))
    return out


def _run_bytes(raw: bytes) -> tuple[int, int]:
    """(log id, bytes of the run's records) of a run value (no checks: used to account)."""
    log_id, count, base, stride = _RUN.unpack_from(raw)
    if stride:
        return log_id, count * stride
    (end,) = _U64.unpack_from(raw, _RUN.size + 8 * count)
    return log_id, end - base


def _locate(
    txn: lmdb.Transaction, runs: lmdb.Cursor, ledger_id: int, entry_id: int
) -> tuple[Location, bytes | None] | None:
    key = _KEY.pack(ledger_id, entry_id)
    first = _seek_run(runs, key)
    corrupt: CorruptEntryError | None = None
    if first is not None:
        try:
            loc = _run_location(bytes(runs.value()), entry_id - first, ledger_id, entry_id)
        except CorruptEntryError as exc:
            loc, corrupt = None, exc  # an entry re-added since has its own record
        if loc is not None:
            return loc, bytes(runs.key())  # the transaction has buffers=False: no copy
    raw = txn.get(key)
    if raw is None:
        if corrupt is not None:
            raise corrupt
        return None
    try:
        return _LOC.unpack(raw), None  # type: ignore[return-value]
    except struct.error:
        raise CorruptEntryError(f"index: bad location for ledger {ledger_id} entry {entry_id}") from None


def index_records(
    segments: Sequence[tuple[int, Sequence[int], Sequence[bytes]]], spans: list[Span]
) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]], dict[LogLedger, int]]:
    """(run records, single-entry records, record bytes per (log, ledger)) for
    ``segments`` (ledger, entry ids, entries) appended as ``spans`` (the segments' entries
    concatenated, in order). Entry ids given as a ``range`` become one run record per log
    they landed in (per ``RUN_ENTRIES_MAX``); other entries one record each."""
    runs: list[tuple[bytes, bytes]] = []
    singles: list[tuple[bytes, bytes]] = []
    usage: dict[LogLedger, int] = {}
    loc = LOC.pack
    si = 0
    pos = 0
    for lid, eids, entries in segments:
        seg_start = pos
        a = pos
        b = pos + len(entries)
        pos = b
        while a < b:
            while spans[si][2] <= a:
                si += 1
            log_id, s0, s1, offsets = spans[si]
            c = min(b, s1)
            part = offsets[a - s0 : c - s0 + 1]
            usage[(log_id, lid)] = usage.get((log_id, lid), 0) + part[-1] - part[0]
            ids = eids[a - seg_start : c - seg_start]
            if isinstance(ids, range):
                runs += run_records(lid, ids[0], log_id, part)
            else:
                singles += zip(
                    map(entry_key, repeat(lid), ids),
                    map(loc, repeat(log_id), part[:-1], map(len, entries[a - seg_start : c - seg_start])),
                    strict=True,
                )
            a = c
    return runs, singles, usage


class LedgerIndex:
    def __init__(self, path: Path, map_size_bytes: int) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self._env = lmdb.open(
            str(path), map_size=map_size_bytes, max_dbs=8, subdir=True, sync=True,
            metasync=True, readahead=False, lock=True, max_readers=512,
        )
        self._entries = self._env.open_db(b"entries")
        self._runs = self._env.open_db(b"runs")
        self._ledgers = self._env.open_db(b"ledgers")
        self._log_totals = self._env.open_db(b"log_totals")
        self._ledger_logs = self._env.open_db(b"ledger_logs")
        self._meta = self._env.open_db(b"meta")

    # --- reads ------------------------------------------------------------------------

    def get(self, ledger_id: int, entry_id: int) -> Location | None:
        got = self.locate(ledger_id, entry_id)
        return None if got is None else got[0]

    def span(self, ledger_id: int, entry_id: int, count_max: int) -> tuple[int, Sequence[int]] | None:
        """Where up to ``count_max`` consecutive entries from ``entry_id`` sit back to back
        in one entry log, as one run record has them: (log id, record offsets then the
        end of the last). None when no readable run record holds ``entry_id`` (look it up
        alone with :meth:`locate`, which also tells a corrupt record from a missing one)."""
        key = _KEY.pack(ledger_id, entry_id)
        with self._env.begin(db=self._runs, buffers=False) as txn:
            cur = txn.cursor()
            first = _seek_run(cur, key)
            if first is None:
                return None
            try:
                return _run_span(cur.value(), entry_id - first, count_max, ledger_id, entry_id)
            except CorruptEntryError:
                return None

    def locate(self, ledger_id: int, entry_id: int) -> tuple[Location, bytes | None] | None:
        """The entry's location and the key of the run record holding it (None: its own)."""
        with self._env.begin(db=self._entries, buffers=False) as txn:
            return _locate(txn, txn.cursor(db=self._runs), ledger_id, entry_id)

    def locate_many(
        self, ids: Iterable[tuple[int, int]]
    ) -> list[tuple[Location, bytes | None] | CorruptEntryError | None]:
        """:meth:`locate` of each (ledger, entry) in one read transaction; a corrupt record
        is answered by its error instead of raising."""
        out: list[tuple[Location, bytes | None] | CorruptEntryError | None] = []
        with self._env.begin(db=self._entries, buffers=False) as txn:
            cur = txn.cursor(db=self._runs)
            for lid, eid in ids:
                try:
                    out.append(_locate(txn, cur, lid, eid))
                except CorruptEntryError as exc:
                    out.append(exc)
        return out

    def load_states(self) -> dict[int, LedgerState]:
        out: dict[int, LedgerState] = {}
        with self._env.begin(db=self._ledgers) as txn:
            for key, raw in txn.cursor():
                (lid,) = _LEDGER.unpack(key)
                body = _open(raw, f"ledger {lid} state")
                fenced, lac, explicit, last = _STATE.unpack_from(body)
                out[lid] = LedgerState(body[_STATE.size :], bool(fenced), lac, explicit, last)
        return out

    def checkpoint_position(self) -> JournalPosition:
        with self._env.begin(db=self._meta) as txn:
            raw = txn.get(b"checkpoint")
        if raw is None:
            return JournalPosition(0, FILE_HEADER_SIZE)
        return JournalPosition(*_POS.unpack(_open(raw, "checkpoint position")))

    def next_log_id(self) -> int:
        with self._env.begin(db=self._meta) as txn:
            raw = txn.get(b"next_log_id")
        return 1 if raw is None else _LEDGER.unpack(_open(raw, "next log id"))[0]

    def load_log_meta(self) -> tuple[dict[int, int], dict[int, dict[int, int]]] | None:
        """Entry-log totals and live bytes per log per ledger; None when this index has no
        accounting of the current version (older index: :meth:`rebuild_log_meta`)."""
        with self._env.begin(db=self._meta) as txn:
            raw = txn.get(b"log_meta_version")
            if raw is None or _LEDGER.unpack(_open(raw, "log accounting version"))[0] != LOG_META_VERSION:
                return None
            totals: dict[int, int] = {}
            for key, value in txn.cursor(db=self._log_totals):
                totals[_LOGKEY.unpack(key)[0]] = _U64.unpack(_open(value, "log total"))[0]
            live: dict[int, dict[int, int]] = {}
            for key, value in txn.cursor(db=self._ledger_logs):
                lid, log_id = _LEDGER_LOG.unpack(key)
                live.setdefault(log_id, {})[lid] = _U64.unpack(_open(value, "log usage"))[0]
        return totals, live

    def rebuild_log_meta(self) -> dict[int, dict[int, int]]:
        """Live bytes per log per ledger, counted from every run and entry record."""
        live: dict[int, dict[int, int]] = {}
        with self._env.begin(db=self._runs) as txn:
            for key, raw in txn.cursor():
                try:
                    log_id, n = _run_bytes(_open(raw, "run"))
                except (CorruptEntryError, struct.error):
                    continue  # its entries cannot be read through it anyway
                per = live.setdefault(log_id, {})
                lid = _LEDGER.unpack_from(key)[0]
                per[lid] = per.get(lid, 0) + n
            for key, raw in txn.cursor(db=self._entries):
                try:
                    log_id, _, n = _LOC.unpack(raw)
                except struct.error:
                    continue
                per = live.setdefault(log_id, {})
                lid = _LEDGER.unpack_from(key)[0]
                per[lid] = per.get(lid, 0) + n + REC_HEADER_SIZE
        return live

    # --- writes (one thread at a time) ----------------------------------------------

    def commit(
        self,
        locations: Iterable[tuple[bytes, bytes]],
        states: dict[int, LedgerState],
        meta: LogMetaUpdate,
        position: JournalPosition | None,
        next_log_id: int,
        runs: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        """One durable transaction: run records (:func:`run_records`), entry locations
        (``entry_key``, packed ``LOC``), ledger states, entry-log accounting, position."""
        with self._env.begin(write=True) as txn:
            self._put_runs(txn, runs)
            txn.cursor(db=self._entries).putmulti(locations)  # consumed lazily, in C
            for lid, st in states.items():
                body = _STATE.pack(st.fenced, st.lac, st.explicit_lac, st.last_entry_id)
                txn.put(_LEDGER.pack(lid), _seal(body + st.master_key), db=self._ledgers)
            self._put_log_meta(txn, meta)
            if position is not None:
                txn.put(b"checkpoint", _seal(_POS.pack(position.file_id, position.offset)),
                        db=self._meta)
            txn.put(b"next_log_id", _seal(_LEDGER.pack(next_log_id)), db=self._meta)

    def commit_moves(
        self,
        runs: Sequence[tuple[bytes, bytes]],
        singles: Sequence[tuple[bytes, bytes]],
        moved: Collection[bytes],
        split_runs: Iterable[bytes],
        meta: LogMetaUpdate,
        next_log_id: int,
    ) -> None:
        """One durable transaction moving entries (compaction): their new ``runs`` and
        ``singles`` records; ``moved``: the keys of every moved entry (any old single
        record of theirs is dropped); ``split_runs``: run records that held moved entries
        (dropped; their entries not moved stay indexed, as single records at their old
        location); the entry-log accounting."""
        with self._env.begin(write=True) as txn:
            entries = txn.cursor(db=self._entries)
            for key in split_runs:
                raw = txn.get(key, db=self._runs)
                if raw is None:
                    continue
                txn.delete(key, db=self._runs)
                entries.putmulti([kv for kv in _run_singles(key, raw) if kv[0] not in moved])
            for key in moved:
                txn.delete(key, db=self._entries)
            self._put_runs(txn, runs)
            entries.putmulti(singles)
            self._put_log_meta(txn, meta)
            txn.put(b"next_log_id", _seal(_LEDGER.pack(next_log_id)), db=self._meta)

    def write_log_meta(self, meta: LogMetaUpdate) -> None:
        """Store entry-log accounting alone (and mark it of the current version)."""
        with self._env.begin(write=True) as txn:
            self._put_log_meta(txn, meta)
            txn.put(b"log_meta_version", _seal(_LEDGER.pack(LOG_META_VERSION)), db=self._meta)

    def _put_runs(self, txn: lmdb.Transaction, runs: Iterable[tuple[bytes, bytes]]) -> None:
        cur = txn.cursor(db=self._runs)
        for key, value in runs:
            if not cur.put(key, value, overwrite=False):  # a run from there is indexed
                txn.cursor(db=self._entries).putmulti(_run_singles(key, value))

    def _put_log_meta(self, txn: lmdb.Transaction, meta: LogMetaUpdate) -> None:
        for log_id, total in meta.totals.items():
            txn.put(_LOGKEY.pack(log_id), _seal(_U64.pack(total)), db=self._log_totals)
        for (log_id, lid), n in meta.usage.items():
            key = _LEDGER_LOG.pack(lid, log_id)
            if n > 0:
                txn.put(key, _seal(_U64.pack(n)), db=self._ledger_logs)
            else:
                txn.delete(key, db=self._ledger_logs)
        for log_id in meta.removed_logs:
            txn.delete(_LOGKEY.pack(log_id), db=self._log_totals)

    def delete_ledgers(self, ledger_ids: Iterable[int]) -> None:
        """Drop the ledgers' entries, state and entry-log accounting, in one transaction."""
        with self._env.begin(write=True) as txn:
            cursors = [txn.cursor(db=db) for db in (self._runs, self._entries, self._ledger_logs)]
            for lid in ledger_ids:
                prefix = _LEDGER.pack(lid)
                txn.delete(prefix, db=self._ledgers)
                for cur in cursors:
                    if cur.set_range(prefix):
                        while cur.key()[:8] == prefix and cur.delete():
                            pass

    def close(self) -> None:
        self._env.close()
