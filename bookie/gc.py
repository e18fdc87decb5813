"""Garbage collection of ledgers deleted from the metadata store.

Each cycle: take the ledger ids storage knows, list every ledger in the metadata store,
and for each stored ledger missing from the listing ask the store for it directly.
Only a ledger *positively* absent — missing from a complete listing and answered
``NoSuchKeyError`` by a get — in two consecutive cycles is deleted (the first cycle
only marks it suspect: this leaves a full interval for races with a ledger being
created, and for operators noticing a wrong metadata prefix). Any other error (store unreachable, listing
cut short, timeout) keeps everything for this cycle. Storage reclaims the space
(index entries dropped, entry logs compacted by their live ratio).

Invariant: nothing referenced by a ledger record in the store is ever deleted.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

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
    ) -> None:
        self._storage = storage
        self._store = store
        self._metrics = metrics
        self._bookie_id = bookie_id
        self._interval_s = interval_s
        self._op_timeout_s = op_timeout_s
        self._task: asyncio.Task[None] | None = None
        self._suspects: set[int] = set()  # positively absent in the previous cycle

    async def run_once(self) -> GcResult:
        stored = set(self._storage.ledger_ids())
        if not stored:
            self._suspects.clear()
            return GcResult(0, (), 0)
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
        absent = confirmed
        if absent:
            await self._storage.delete_ledgers(absent)
            self._metrics.gc_deleted.inc(len(absent))
            log.info("gc_deleted_ledgers", bookie_id=self._bookie_id, count=len(absent),
                     ledger_ids=absent[:20])
        return GcResult(len(stored), tuple(absent), kept)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.run_once()
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
