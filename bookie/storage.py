"""DiskLedgerStorage: journal + write cache + entry logs + LMDB index.

Write path: ``add_columns`` (``add_batch``) admits adds (``ledger_state.admit_runs``: a
stretch of new entries of one ledger is checked whole), encodes the accepted ones as ONE
journal record (after a master-key record per ledger of the batch) with one copy of the
entries, and awaits the journal's group commit; when the group is durable, ``_on_durable``
(event loop, in journal order) appends each admitted run to the write cache, then the
batch returns. The LACs the admitted entries carry are raised at admission, before the
journal write (``_raise_carried_lacs``): tailing readers' long polls answer without
waiting for this bookie's fdatasync of the entry that brought the news. A checkpoint swaps the cache, appends its entries to the
current entry log, fdatasyncs it, commits locations (one index record per run of
consecutive entries) + ledger states + the journal position in one LMDB transaction,
then removes journal files wholly before that position. A checkpoint runs to its end
even if its caller is cancelled.

Restart (``open_storage``): load states and the checkpoint position from the index,
replay the journal from there (idempotently: entries already indexed are skipped),
cut the journal at the first torn/corrupt record, then checkpoint.

Failures: a failed journal write or fdatasync fails that group and every later add
(STORAGE) and switches to read-only for good; ENOSPC (journal cut back to its durable
end) or disk usage over ``disk_usage_threshold`` switch to read-only until usage drops
under ``disk_usage_lwm``. Reads keep working in read-only mode.

Space: every flush and compaction step records, in the same index transaction, each
entry log's total bytes and each ledger's live bytes in it (``entry_log_meta``).
``delete_ledgers`` only makes bytes dead; ``compact`` (run by the bookie's GC,
``gc.py``) removes logs with nothing live and copies the live entries of sparse logs to
the current log (``log_compactor``), under the flush lock a step at a time.

Invariant: an add is OK only after its journal record's fdatasync returned.

On disk: ``<journal_dir>/<id:016x>.jnl`` (journal.py), ``<ledger_dir>/entrylogs/<id:08x>.elog``
(entry_log.py), ``<ledger_dir>/index/`` (LMDB, ledger_index.py) and a ``LOCK`` file in each
dir held with ``flock`` while open (a second process on the same dirs is refused).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import fcntl
import os
import shutil
import struct
import sys
from array import array
from bisect import bisect_right
from collections.abc import Callable, Collection, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any, Final

import google_crc32c
import lmdb

from scriba.bookie import journal as jr
from scriba.bookie.compaction import CompactionResult, PassKind, Throttle
from scriba.bookie.entry_log import EntryLogs
from scriba.bookie.entry_log_meta import LogMetaTable
from scriba.bookie.fileio import FileIO, default_fileio
from scriba.bookie.journal import DiskFullError, Journal, JournalPosition
from scriba.bookie.ledger_index import LedgerIndex, index_records
from scriba.bookie.ledger_state import Admission, LacWaiters, LedgerState, RunAdd, admit_runs
from scriba.bookie.log_compactor import Reclaimer
from scriba.bookie.storage_api import AddColumns, AddOp, LacState, ReadOnlySwitch, StorageConfig
from scriba.bookie.write_cache import WriteCache
from scriba.errors import (
    BookieReadOnlyError,
    CorruptEntryError,
    NoSuchEntryError,
    NoSuchLedgerError,
    Status,
    StorageError,
    UnauthorizedError,
)
from scriba.invariant import InvariantViolation
from scriba.log import get_logger

__all__ = ["DiskLedgerStorage", "open_storage"]

log = get_logger(__name__)

_ADDS: Final = 1
_LAC: Final = 2
_U32: Final = struct.Struct(">I")
_U32_ARRAY_OK: Final = array("I").itemsize == 4
_KEY_RECORDS_MAX: Final = 100_000
_crc_value = google_crc32c.value
_crc_extend = google_crc32c.extend


def adds_record(
    sizes: Sequence[int], blob: bytes | None, entries: Sequence[bytes], prefix: list[bytes]
) -> bytes:
    """``prefix`` (framed records) then one framed journal ADDS record, in one buffer.

    The entries come with their ``sizes``, concatenated in ``blob`` when the caller has
    that; the bytes are exactly ``b"".join(prefix) + journal.encode_adds(entries)`` (the
    journal's format), built with one copy of the entries and whole-batch operations.
    """
    n = len(sizes)
    size = sizes[0]
    if sizes.count(size) == n:
        lens = _U32.pack(size) * n
    elif _U32_ARRAY_OK:
        arr = array("I", sizes)
        if sys.byteorder == "little":
            arr.byteswap()
        lens = arr.tobytes()
    else:
        lens = struct.pack(f">{n}I", *sizes)
    head = b"\x01" + _U32.pack(n) + lens
    if blob is not None:
        body_len = _U32.pack(len(head) + len(blob))
        crc = _crc_extend(_crc_extend(_crc_value(body_len), head), blob)
        prefix += (body_len, _U32.pack(crc), head, blob)
        return b"".join(prefix)
    body_len = _U32.pack(len(head) + sum(sizes))
    crc = _crc_extend(_crc_value(body_len), head)
    for entry in entries:
        crc = _crc_extend(crc, entry)
    prefix += (body_len, _U32.pack(crc), head)
    prefix += entries
    return b"".join(prefix)


def _is_enospc(exc: BaseException) -> bool:
    if getattr(exc, "errno", None) == errno.ENOSPC:
        return True
    return isinstance(exc, lmdb.Error) and "No space left" in str(exc)


def _copy_state(st: LedgerState) -> LedgerState:
    return LedgerState(st.master_key, st.fenced, st.lac, st.explicit_lac, st.last_entry_id)


class DiskLedgerStorage:
    def __init__(self, config: StorageConfig, fio: FileIO, loop: asyncio.AbstractEventLoop) -> None:
        self._config = config
        self._fio = fio
        self._loop = loop
        self._entry_size_max = config.entry_size_max
        self._cache_bytes_max = config.write_cache_bytes_max
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="scriba-flush")
        self._index = LedgerIndex(config.ledger_dir / "index", config.index_map_size_bytes)
        self._logs = EntryLogs(
            config.ledger_dir / "entrylogs", fio, config.entry_log_file_bytes_max,
            self._index.next_log_id(),
        )
        self._states: dict[int, LedgerState] = {}
        self._cache = WriteCache()
        self._flushing: WriteCache | None = None
        self._dirty: set[int] = set()
        self._meta = LogMetaTable({}, {})  # loaded at open (_replay)
        self._reclaimer: Reclaimer | None = None
        self._applied_pos = JournalPosition(0, jr.FILE_HEADER_SIZE)
        self._checkpointed = JournalPosition(-1, 0)
        self._enospc = False
        self._journal_queued_bytes = 0
        self._checkpoints = 0
        self._journal_room = asyncio.Event()
        self._switch = ReadOnlySwitch()
        self._waiters = LacWaiters()
        self._flush_lock = asyncio.Lock()
        self._flush_task: asyncio.Task[None] | None = None
        self._checkpoint_tasks: set[asyncio.Task[None]] = set()  # running (shielded) checkpoints
        self._tasks: list[asyncio.Task[None]] = []
        self._journal: Journal | None = None
        self._key_records: dict[int, tuple[bytes, bytes]] = {}  # ledger -> (key, its record)
        self._closed = False
        self._locks: list[int] = []

    # --- open / replay -------------------------------------------------------------

    def _replay(self) -> int:
        """Load states and replay the journal from the checkpoint (executor thread)."""
        self._states = self._index.load_states()
        self._meta = self._load_log_meta()
        start = self._index.checkpoint_position()
        self._applied_pos = start
        deleted: set[int] = set()
        records = 0
        for rtype, body, pos in jr.replay_journal(self._config.journal_dir, self._fio, start):
            records += 1
            self._replay_record(rtype, body, deleted)
            self._applied_pos = pos
            if self._cache.bytes >= self._cache_bytes_max:  # a long tail: flush as we go
                cache, self._cache = self._cache, WriteCache()
                states = {lid: _copy_state(self._states[lid]) for lid in self._dirty
                          if lid in self._states}
                self._dirty = set()
                self._flush(cache, states, pos)
        log.info("journal_replayed", records=records, entries=self._cache.count,
                 from_file=start.file_id, from_offset=start.offset)
        return records

    def _replay_record(self, rtype: int, body: bytes, deleted: set[int]) -> None:
        if rtype == jr.ADDS:
            for e in jr.decode_adds(body):
                lid = int.from_bytes(e[0:8], "big")
                eid = int.from_bytes(e[8:16], "big", signed=True)
                st = self._states.get(lid)
                if st is None:
                    st = self._states[lid] = LedgerState(b"")
                if eid <= st.last_entry_id and self._has_entry(lid, eid):
                    continue
                self._cache.put(lid, eid, e)
                st.note_entry(eid, e)
                self._dirty.add(lid)
            return
        lid = int.from_bytes(body[1:9], "big")
        if rtype == jr.DELETE:
            dropped = [int.from_bytes(body[off : off + 8], "big") for off in range(1, len(body), 8)]
            for dl in dropped:
                self._states.pop(dl, None)
                self._cache.drop_ledger(dl)
                self._dirty.discard(dl)
                deleted.add(dl)
            # now, not at the end: a later record may re-create the ledger and get flushed
            self._index.delete_ledgers(dropped)
            self._meta.drop_ledgers(dropped)
            return
        st = self._states.get(lid)
        if st is None:
            st = self._states[lid] = LedgerState(bytes(body[9:]) if rtype == jr.MASTER_KEY else b"")
        elif rtype == jr.MASTER_KEY and not st.master_key:
            st.master_key = bytes(body[9:])
        if rtype == jr.FENCE:
            st.fenced = True
        elif rtype == jr.EXPLICIT_LAC:
            lac = int.from_bytes(body[9:17], "big", signed=True)
            st.explicit_lac = max(st.explicit_lac, lac)
            st.lac = max(st.lac, lac)
        self._dirty.add(lid)

    def _load_log_meta(self) -> LogMetaTable:
        """The entry-log accounting, rebuilt from the index when it has none (an index
        written before it existed), matched to the log files on disk, stored."""
        loaded = self._index.load_log_meta()
        if loaded is None:
            totals: dict[int, int] = {}
            live = self._index.rebuild_log_meta()
            log.info("entry_log_meta_rebuilt", logs=len(live))
        else:
            totals, live = loaded
        meta = LogMetaTable(totals, live)
        self._index.write_log_meta(meta.reconcile(self._logs.record_bytes()))
        return meta

    async def _start(self) -> None:
        await self._loop.run_in_executor(self._executor, self._replay)
        self._reclaimer = Reclaimer(
            self._logs, self._index, self._meta, loop=self._loop, executor=self._executor,
            lock=self._flush_lock, stopped=lambda: bool(self._switch.failed or self._closed),
            on_error=self._disk_error,
        )
        c = self._config
        self._journal = Journal(
            c.journal_dir, self._fio, self._loop, self._on_durable, self._on_failure,
            group_wait_ms_max=c.journal_group_wait_ms_max,
            group_bytes_max=c.journal_group_bytes_max,
            file_bytes_max=c.journal_file_bytes_max,
            sync_inline_when_idle=c.journal_sync_inline_when_idle,
        )
        self._applied_pos = self._journal.position
        self._check_disk()
        await self.checkpoint()
        self._tasks.append(self._loop.create_task(self._every(c.checkpoint_interval_s, self.checkpoint)))
        self._tasks.append(self._loop.create_task(self._every(c.disk_check_interval_s, self._check_disk_async)))

    async def _every(self, interval_s: float, fn: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await fn()
            except Exception:
                log.exception("storage_periodic_task_failed")

    # --- journal callbacks (event loop) -----------------------------------------------

    def _on_durable(self, tokens: list[Any], pos: JournalPosition) -> None:
        states = self._states
        cache = self._cache
        dirty = self._dirty
        waiters = self._waiters
        st: LedgerState | None
        for token in tokens:
            if token is None:
                continue
            if token[0] == _ADDS:
                _, adds, rest, runs = token
                for run in runs:
                    self._apply_run(run)
                if rest:
                    self._apply_each(adds.ledger_ids, adds.entry_ids, adds.entries, rest)
            else:  # explicit LAC
                _, lid, lac = token
                st = states.get(lid)
                if st is not None:
                    st.explicit_lac = max(st.explicit_lac, lac)
                    if lac > st.lac:
                        st.lac = lac
                        waiters.notify(lid)
                    dirty.add(lid)
        self._applied_pos = pos
        if cache.bytes >= self._cache_bytes_max and (
            self._flush_task is None or self._flush_task.done()
        ):
            self._flush_task = self._loop.create_task(self.checkpoint())

    def _apply_run(self, run: RunAdd) -> None:
        """Durable new entries of one ledger into the write cache (whole-run operations)."""
        lid = run.ledger_id
        st = self._states.get(lid)
        if st is None:
            return  # deleted meanwhile
        eids = run.entry_ids
        if eids[0] <= st.last_entry_id:  # another batch stored some of these meanwhile
            self._apply_each([lid] * len(eids), eids, run.entries, range(len(eids)))
            return
        if run.consecutive:
            self._cache.append_run(lid, eids[0], run.entries, run.nbytes)
        else:
            put = self._cache.put
            for eid, entry in zip(eids, run.entries, strict=True):
                put(lid, eid, entry)
        st.last_entry_id = eids[-1]
        self._dirty.add(lid)
        if run.lac > st.lac or st.lac >= eids[0]:  # an LAC, or entries it covers a poll waits to carry
            st.lac = max(st.lac, run.lac)
            if lid in self._waiters.by_ledger:
                self._waiters.notify(lid)

    def _apply_each(
        self, lids: Sequence[int], eids: Sequence[int], datas: Sequence[bytes], indexes: Sequence[int]
    ) -> None:
        """Durable adds one by one (any order, any ledgers; already stored ones skipped)."""
        states = self._states
        put = self._cache.put
        waiters = self._waiters
        waiting = waiters.by_ledger
        dirty = self._dirty
        from_bytes = int.from_bytes
        last_lid = -1
        st: LedgerState | None = None
        for i in indexes:
            lid = lids[i]
            if lid != last_lid:
                last_lid = lid
                st = states.get(lid)
                if st is None:
                    continue  # deleted meanwhile
                dirty.add(lid)
            elif st is None:
                continue
            eid = eids[i]
            if eid <= st.last_entry_id:
                if self._has_entry(lid, eid):
                    continue
            else:
                st.last_entry_id = eid
            data = datas[i]
            put(lid, eid, data)
            piggy = from_bytes(data[16:24], "big", signed=True)
            if piggy > st.lac or st.lac >= eid:  # an LAC, or an entry it covers a poll waits to carry
                st.lac = max(st.lac, piggy)
                if lid in waiting:
                    waiters.notify(lid)

    def _on_failure(self, err: StorageError) -> None:
        if isinstance(err, DiskFullError):
            self._enospc = True
            self._switch.update(disk_full=str(err))
        else:
            self._switch.update(failed=str(err))
        log.error("storage_read_only", reason=self._switch.reason)

    # --- writes -----------------------------------------------------------------------

    def _has_entry(self, ledger_id: int, entry_id: int) -> bool:
        if self._cache.has(ledger_id, entry_id):
            return True
        if self._flushing is not None and self._flushing.has(ledger_id, entry_id):
            return True
        try:
            return self._index.get(ledger_id, entry_id) is not None
        except CorruptEntryError:
            return False

    def _refused(self) -> Status | None:
        if self._switch.failed:
            return Status.STORAGE
        if self._switch.read_only or self._closed:
            return Status.READ_ONLY
        return None

    async def add_batch(self, ops: Sequence[AddOp]) -> list[Status]:
        return await self.add_columns(AddColumns.of(ops))

    async def add_columns(self, adds: AddColumns) -> list[Status]:
        refused = self._refused()
        if refused is not None:
            return [refused] * len(adds)
        keyed: list[tuple[int, bytes]] = []
        adm = admit_runs(self._states, adds, self._entry_size_max, self._has_entry, keyed)
        statuses = adm.statuses
        if not adm.count:
            return statuses
        if self._raise_carried_lacs(adm, adds):
            await asyncio.sleep(0)  # the long polls just woken answer before this batch's (inline) fdatasync
        while (
            self._cache.bytes >= 2 * self._cache_bytes_max
            and self._flush_task is not None
            and not self._flush_task.done()
        ):
            await asyncio.shield(self._flush_task)
        while self._journal_queued_bytes > self._config.journal_queue_bytes_max:
            self._journal_room.clear()
            await self._journal_room.wait()  # bounded queue: woken as groups complete
        prefix = [self._key_record(lid, key) for lid, key in keyed]
        if adm.count == len(adds):
            record = adds_record(adm.sizes, adm.blob, adds.entries, prefix)
        else:
            entries = adds.entries
            chosen = [entries[i] for i in adm.accepted()]
            record = adds_record(list(map(len, chosen)), None, chosen, prefix)
        journal = self._journal
        if journal is None:
            raise InvariantViolation("add_batch before open")
        size = len(record)
        self._journal_queued_bytes += size
        try:
            await journal.submit(record, (_ADDS, adds, adm.rest, adm.runs))
        except StorageError as exc:
            bad = Status.READ_ONLY if isinstance(exc, DiskFullError) else Status.STORAGE
            for i in adm.accepted():
                statuses[i] = bad
        finally:
            self._journal_queued_bytes -= size
            if self._journal_queued_bytes <= self._config.journal_queue_bytes_max:
                self._journal_room.set()
        return statuses

    def _raise_carried_lacs(self, adm: Admission, adds: AddColumns) -> bool:
        """Raise each ledger's LAC to the highest LAC its admitted entries carry, now,
        before they are durable here (as BookKeeper's ledger storage does on ``addEntry``):
        a carried LAC is the writer's statement that every entry up to it is confirmed on
        an ack quorum, true whether or not this bookie keeps these entries, so tailing
        readers may learn it one journal write + fdatasync earlier. Whether a long poll
        was woken (``_on_durable`` raises it again, a no-op then)."""
        states = self._states
        waiting = self._waiters.by_ledger
        woke = False
        for run in adm.runs:
            st = states.get(run.ledger_id)
            if st is not None and run.lac > st.lac:
                st.lac = run.lac
                if run.ledger_id in waiting:
                    self._waiters.notify(run.ledger_id)
                    woke = True
        for i in adm.rest:
            lid = adds.ledger_ids[i]
            st = states.get(lid)
            piggy = int.from_bytes(adds.entries[i][16:24], "big", signed=True)
            if st is not None and piggy > st.lac:
                st.lac = piggy
                if lid in waiting:
                    self._waiters.notify(lid)
                    woke = True
        return woke

    def _key_record(self, ledger_id: int, key: bytes) -> bytes:
        """The framed master-key record of a ledger (kept: one per batch is journaled)."""
        got = self._key_records.get(ledger_id)
        if got is not None and got[0] == key:
            return got[1]
        if len(self._key_records) >= _KEY_RECORDS_MAX:
            self._key_records.clear()
        record = jr.encode_master_key(ledger_id, key)
        self._key_records[ledger_id] = (key, record)
        return record

    async def _journal_write(self, record: bytes, token: Any) -> None:
        if self._switch.failed:
            raise StorageError(f"storage failed: {self._switch.failed}")
        journal = self._journal
        if journal is None:
            raise InvariantViolation("journal write before open")
        try:
            await journal.submit(record, token)
        except DiskFullError as exc:
            raise BookieReadOnlyError(f"read-only: {exc}") from exc

    def _state_for_write(self, ledger_id: int, master_key: bytes) -> tuple[LedgerState, bytes]:
        if self._switch.failed:
            raise StorageError(f"storage failed: {self._switch.failed}")
        st = self._states.get(ledger_id)
        if st is None:
            st = self._states[ledger_id] = LedgerState(master_key)
        elif st.master_key != master_key:
            raise UnauthorizedError(f"ledger {ledger_id}: master key mismatch")
        # always journaled with the record: replay must know the key (see admit_adds)
        return st, jr.encode_master_key(ledger_id, master_key)

    async def fence(self, ledger_id: int, master_key: bytes) -> LacState:
        st, key_record = self._state_for_write(ledger_id, master_key)
        st.fenced = True
        self._dirty.add(ledger_id)
        await self._journal_write(key_record + jr.encode_fence(ledger_id), None)
        log.info("ledger_fenced", ledger_id=ledger_id, lac=st.lac)
        return st.snapshot()

    async def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> None:
        if self._switch.read_only and not self._switch.failed:
            raise BookieReadOnlyError(f"read-only: {self._switch.reason}")
        st, key_record = self._state_for_write(ledger_id, master_key)
        # Visible at once, before the record is durable: the writer confirmed every entry
        # up to ``lac`` (on an ack quorum) before sending it, so it is true whether or not
        # this bookie keeps the record; tailing readers learn it now.
        self._raise_lac(st, ledger_id, lac)
        await self._journal_write(
            key_record + jr.encode_explicit_lac(ledger_id, lac), (_LAC, ledger_id, lac)
        )

    def note_lac(self, ledger_id: int, lac: int, master_key: bytes) -> None:
        st = self._state(ledger_id)
        if st.master_key != master_key:
            raise UnauthorizedError(f"ledger {ledger_id}: master key mismatch")
        self._raise_lac(st, ledger_id, lac)

    def _raise_lac(self, st: LedgerState, ledger_id: int, lac: int) -> None:
        if lac > st.lac:
            st.lac = lac
            self._waiters.notify(ledger_id)

    # --- reads --------------------------------------------------------------------------

    def _state(self, ledger_id: int) -> LedgerState:
        st = self._states.get(ledger_id)
        if st is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} not on this bookie")
        return st

    def _lookup(self, ledger_id: int, entry_id: int) -> bytes | None:
        data = self._cache.get(ledger_id, entry_id)
        if data is not None:
            return data
        if self._flushing is not None:
            data = self._flushing.get(ledger_id, entry_id)
            if data is not None:
                return data
        try:
            loc = self._index.get(ledger_id, entry_id)
        except lmdb.Error as exc:
            raise StorageError(f"index read failed: {exc}") from exc
        if loc is None:
            return None
        try:
            return self._logs.read(loc, ledger_id, entry_id)
        except OSError as exc:
            raise StorageError(f"entry log read failed: {exc}") from exc

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        st = self._state(ledger_id)
        if entry_id == -1:
            entry_id = st.last_entry_id
        data = self._lookup(ledger_id, entry_id) if entry_id >= 0 else None
        if data is None:
            raise NoSuchEntryError(f"ledger {ledger_id} entry {entry_id} not stored")
        return data

    def read_range(
        self, ledger_id: int, first: int, last: int, max_entries: int, max_bytes: int
    ) -> list[bytes]:
        """Consecutive entries from ``first``, a stretch at a time: a slice of a write-cache
        run, or the records an index run record holds back to back in one ``pread``
        (entries outside runs one by one). An entry corrupt at rest ends the range after
        the entries before it (the next range read from it raises ``CorruptEntryError``)."""
        self._state(ledger_id)
        out: list[bytes] = []
        nbytes = 0
        eid = first
        count_max = min(last - first + 1, max_entries)
        while len(out) < count_max:
            want = count_max - len(out)
            error: CorruptEntryError | None = None
            got = self._cache.run_from(ledger_id, eid, want)
            if not got and self._flushing is not None:
                got = self._flushing.run_from(ledger_id, eid, want)
            if not got:
                got, error = self._read_logged(ledger_id, eid, want)
            if not got:
                if out:
                    break
                if error is not None:
                    raise error
                raise NoSuchEntryError(f"ledger {ledger_id} entry {eid} not stored")
            ends = list(accumulate(map(len, got), initial=nbytes))
            fit = max(bisect_right(ends, max_bytes) - 1, 0 if out else 1)
            out += got[:fit] if fit < len(got) else got
            if fit < len(got) or error is not None:
                break
            nbytes = ends[-1]
            eid += len(got)
        return out

    def _read_logged(
        self, ledger_id: int, entry_id: int, count_max: int
    ) -> tuple[list[bytes], CorruptEntryError | None]:
        """Up to ``count_max`` consecutive entries from ``entry_id`` out of the entry logs:
        those that verify, and the error of the corrupt one that ends them (if any)."""
        try:
            span = self._index.span(ledger_id, entry_id, count_max)
            if span is not None:
                return self._logs.read_span(span[0], span[1], ledger_id, entry_id)
            data = self._lookup(ledger_id, entry_id)
        except CorruptEntryError as exc:
            return [], exc
        except lmdb.Error as exc:
            raise StorageError(f"index read failed: {exc}") from exc
        except OSError as exc:
            raise StorageError(f"entry log read failed: {exc}") from exc
        return ([] if data is None else [data]), None

    def lac_state(self, ledger_id: int) -> LacState:
        return self._state(ledger_id).snapshot()

    def ledger_master_key(self, ledger_id: int) -> bytes | None:
        st = self._states.get(ledger_id)
        return None if st is None else st.master_key

    def check_master_key(self, ledger_id: int, master_key: bytes) -> None:
        if self._state(ledger_id).master_key != master_key:
            raise UnauthorizedError(f"ledger {ledger_id}: master key mismatch")

    async def wait_lac(self, ledger_id: int, previous_lac: int, timeout_s: float, *, entry: bool = False) -> LacState:
        return await self._waiters.wait_for_lac(
            self._states, self._state, ledger_id, previous_lac,
            min(timeout_s, self._config.lac_wait_timeout_s_max),
            stopped=lambda: self._closed, entry=entry,
        )

    def ledger_ids(self) -> list[int]:
        return sorted(self._states)

    # --- checkpoint, GC ------------------------------------------------------------------

    async def checkpoint(self) -> None:
        """Flush the write cache, commit the index and the journal position.

        Runs to its end even when the caller is cancelled (e.g. the periodic task at
        close): a checkpoint stopped between swapping the cache out and committing the
        index would lose the swapped entries while a later checkpoint records a journal
        position past them.
        """
        task = self._loop.create_task(self._checkpoint_under_lock())
        self._checkpoint_tasks.add(task)
        task.add_done_callback(self._checkpoint_done)
        await asyncio.shield(task)

    def _checkpoint_done(self, task: asyncio.Task[None]) -> None:
        self._checkpoint_tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved even when its awaiter was cancelled meanwhile

    async def _checkpoint_under_lock(self) -> None:
        async with self._flush_lock:
            await self._checkpoint_locked()

    async def _checkpoint_locked(self) -> None:
        if self._switch.failed or self._journal is None:
            return
        if not self._cache.count and not self._dirty and self._applied_pos == self._checkpointed:
            return
        cache, self._cache = self._cache, WriteCache()
        self._flushing = cache
        pos = self._applied_pos
        states = {lid: _copy_state(self._states[lid]) for lid in self._dirty if lid in self._states}
        dirty, self._dirty = self._dirty, set()
        try:
            await self._loop.run_in_executor(self._executor, self._flush, cache, states, pos)
        except (OSError, StorageError, lmdb.Error) as exc:
            for lid, entries in cache.ledgers.items():
                if lid in self._states:
                    for eid, e in entries.items():
                        self._cache.put(lid, eid, e)
            self._dirty |= dirty
            self._flushing = None
            self._disk_error(exc, "checkpoint")  # on a full disk: retried once space is back
            return
        self._flushing = None
        self._checkpointed = pos
        self._checkpoints += 1

    def _disk_error(self, exc: BaseException, what: str) -> None:
        """A failed entry-log write or index commit (flush or compaction): the current
        log's tail may be partial, never append to it again; a full disk makes the storage
        read-only until space is back, anything else fails it for good."""
        self._logs.abandon_current()
        if _is_enospc(exc):
            self._enospc = True
            self._switch.update(disk_full=f"{what}: disk full ({exc})")
        else:
            self._switch.update(failed=f"{what} failed: {exc}")
            if self._journal is not None:
                self._journal.fail(StorageError(self._switch.failed))
        log.error(f"{what}_failed", error=str(exc), reason=self._switch.reason)

    def _flush(self, cache: WriteCache, states: dict[int, LedgerState], pos: JournalPosition) -> None:
        segments = list(cache.segments())
        datas: list[bytes] = []
        for _, _, run in segments:
            datas += run
        spans = self._logs.append_spans(datas) if datas else []
        self._logs.sync()
        runs, locs, added = index_records(segments, spans)
        update = self._meta.stage(self._logs.take_written(), added)
        self._index.commit(locs, states, update, pos, self._logs.next_log_id, runs=runs)
        self._meta.apply(update)
        journal = self._journal
        if journal is not None:
            journal.trim(pos)

    async def delete_ledgers(self, ledger_ids: Collection[int]) -> None:
        """Drop the ledgers (journaled, then index and entry-log accounting). Their bytes
        in the entry logs are dead from here: :meth:`compact` gives them back."""
        lids = sorted(set(ledger_ids))
        if not lids:
            return
        async with self._flush_lock:
            if not self._switch.failed and self._journal is not None:
                with contextlib.suppress(StorageError, BookieReadOnlyError):
                    await self._journal_write(jr.encode_delete(lids), None)
            for lid in lids:
                self._states.pop(lid, None)
                self._cache.drop_ledger(lid)
                self._dirty.discard(lid)
                self._waiters.notify(lid)
            if self._switch.failed:
                return
            freed = await self._loop.run_in_executor(self._executor, self._drop_from_index, lids)
        log.info("ledgers_deleted", count=len(lids), dead_bytes=freed)

    def _drop_from_index(self, lids: list[int]) -> int:
        self._index.delete_ledgers(lids)
        return self._meta.drop_ledgers(lids)

    async def compact(
        self, live_ratio_max: float, *, throttle: Throttle | None = None, kind: PassKind = PassKind.NONE
    ) -> CompactionResult:
        """One GC pass over the entry logs: remove those with nothing live, compact those
        whose live ratio is under ``live_ratio_max`` (0: none), rolling the current log
        first when it is one of them (``log_compactor.Reclaimer``)."""
        if self._reclaimer is None:
            return CompactionResult(kind)
        return await self._reclaimer.run(live_ratio_max, throttle, kind)

    # --- state ------------------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        return self._switch.read_only

    @property
    def read_only_reason(self) -> str:
        return self._switch.reason

    def disk_usage(self) -> tuple[int, int]:
        usage = shutil.disk_usage(self._config.ledger_dir)
        return usage.free, usage.total

    def _check_disk(self) -> None:
        used_max = 0.0
        for d in {self._config.ledger_dir, self._config.journal_dir}:
            usage = shutil.disk_usage(d)
            if usage.used + usage.free > 0:  # as df's Use%: blocks reserved for root excluded
                used_max = max(used_max, usage.used / (usage.used + usage.free))
        c = self._config
        if used_max >= c.disk_usage_threshold:
            if not self._switch.disk_full:
                log.warning("disk_full", used=round(used_max, 4), threshold=c.disk_usage_threshold)
            self._switch.update(disk_full=f"disk usage {used_max:.1%} >= {c.disk_usage_threshold:.0%}")
        elif used_max < c.disk_usage_lwm and self._switch.disk_full:
            if self._enospc and not self._probe_space():
                return  # statvfs says there is room, but writes still fail (quota, inodes...)
            log.info("disk_space_back", used=round(used_max, 4))
            self._enospc = False
            self._switch.update(disk_full="")

    def _probe_space(self) -> bool:
        """After an ENOSPC: can each dir take a small durable write again?"""
        for d in {self._config.ledger_dir, self._config.journal_dir}:
            path = Path(d) / ".space-probe"
            try:
                fd = self._fio.open(path, create=True)
                try:
                    self._fio.write(fd, b"\0" * 4096)
                    self._fio.fdatasync(fd)
                finally:
                    self._fio.close(fd)
                    self._fio.remove(path)
            except OSError:
                return False
        return True

    async def _check_disk_async(self) -> None:
        was_full = bool(self._switch.disk_full)
        self._check_disk()
        if was_full and not self._switch.disk_full and self._cache.bytes:
            await self.checkpoint()

    def add_state_listener(self, cb: Callable[[bool, str], None]) -> None:
        self._switch.add_listener(cb)

    async def set_read_only(self, read_only: bool, reason: str) -> None:
        self._switch.update(forced=(reason or "operator") if read_only else "")

    def stats(self) -> dict[str, float]:
        """Figures for metrics (gauges/counters; names carry their units)."""
        j = self._journal
        return {
            "journal_groups_total": j.groups if j else 0,
            "journal_records_total": j.records if j else 0,
            "journal_write_sync_seconds_total": j.syncs_seconds if j else 0.0,
            "journal_queued_bytes": self._journal_queued_bytes,
            "write_cache_bytes": self._cache.bytes,
            "write_cache_entries": self._cache.count,
            "checkpoints_total": self._checkpoints,
            "ledgers": len(self._states),
            **self._entry_log_stats(),
            "read_only": 1 if self._switch.read_only else 0,
        }

    def _entry_log_stats(self) -> dict[str, float]:
        usages = self._meta.usages()
        total = sum(u.total_bytes for u in usages)
        live = sum(u.live_bytes for u in usages)
        progress = self._reclaimer.progress if self._reclaimer is not None else None
        return {
            "entry_logs": len(usages),
            "entry_log_bytes": total,
            "entry_log_live_bytes": live,
            "entry_log_reclaimable_bytes": total - live,
            "compaction_running": 1 if progress is not None and progress.running else 0,
            "compaction_pass_bytes": progress.pass_bytes if progress is not None else 0,
            "compaction_pass_scanned_bytes": progress.scanned_bytes if progress is not None else 0,
        }

    def journal_stats(self) -> dict[str, float]:
        j = self._journal
        if j is None:
            return {}
        return {"groups": j.groups, "records": j.records, "sync_seconds": j.syncs_seconds}

    async def close(self) -> None:
        """Graceful: finish queued journal writes, checkpoint, release everything."""
        if self._closed:
            return
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._journal is not None:
            await self.checkpoint()
        self._closed = True
        self._waiters.notify_all()
        await self._release(abandon=False)

    async def abandon(self) -> None:
        """Test hook, as a crash: stop without flushing anything not yet durable."""
        self._closed = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        async with self._flush_lock:
            await self._release(abandon=True)

    async def _release(self, *, abandon: bool) -> None:
        if self._journal is not None:
            journal = self._journal
            await self._loop.run_in_executor(None, lambda: journal.close(abandon=abandon))
        self._executor.shutdown(wait=True)
        self._logs.close()
        self._index.close()
        locks, self._locks = self._locks, []
        for fd in locks:
            os.close(fd)


def _make_dirs(config: StorageConfig) -> None:
    for d in (config.journal_dir, config.ledger_dir, config.ledger_dir / "entrylogs"):
        Path(d).mkdir(parents=True, exist_ok=True)


def _lock_dirs(config: StorageConfig) -> list[int]:
    """Hold an exclusive lock on each dir: two processes on one journal would corrupt it."""
    fds: list[int] = []
    try:
        for d in dict.fromkeys([Path(config.journal_dir), Path(config.ledger_dir)]):
            fd = os.open(d / "LOCK", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StorageError(f"{d}: in use by another storage (LOCK held)") from None
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


async def open_storage(config: StorageConfig, *, fileio: FileIO | None = None) -> DiskLedgerStorage:
    """Open (creating dirs), replay the journal from the last checkpoint, and checkpoint."""
    config.validate()
    _make_dirs(config)
    locks = _lock_dirs(config)
    try:
        storage = DiskLedgerStorage(config, fileio or default_fileio(), asyncio.get_running_loop())
    except BaseException:
        for fd in locks:
            os.close(fd)
        raise
    storage._locks = locks
    try:
        await storage._start()
    except BaseException:
        await storage._release(abandon=True)
        raise
    return storage
