"""Garbage collection: ledgers deleted from the metadata store, then their disk space.

Each cycle (every ``interval_s``, or at once when :meth:`GarbageCollector.request`ed,
e.g. by ``POST /api/gc`` on the bookie's HTTP endpoint) does two things.

1. Ledgers. Take the ledger ids storage knows, list every ledger in the metadata store,
   and for each stored ledger missing from the listing ask the store for it directly.
   Only a ledger *positively* absent — missing from a complete listing and answered
   ``NoSuchKeyError`` by a get — in two consecutive cycles is deleted (the first cycle
   only marks it suspect: this leaves a full interval for races with a ledger being
   created, and for operators noticing a wrong metadata prefix; a requested cycle counts
   as a cycle). Any other error (store unreachable, listing cut short, timeout) keeps
   everything for this cycle.
2. Entry logs, whatever step 1 found (also when the store cannot be reached): storage
   removes the logs with nothing live and, when a minor or major compaction is due by
   its interval (or was requested), compacts the logs under its live-ratio threshold,
   throttled (``compaction.py``: the schedule; ``log_compactor.py``: the copying).

Invariant: nothing referenced by a ledger record in the store is ever deleted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from scriba.bookie.compaction import (
    CompactingStorage,
    CompactionPolicy,
    CompactionResult,
    CompactionSchedule,
    Throttle,
)
from scriba.bookie.metrics import BookieMetrics
from scriba.bookie.storage_api import LedgerStorage
from scriba.errors import NoSuchKeyError, ScribaError
from scriba.log import get_logger
from scriba.meta.records import LEDGERS_PREFIX, ledger_id_from_key, ledger_key
from scriba.meta.store import MetadataStore

log = get_logger(__name__)

GC_DELETES_PER_CYCLE_MAX = 10_000


@dataclass(frozen=True, slots=True)
class GcResult:
    stored: int
    deleted: tuple[int, ...]
    kept_on_error: int
    compaction: CompactionResult | None = None  # None: storage has no entry logs

    def as_dict(self) -> dict[str, object]:
        return {
            "stored": self.stored, "deleted": len(self.deleted), "kept_on_error": self.kept_on_error,
            "compaction": self.compaction.as_dict() if self.compaction is not None else None,
        }


class GarbageCollector:
    def __init__(
        self,
        storage: LedgerStorage,
        store: MetadataStore,
        metrics: BookieMetrics,
        *,
        bookie_id: str,
        interval_s: float,
        op_timeout_s: float = 30.0,
        policy: CompactionPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._storage = storage
        self._store = store
        self._metrics = metrics
        self._bookie_id = bookie_id
        self._interval_s = interval_s
        self._op_timeout_s = op_timeout_s
        self._clock = clock
        policy = policy or CompactionPolicy()
        self._schedule = CompactionSchedule(policy, clock())
        self._throttle = Throttle(policy.rate_bytes_per_s, policy.rate_entries_per_s, clock)
        self._task: asyncio.Task[None] | None = None
        self._suspects: set[int] = set()  # positively absent in the previous cycle
        self._lock = asyncio.Lock()  # one cycle at a time
        self._wake = asyncio.Event()
        self._force_major = False
        self._force_minor = False
        self.cycles = 0  # cycles completed
        self.running = False
        self.last: GcResult | None = None
        self.last_error = ""

    async def run_once(self, *, force_major: bool = False, force_minor: bool = False) -> GcResult:
        """One cycle now (after any under way). Raises what the metadata store raised,
        once the entry logs were taken care of."""
        async with self._lock:
            self.running = True
            try:
                error: BaseException | None = None
                try:
                    stored, deleted, kept = await self._collect_ledgers()
                except (ScribaError, TimeoutError, OSError) as exc:
                    error, stored, deleted, kept = exc, 0, (), 0
                compaction = await self._compact(force_major, force_minor)
                self.last = GcResult(stored, deleted, kept, compaction)
                self.last_error = repr(error) if error is not None else ""
                if error is not None:
                    raise error
                return self.last
            finally:
                self.cycles += 1
                self.running = False

    async def _collect_ledgers(self) -> tuple[int, tuple[int, ...], int]:
        stored = set(self._storage.ledger_ids())
        if not stored:
            self._suspects.clear()
            return 0, (), 0
        listed: set[int] = set()
        async with asyncio.timeout(self._op_timeout_s):
            async for key, _ in self._store.scan(LEDGERS_PREFIX):
                try:
                    listed.add(ledger_id_from_key(key))
                except ValueError:
                    continue
        candidates = sorted(stored - listed)[:GC_DELETES_PER_CYCLE_MAX]
        absent: list[int] = []
        kept = 0
        for ledger_id in candidates:
            try:
                await asyncio.wait_for(self._store.get(ledger_key(ledger_id)), self._op_timeout_s)
            except NoSuchKeyError:
                absent.append(ledger_id)
            except (ScribaError, TimeoutError, OSError) as exc:
                kept += 1
                log.warning("gc_kept_on_error", bookie_id=self._bookie_id, ledger_id=ledger_id, error=str(exc))
        confirmed = [lid for lid in absent if lid in self._suspects]
        self._suspects = set(absent) - set(confirmed)
        if confirmed:
            await self._storage.delete_ledgers(confirmed)
            self._metrics.gc_deleted.inc(len(confirmed))
            log.info("gc_deleted_ledgers", bookie_id=self._bookie_id, count=len(confirmed),
                     ledger_ids=confirmed[:20])
        return len(stored), tuple(confirmed), kept

    async def _compact(self, force_major: bool, force_minor: bool) -> CompactionResult | None:
        storage = self._storage
        if not isinstance(storage, CompactingStorage):
            return None
        due = self._schedule.due(self._clock(), force_major=force_major, force_minor=force_minor)
        result = await storage.compact(due.threshold, throttle=self._throttle, kind=due.kind)
        self._schedule.ran(due.kind, self._clock())
        self._metrics.count_compaction(result)
        return result

    def request(self, *, major: bool = False, minor: bool = False) -> int:
        """Run a cycle as soon as possible (``major``/``minor``: compact as that pass even
        if its interval has not passed). The number of the cycle that will have run once
        ``cycles`` reaches it."""
        self._force_major |= major
        self._force_minor |= minor
        self._wake.set()
        return self.cycles + (2 if self.running else 1)

    def status(self) -> dict[str, object]:
        return {
            "cycles_completed": self.cycles,
            "running": self.running,
            "requested": self._wake.is_set(),
            "last": self.last.as_dict() if self.last is not None else None,
            "last_error": self.last_error,
        }

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self._interval_s)
            except TimeoutError:
                pass
            self._wake.clear()
            major, minor = self._force_major, self._force_minor
            self._force_major = self._force_minor = False
            try:
                await self.run_once(force_major=major, force_minor=minor)
                self._metrics.gc_runs.labels(outcome="ok").inc()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep everything; try next cycle
                self._metrics.gc_runs.labels(outcome="error").inc()
                log.warning("gc_cycle_failed", bookie_id=self._bookie_id, error=repr(exc))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
