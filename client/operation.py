"""The driver of one-shot cores (recovery, range reads, LAC reads) and ``recover_ledger``.

An ``Operation`` runs one core whose inputs arrive from tasks, transport callbacks and
timers through one queue, so the core sees one event at a time. Consecutive ids asked of
one bookie are one range read; with a transport that reads runs, each answer chunk
reaches the core as one event (``on_run``), not one per entry.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from scriba.client.driver import DriverConfig, as_scriba_error, update_record
from scriba.client.effects import (
    DeliverEntries,
    Effects,
    OperationDone,
    OperationFailed,
    ReadEntries,
    ReadLac,
    SendAdd,
    StartTimer,
    WriteMetadata,
)
from scriba.client.recovery_core import RecoveryConfig, RecoveryCore
from scriba.client.transport import BookieTransport, EntryRun, LacResult
from scriba.client.write_core import ChooseReplacement, RegionOf
from scriba.entry import Digest
from scriba.errors import (
    CorruptEntryError,
    InternalError,
    ScribaError,
    Status,
)
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.log import get_logger
from scriba.meta.records import LedgerMetadata
from scriba.meta.store import MetadataStore

log = get_logger(__name__)


class Operation:
    """Runs one core whose inputs arrive from tasks, transport callbacks and timers."""

    def __init__(
        self,
        core: Any,
        *,
        ledger_id: int,
        store: MetadataStore,
        transport: BookieTransport,
        master_key: bytes,
        config: DriverConfig,
    ) -> None:
        self._core = core
        self._ledger_id = LedgerId(ledger_id)
        self._store = store
        self._transport = transport
        self._master_key = master_key
        self._config = config
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[Callable[[], Effects]] = asyncio.Queue()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: list[asyncio.TimerHandle] = []
        self.result: object = None

    async def run(self, first: Effects) -> AsyncIterator[tuple[Any, ...]]:
        """Yield delivered batches; return when done; raise the failure."""
        try:
            pending: list[Effects] = [first]
            while True:
                for effects in pending:
                    for effect in effects:
                        kind = type(effect)
                        if kind is DeliverEntries:
                            yield effect.entries  # type: ignore[union-attr]
                        elif kind is OperationDone:
                            self.result = effect.value  # type: ignore[union-attr]
                            return
                        elif kind is OperationFailed:
                            raise effect.error  # type: ignore[union-attr]
                        else:
                            self._start(effect)
                event = await self._events.get()
                pending = [event()]
        finally:
            for task in self._tasks:
                task.cancel()
            for timer in self._timers:
                timer.cancel()

    def _post(self, event: Callable[[], Effects]) -> None:
        self._events.put_nowait(event)

    def _spawn(self, coro: Any) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _start(self, effect: Any) -> None:
        kind = type(effect)
        core = self._core
        if kind is SendAdd:
            def on_response(b: BookieId, _l: LedgerId, e: EntryId, s: Status) -> None:
                self._post(lambda: core.on_add_response(b, e, s))

            for bookie_id in effect.bookies:
                self._transport.add(
                    bookie_id, self._ledger_id, effect.entry_id, self._master_key, effect.entry,
                    on_response, recovery=effect.recovery,
                )
        elif kind is ReadLac:
            self._spawn(self._read_lac(effect))
        elif kind is ReadEntries:
            self._spawn(self._read_entries(effect))
        elif kind is WriteMetadata:
            self._spawn(self._write_metadata(effect))
        elif kind is StartTimer:
            key = effect.key
            self._timers.append(
                self._loop.call_later(effect.delay_s, self._post, lambda: core.on_timer(key))
            )
        else:
            raise InternalError(f"operation: unexpected effect {effect!r}")

    async def _read_lac(self, effect: ReadLac) -> None:
        bookie_id = effect.bookie_id
        result: LacResult | None = None
        try:
            result = await self._transport.read_lac(
                bookie_id, self._ledger_id, fence=effect.fence, master_key=self._master_key,
                timeout_s=self._config.read_timeout_s,
            )
            status = Status.OK
        except ScribaError as exc:
            status = exc.status
        self._post(lambda: self._core.on_lac_response(bookie_id, result, status))

    async def _read_entries(self, effect: ReadEntries) -> None:
        ids = effect.entry_ids
        if effect.fence or len(ids) == 1:
            await asyncio.gather(*(self._read_one(effect.bookie_id, e, effect.fence) for e in ids))
            return
        # Consecutive runs are range reads; single ids are entry reads.
        runs: list[tuple[int, int]] = []
        start = prev = ids[0]
        for entry_id in ids[1:]:
            if entry_id != prev + 1:
                runs.append((start, prev))
                start = entry_id
            prev = entry_id
        runs.append((start, prev))
        await asyncio.gather(*(
            self._read_one(effect.bookie_id, EntryId(a), False) if a == b
            else self._read_run(effect.bookie_id, a, b)
            for a, b in runs
        ))

    async def _read_run(self, bookie_id: BookieId, next_id: int, last: int) -> None:
        """Range reads of ``next_id..last`` from one replica.

        With a transport that reads runs (``read_runs``), each run goes to the core as it
        arrives, whole (``on_run``, or split for a core without it). A short answer
        continues with a range read from the next entry. An entry that is corrupt at
        rest is reported alone and the range goes on after it; any other error
        (missing, unavailable, timeout) reports every remaining entry at once, so the
        core asks the next replica for them together (again a range read).
        """
        read_runs = getattr(self._transport, "read_runs", None)
        while next_id <= last:
            try:
                if read_runs is not None:
                    runs = read_runs(
                        bookie_id, self._ledger_id, EntryId(next_id), EntryId(last),
                        max_entries=last - next_id + 1, master_key=self._master_key,
                        timeout_s=self._config.read_timeout_s,
                    )
                    async with contextlib.aclosing(runs):
                        async for run in runs:
                            next_id += len(run)
                            self._report_run(bookie_id, run)
                    continue
                got = await self._transport.read_range(
                    bookie_id, self._ledger_id, EntryId(next_id), EntryId(last),
                    max_entries=last - next_id + 1, master_key=self._master_key,
                    timeout_s=self._config.read_timeout_s,
                )
            except CorruptEntryError:
                self._report(bookie_id, next_id, None, Status.CORRUPT)
                next_id += 1
                continue
            except ScribaError as exc:
                status = exc.status
                self._report_many(
                    bookie_id, [(e, None, status) for e in range(next_id, last + 1)]
                )
                return
            if not got:
                self._report_many(
                    bookie_id,
                    [(e, None, Status.NO_SUCH_ENTRY) for e in range(next_id, last + 1)],
                )
                return
            first = next_id
            next_id += len(got)
            self._report_many(bookie_id, [(first + i, d, Status.OK) for i, d in enumerate(got)])

    def _report_run(self, bookie_id: BookieId, run: EntryRun) -> None:
        """One event for a run of entries (split into answers for a core without runs)."""
        on_run = getattr(self._core, "on_run", None)
        if on_run is not None:
            self._post(lambda: on_run(bookie_id, run))
            return
        first = run.first_entry_id
        self._report_many(bookie_id, [(first + i, d, Status.OK) for i, d in enumerate(run.entries())])

    async def _read_one(self, bookie_id: BookieId, entry_id: EntryId, fence: bool) -> None:
        try:
            data = await self._transport.read_entry(
                bookie_id, self._ledger_id, entry_id, fence=fence, master_key=self._master_key,
                timeout_s=self._config.read_timeout_s,
            )
        except ScribaError as exc:
            self._report(bookie_id, entry_id, None, exc.status)
        else:
            self._report(bookie_id, entry_id, data, Status.OK)

    def _report(self, bookie_id: BookieId, entry_id: int, data: bytes | None, status: Status) -> None:
        self._post(lambda: self._core.on_entry(bookie_id, entry_id, data, status))

    def _report_many(
        self, bookie_id: BookieId, answers: list[tuple[int, bytes | None, Status]]
    ) -> None:
        """One event for a whole range answer (the core still sees one input per entry)."""
        core = self._core
        on_entries = getattr(core, "on_entries", None)
        if on_entries is not None:
            self._post(lambda: on_entries(bookie_id, answers))
            return

        def event() -> Effects:
            effects: list[Any] = []
            for entry_id, data, status in answers:
                effects.extend(core.on_entry(bookie_id, entry_id, data, status))
            return effects

        self._post(event)

    async def _write_metadata(self, effect: WriteMetadata) -> None:
        try:
            record = await update_record(
                self._store, self._ledger_id, effect, self._config.metadata_timeout_s
            )
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            error = as_scriba_error(exc)
            self._post(lambda: self._core.on_metadata_failed(error))
        else:
            self._post(lambda: self._core.on_metadata_written(record))


async def recover_ledger(
    metadata: LedgerMetadata,
    *,
    digest: Digest,
    store: MetadataStore,
    transport: BookieTransport,
    master_key: bytes,
    config: DriverConfig | None = None,
    recovery_config: RecoveryConfig | None = None,
    choose_replacement: ChooseReplacement | None = None,
    region_of: RegionOf | None = None,
) -> LedgerMetadata:
    """Fence, recover and close the ledger; returns the CLOSED record. With
    ``choose_replacement`` a tail that cannot be re-replicated on its write set moves to
    replacements (``RecoveryCore``)."""
    core = RecoveryCore(metadata, digest=digest, config=recovery_config,
                        choose_replacement=choose_replacement, region_of=region_of)
    op = Operation(
        core, ledger_id=metadata.ledger_id, store=store, transport=transport,
        master_key=master_key, config=(config or DriverConfig()).validate(),
    )
    async for _ in op.run(core.start()):
        pass
    result = op.result
    if not isinstance(result, LedgerMetadata):
        raise InternalError("recovery finished without a record")
    log.info(
        "ledger_recovered", ledger_id=metadata.ledger_id, entry_id=result.last_entry_id,
        lac=result.last_entry_id,
    )
    return result
