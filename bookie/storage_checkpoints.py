"""Restart, checkpoints and space of ``DiskLedgerStorage`` (a layer of it, see
``storage_parts``).

A checkpoint swaps the write cache out, appends its entries to the current entry log,
fdatasyncs it, commits locations (one index record per run of consecutive entries) +
ledger states + the journal position in one LMDB transaction, then removes journal files
wholly before that position. A checkpoint runs to its end even if its caller is
cancelled; a failed one puts the swapped entries back (``_disk_error`` decides between
read-only and failed).

Restart (``_replay``, run by ``open_storage``): load states and the checkpoint position
from the index, replay the journal from there (idempotently: entries already indexed are
skipped), cut the journal at the first torn/corrupt record, then checkpoint. A long tail
is flushed as it is replayed, so the write cache stays bounded.

Space: every flush and compaction step records, in the same index transaction, each
entry log's total bytes and each ledger's live bytes in it (``entry_log_meta``).
``delete_ledgers`` only makes bytes dead; ``compact`` (run by the bookie's GC,
``gc.py``) removes logs with nothing live and copies the live entries of sparse logs to
the current log (``log_compactor``), under the flush lock a step at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection

import lmdb

from scriba.bookie import journal as jr
from scriba.bookie.compaction import CompactionResult, PassKind, Throttle
from scriba.bookie.entry_log_meta import LogMetaTable
from scriba.bookie.journal import JournalPosition
from scriba.bookie.ledger_index import index_records
from scriba.bookie.ledger_state import LedgerState
from scriba.bookie.storage_parts import StorageParts
from scriba.bookie.write_cache import WriteCache
from scriba.errors import BookieReadOnlyError, StorageError
from scriba.log import get_logger

__all__ = ["StorageCheckpoints"]

log = get_logger(__name__)


def _copy_state(st: LedgerState) -> LedgerState:
    return LedgerState(st.master_key, st.fenced, st.lac, st.explicit_lac, st.last_entry_id)


class StorageCheckpoints(StorageParts):
    """Restart, checkpoints, deletion and compaction (see the module docstring)."""

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
