"""Copying the live entries of a sealed entry log to the current log, a step at a time.

A step (on the storage's flusher thread, under its flush lock) reads the whole records
of about ``bytes_max`` bytes from an offset of the log, keeps those the index still
points at (same log, same offset: anything else is dead or was moved already), appends
them to the current log and fdatasyncs it, then commits in ONE index transaction their
new records (consecutive entries of a ledger as one run record), the old run records
that held them split (entries not moved keep their old location) and the accounting
(``entry_log_meta``). The step that reaches the end of the log also marks it removed;
the storage deletes the file after that commit.

Crash safety, step by step: before the commit, the index still points at the old log,
which is still there (the copies are dead bytes of the current log, counted as such at
the next open); after the commit, the index points at synced copies; a log file whose
row is gone is all dead and removed by the next GC. Nothing live is ever only in a file
about to be deleted.

A log that cannot be read to its end (a bad record) is kept, unless everything the
accounting says is live in it was found and moved before the damage (a torn tail).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import lmdb

from scriba.bookie.compaction import CompactionResult, PassKind, Throttle, plan_pass
from scriba.bookie.entry_log import FILE_HEADER_SIZE, REC_HEADER_SIZE, EntryLogs, Record, ScanState
from scriba.bookie.entry_log_meta import LogLedger, LogMetaTable, LogMetaUpdate
from scriba.bookie.ledger_index import LedgerIndex, entry_key, index_records
from scriba.errors import StorageError
from scriba.log import get_logger

log = get_logger(__name__)

STEP_BYTES_MAX: Final = 4 * 1024 * 1024  # entry-log bytes read per step (flush lock held)


@dataclass(frozen=True, slots=True)
class Step:
    offset: int  # where the next step starts
    state: ScanState
    finished: bool  # every live entry moved: the file may be deleted
    bytes_scanned: int
    entries_copied: int
    bytes_copied: int
    log_bytes: int  # the log's total bytes (when finished: what removing it gives back)


class LogCompactor:
    def __init__(self, logs: EntryLogs, index: LedgerIndex, meta: LogMetaTable) -> None:
        self._logs = logs
        self._index = index
        self._meta = meta

    def step(self, log_id: int, offset: int, bytes_max: int) -> Step:
        records, next_offset, state = self._logs.scan_chunk(log_id, offset, bytes_max)
        moved: list[Record] = []
        split: set[bytes] = set()
        # every record is looked up (not only those of ledgers the accounting says are live
        # here): what is moved never depends on the accounting being right
        for rec, got in zip(records, self._index.locate_many((r[0], r[1]) for r in records), strict=True):
            if got is None or isinstance(got, Exception):
                continue  # deleted, or its record is corrupt: nothing to move
            (at_log, at_offset, _), run_key = got
            if at_log == log_id and at_offset == rec[2]:
                moved.append(rec)
                if run_key is not None:
                    split.add(run_key)
        update = LogMetaUpdate()
        runs: list[tuple[bytes, bytes]] = []
        singles: list[tuple[bytes, bytes]] = []
        copied = 0
        out: dict[LogLedger, int] = {}
        if moved:
            spans = self._logs.append_spans([r[3] for r in moved])
            self._logs.sync()
            runs, singles, added = index_records(_segments(moved), spans)
            for lid, _, _, data in moved:
                out[(log_id, lid)] = out.get((log_id, lid), 0) + REC_HEADER_SIZE + len(data)
            copied = sum(out.values())
            update = self._meta.stage(self._logs.take_written(), added, out)
        usage = self._meta.usage(log_id)
        total = usage.total_bytes if usage is not None else 0
        left = (usage.live_bytes if usage is not None else 0) - copied
        finished = state is ScanState.END or (state is ScanState.DAMAGED and left <= 0)
        if finished:
            if left > 0:  # the accounting said more was live: the index is the truth
                log.warning("entry_log_accounting_off", log_id=log_id, live_bytes_unfound=left)
            update = LogMetaUpdate(
                update.totals, {**update.usage, **self._meta.forget_live(log_id).usage}, (log_id,)
            )
        if update:
            self._index.commit_moves(
                runs, singles, [entry_key(r[0], r[1]) for r in moved], split, update,
                self._logs.next_log_id,
            )
            self._meta.apply(update)
        return Step(next_offset, state, finished, next_offset - offset, len(moved), copied, total)


def _retrieved(task: asyncio.Task[Step | None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("compaction_step_failed", error=repr(task.exception()))


def _segments(records: Sequence[Record]) -> list[tuple[int, Sequence[int], list[bytes]]]:
    """Records as (ledger, entry ids, entries): consecutive ids of one ledger as a ``range``
    (indexed as one run record), a lone entry as a one-item list (a single record)."""
    out: list[tuple[int, Sequence[int], list[bytes]]] = []
    i = 0
    n = len(records)
    while i < n:
        lid, first = records[i][0], records[i][1]
        j = i + 1
        while j < n and records[j][0] == lid and records[j][1] == first + (j - i):
            j += 1
        datas = [r[3] for r in records[i:j]]
        out.append((lid, range(first, first + (j - i)) if j - i > 1 else [first], datas))
        i = j
    return out


@dataclass(slots=True)
class Progress:
    """The pass under way: bytes of the logs it compacts, and how many are scanned."""

    running: bool = False
    pass_bytes: int = 0
    scanned_bytes: int = 0


class Reclaimer:
    """Runs GC passes over a storage's entry logs (event loop), each step on the flusher
    thread under the flush lock; between steps the lock is free (checkpoints go on) and
    the throttle's pause is taken. ``stopped()``: the storage failed or closed;
    ``on_error(exc, what)``: a disk or index error (the storage decides what it means)."""

    def __init__(
        self,
        logs: EntryLogs,
        index: LedgerIndex,
        meta: LogMetaTable,
        *,
        loop: asyncio.AbstractEventLoop,
        executor: concurrent.futures.Executor,
        lock: asyncio.Lock,
        stopped: Callable[[], bool],
        on_error: Callable[[BaseException, str], None],
    ) -> None:
        self._logs = logs
        self._index = index
        self._meta = meta
        self._compactor = LogCompactor(logs, index, meta)
        self._loop = loop
        self._executor = executor
        self._lock = lock
        self._stopped = stopped
        self._on_error = on_error
        self.progress = Progress()

    async def run(self, live_ratio_max: float, throttle: Throttle | None, kind: PassKind) -> CompactionResult:
        result = CompactionResult(kind)
        if self._stopped():
            return result
        current = self._logs.current_id
        plan = plan_pass(self._meta.usages(), current, live_ratio_max)
        try:
            if plan.roll_current or plan.remove:
                async with self._lock:
                    if self._stopped():
                        return result
                    if plan.roll_current and self._logs.current_id == current:
                        await self._loop.run_in_executor(self._executor, self._logs.seal_current)
                        result.rolled = True
                    await self._remove_dead(plan.remove, result)
            pending = [u for u in map(self._meta.usage, plan.compact) if u is not None]
            self.progress = Progress(True, sum(u.total_bytes for u in pending), 0)
            for usage in pending:
                if not await self._compact_log(usage.log_id, throttle, result):
                    break
        except (OSError, StorageError, lmdb.Error) as exc:
            self._on_error(exc, "compaction")
        finally:
            self.progress.running = False
        if result.logs_removed or result.logs_compacted or result.logs_skipped:
            log.info("entry_logs_reclaimed", **result.as_dict())
        return result

    async def _remove_dead(self, log_ids: Sequence[int], result: CompactionResult) -> None:
        """Under the lock: forget logs still dead and not current, then delete their files."""
        dead = [
            u for u in map(self._meta.usage, log_ids)
            if u is not None and u.live_bytes == 0 and u.log_id != self._logs.current_id
        ]
        if not dead:
            return
        update = LogMetaUpdate({}, {}, tuple(u.log_id for u in dead))
        await self._loop.run_in_executor(self._executor, self._index.write_log_meta, update)
        self._meta.apply(update)
        for u in dead:
            self._logs.remove(u.log_id)  # on the loop: no read is between lookup and pread
            result.logs_removed += 1
            result.bytes_reclaimed += FILE_HEADER_SIZE + u.total_bytes

    async def _compact_log(self, log_id: int, throttle: Throttle | None, result: CompactionResult) -> bool:
        """Compact one log step by step; False when the pass must stop (storage stopped)."""
        offset = FILE_HEADER_SIZE
        step_bytes = throttle.step_bytes(STEP_BYTES_MAX) if throttle is not None else STEP_BYTES_MAX
        copied = 0
        while True:
            # shielded: a step runs to its end (file removal included) if the pass is cancelled
            task = self._loop.create_task(self._step(log_id, offset, step_bytes))
            task.add_done_callback(_retrieved)  # its error is seen even with no one awaiting it
            step = await asyncio.shield(task)
            if step is None:
                return not self._stopped()
            self.progress.scanned_bytes += step.bytes_scanned
            result.entries_copied += step.entries_copied
            result.bytes_copied += step.bytes_copied
            copied += step.bytes_copied
            if throttle is not None:  # after every step: a pass of many small logs is paced too
                await asyncio.sleep(throttle.delay_s(step.bytes_scanned, step.entries_copied))
            if step.finished:
                result.logs_compacted += 1
                result.bytes_reclaimed += FILE_HEADER_SIZE + step.log_bytes - copied
                return True
            if step.state is not ScanState.MORE:
                result.logs_skipped += 1
                log.error("entry_log_compaction_skipped", log_id=log_id, offset=step.offset,
                          reason="unreadable record")
                return True
            offset = step.offset

    async def _step(self, log_id: int, offset: int, step_bytes: int) -> Step | None:
        """One step under the lock (None: storage stopped, or the log is current or gone)."""
        async with self._lock:
            if self._stopped() or log_id == self._logs.current_id or log_id not in self._meta:
                return None
            step = await self._loop.run_in_executor(
                self._executor, self._compactor.step, log_id, offset, step_bytes
            )
            if step.finished:
                self._logs.remove(log_id)  # the index no longer points into it
            return step
