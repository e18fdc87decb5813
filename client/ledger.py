"""asyncio drivers: ``LedgerWriter`` and ``LedgerReader`` carry out the cores' effects.

The cores (``write_core``, ``recovery_core``, ``read_core``) decide; these classes
send adds and reads through a ``BookieTransport``, write records through
``update_metadata``, run timers, and resolve the callers' futures. Everything runs
on one event loop: transport callbacks must arrive on it.

The write hot path costs, per entry, one ``WriteCore.append_if_room`` (pack + digest),
one ``transport.add_entry`` for the whole write set (``transport.add`` per bookie when
the transport has no batched path), and one future; answers come back per run, one
``WriteCore.on_add_responses`` call for many entries of one bookie.
``append_async`` lets a caller keep thousands of entries in flight without a
coroutine per entry; ``append`` awaits it.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from scriba.client.effects import (
    CompleteAppends,
    DeliverEntries,
    Effects,
    FailAppends,
    OperationDone,
    OperationFailed,
    ReadEntries,
    ReadLac,
    SendAdd,
    StartTimer,
    WriteMetadata,
)
from scriba.client.read_core import LacReadCore, ReadConfig, ReadCore, ReadOrder
from scriba.client.recovery_core import RecoveryConfig, RecoveryCore
from scriba.client.transport import BookieTransport, LacResult
from scriba.client.write_core import WriteCore, WriterState
from scriba.config import require
from scriba.entry import Digest, Entry
from scriba.errors import (
    CorruptEntryError,
    InternalError,
    LedgerClosedError,
    NoSuchEntryError,
    NoSuchKeyError,
    NoSuchLedgerError,
    ScribaError,
    Status,
    TimeoutError,
    TooManyRequestsError,
)
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.log import get_logger
from scriba.meta.records import LEDGER_CODEC, LedgerMetadata, ledger_key
from scriba.meta.store import MetadataStore
from scriba.meta.update import read_record, update_metadata

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class DriverConfig:
    read_timeout_s: float = 5.0
    metadata_timeout_s: float = 10.0
    appends_waiting_max: int = 100_000  # appends queued behind the in-flight bound
    explicit_lac_delay_s: float = 0.2  # idle writer: send the LAC explicitly after this
    long_poll_s: float = 1.0

    def validate(self) -> DriverConfig:
        require(self.read_timeout_s > 0, "read_timeout_s", "must be > 0")
        require(self.metadata_timeout_s > 0, "metadata_timeout_s", "must be > 0")
        require(self.appends_waiting_max >= 1, "appends_waiting_max", "must be >= 1")
        require(self.explicit_lac_delay_s >= 0, "explicit_lac_delay_s", "must be >= 0")
        require(self.long_poll_s > 0, "long_poll_s", "must be > 0")
        return self


def _as_scriba_error(exc: BaseException) -> ScribaError:
    if isinstance(exc, ScribaError):
        return exc
    if isinstance(exc, builtins.TimeoutError):
        return TimeoutError("metadata store did not answer in time")
    return InternalError(f"{type(exc).__name__}: {exc}")


async def _update_record(
    store: MetadataStore, ledger_id: int, effect: WriteMetadata, timeout_s: float
) -> LedgerMetadata:
    async with asyncio.timeout(timeout_s):
        record = await update_metadata(
            store, ledger_key(ledger_id), LEDGER_CODEC, effect.needs_update, effect.transform
        )
    value: LedgerMetadata = record.value
    return value


async def read_ledger_metadata(
    store: MetadataStore, ledger_id: int, timeout_s: float = 10.0
) -> LedgerMetadata:
    try:
        async with asyncio.timeout(timeout_s):
            record = await read_record(store, ledger_key(ledger_id), LEDGER_CODEC)
    except NoSuchKeyError:
        raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
    except builtins.TimeoutError:
        raise TimeoutError(f"ledger {ledger_id}: metadata read timed out") from None
    value: LedgerMetadata = record.value
    return value


# --- writer -------------------------------------------------------------------------


class LedgerWriter:
    """The handle of a ledger's single writer (from ``Client.create_ledger``)."""

    def __init__(
        self,
        core: WriteCore,
        *,
        store: MetadataStore,
        transport: BookieTransport,
        master_key: bytes,
        config: DriverConfig | None = None,
    ) -> None:
        self._core = core
        self._store = store
        self._transport = transport
        self._master_key = master_key
        self._config = (config or DriverConfig()).validate()
        self._ledger_id = LedgerId(core.ledger_id)
        self._loop = asyncio.get_running_loop()
        self._futures: deque[asyncio.Future[int]] = deque()  # entries lac+1 .. next-1
        self._waiting: deque[tuple[bytes, asyncio.Future[int]]] = deque()
        self._space = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._close_future: asyncio.Future[None] | None = None
        self._lac_timer: asyncio.TimerHandle | None = None
        self._timers: list[asyncio.TimerHandle] = []
        self._explicit_lac = core.last_add_confirmed
        self._log = log.bind(ledger_id=self._ledger_id)
        self._on_add = self._on_add_response  # bound once, passed per add
        self._on_adds = self._on_add_responses
        self._add = transport.add
        # the batched path (one call per write set, answers per run), when offered
        self._add_entry: Callable[..., None] | None = getattr(transport, "add_entry", None)
        self._new_future = functools.partial(asyncio.Future, loop=self._loop)  # create_future, one call less

    # --- views -----------------------------------------------------------------------
    @property
    def ledger_id(self) -> LedgerId:
        return self._ledger_id

    @property
    def last_add_confirmed(self) -> EntryId:
        return EntryId(self._core.last_add_confirmed)

    @property
    def metadata(self) -> LedgerMetadata:
        return self._core.metadata

    @property
    def length(self) -> int:
        return self._core.length

    @property
    def pending(self) -> int:
        """Appends accepted but not yet confirmed or failed."""
        return len(self._futures) + len(self._waiting)

    @property
    def is_closed(self) -> bool:
        return self._core.state is WriterState.CLOSED

    # --- appends ---------------------------------------------------------------------
    def append_async(self, payload: bytes) -> asyncio.Future[int]:
        """Append without waiting; the future resolves to the entry id once confirmed.

        Raises at once if the ledger is closed or the writer failed, and
        ``TooManyRequestsError`` if ``appends_waiting_max`` appends already wait for
        room in flight (use ``append`` to wait instead).
        """
        if self._closing:
            raise LedgerClosedError(f"ledger {self._ledger_id}: close() was called")
        core = self._core
        if not self._waiting:
            sent = core.append_if_room(payload)
            if sent is not None:  # the hot path: packed and sent now
                future: asyncio.Future[int] = self._new_future()
                self._futures.append(future)
                self._send(*sent)
                return future
        core.check_appendable()
        future = self._loop.create_future()
        if self._waiting or not core.has_capacity(len(payload)):
            if len(self._waiting) >= self._config.appends_waiting_max:
                raise TooManyRequestsError(
                    f"ledger {self._ledger_id}: {len(self._waiting)} appends waiting "
                    "(appends_waiting_max)"
                )
            self._waiting.append((payload, future))
            self._space.clear()
            return future
        self._submit(payload, future)
        return future

    async def append(self, payload: bytes) -> EntryId:
        """Append ``payload``; returns its entry id once confirmed (ack quorum, in order)."""
        while len(self._waiting) >= self._config.appends_waiting_max:
            self._space.clear()
            await self._space.wait()
        return EntryId(await self.append_async(payload))

    def _submit(self, payload: bytes, future: asyncio.Future[int]) -> None:
        sent = self._core.append_packed(payload)
        self._futures.append(future)
        self._send(*sent)

    def _send(
        self, entry_id: int, packed: bytes, bookies: tuple[BookieId, ...], *, recovery: bool = False
    ) -> None:
        """One entry to its write set: one batched call when the transport offers it."""
        add_entry = self._add_entry
        if add_entry is not None:
            add_entry(bookies, self._ledger_id, entry_id, self._master_key, packed, self._on_adds,
                      recovery=recovery)
            return
        add = self._add
        for bookie_id in bookies:
            add(bookie_id, self._ledger_id, entry_id, self._master_key, packed, self._on_add,
                recovery=recovery)

    def _drain_waiting(self) -> None:
        core = self._core
        waiting = self._waiting
        while waiting and core.state is WriterState.OPEN and core.has_capacity(len(waiting[0][0])):
            payload, future = waiting.popleft()
            self._submit(payload, future)
        if len(waiting) < self._config.appends_waiting_max:
            self._space.set()

    def _on_add_response(
        self, bookie_id: BookieId, ledger_id: LedgerId, entry_id: EntryId, status: Status
    ) -> None:
        effects = self._core.on_add_response(bookie_id, entry_id, status)
        if effects:
            self._execute(effects)

    def _on_add_responses(
        self, bookie_id: BookieId, ledger_id: int, entry_ids: list[int], status: Status
    ) -> None:
        effects = self._core.on_add_responses(bookie_id, entry_ids, status)
        if effects:
            self._execute(effects)

    # --- effects ---------------------------------------------------------------------
    def _execute(self, effects: Effects) -> None:
        for effect in effects:
            kind = type(effect)
            if kind is SendAdd:
                self._send(
                    effect.entry_id,  # type: ignore[union-attr]
                    effect.entry,  # type: ignore[union-attr]
                    effect.bookies,  # type: ignore[union-attr]
                    recovery=effect.recovery,  # type: ignore[union-attr]
                )
            elif kind is CompleteAppends:
                self._complete(effect)  # type: ignore[arg-type]
            elif kind is FailAppends:
                self._fail(effect)  # type: ignore[arg-type]
            elif kind is WriteMetadata:
                self._spawn(self._write_metadata(effect))  # type: ignore[arg-type]
            elif kind is StartTimer:
                key = effect.key  # type: ignore[union-attr]
                self._timers = [t for t in self._timers if not t.cancelled()]
                self._timers.append(
                    self._loop.call_later(effect.delay_s, self._timer_due, key)  # type: ignore[union-attr]
                )
            else:
                raise InternalError(f"writer: unexpected effect {effect!r}")

    def _timer_due(self, key: object) -> None:
        self._execute(self._core.on_timer(key))
        self._settle_close()

    def _complete(self, effect: CompleteAppends) -> None:
        futures = self._futures
        for entry_id in range(effect.first, effect.last + 1):
            future = futures.popleft()
            if not future.done():
                future.set_result(entry_id)
        if self._waiting:
            self._drain_waiting()
        if not futures and self._config.explicit_lac_delay_s and self._lac_timer is None:
            self._lac_timer = self._loop.call_later(
                self._config.explicit_lac_delay_s, self._explicit_lac_due
            )

    def _fail(self, effect: FailAppends) -> None:
        error = effect.error
        self._log.warning("appends_failed", first=effect.first, last=effect.last, error=str(error))
        futures = self._futures
        for _ in range(effect.first, effect.last + 1):
            future = futures.popleft()
            if not future.done():
                future.set_exception(error)
        while self._waiting:
            _, future = self._waiting.popleft()
            if not future.done():
                future.set_exception(error)
        self._space.set()
        if self._close_future is not None and not self._close_future.done():
            try:
                self._execute(self._core.close())
            except ScribaError as exc:
                self._close_future.set_exception(exc)

    async def _write_metadata(self, effect: WriteMetadata) -> None:
        try:
            record = await _update_record(
                self._store, self._ledger_id, effect, self._config.metadata_timeout_s
            )
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            error = _as_scriba_error(exc)
            self._log.warning("metadata_write_failed", purpose=effect.purpose, error=str(error))
            effects = self._core.on_metadata_failed(error)
        else:
            if effect.purpose == "ensemble_change":
                self._log.info("ensemble_changed", ensembles=[list(e) for _, e in record.ensembles][-1])
            effects = self._core.on_metadata_written(record)
        self._execute(effects)
        self._settle_close()

    def _settle_close(self) -> None:
        future = self._close_future
        if future is None or future.done():
            return
        if self._core.state is WriterState.CLOSED:
            future.set_result(None)
        elif self._core.state is WriterState.FAILED and self._core.error is not None:
            future.set_exception(self._core.error)

    def _spawn(self, coro: Any) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _explicit_lac_due(self) -> None:
        self._lac_timer = None
        core = self._core
        lac = core.last_add_confirmed
        if core.pending or lac <= self._explicit_lac or core.state is not WriterState.OPEN:
            return
        self._explicit_lac = lac
        for bookie_id in core.ensemble:
            self._spawn(self._write_lac(bookie_id, lac))

    async def _write_lac(self, bookie_id: BookieId, lac: int) -> None:
        try:
            async with asyncio.timeout(self._config.read_timeout_s):
                await self._transport.write_lac(bookie_id, self._ledger_id, EntryId(lac), self._master_key)
        except (ScribaError, builtins.TimeoutError) as exc:
            self._log.debug("explicit_lac_failed", bookie_id=bookie_id, lac=lac, error=str(exc))

    # --- close -----------------------------------------------------------------------
    async def close(self) -> None:
        """Wait for every append, then close the ledger at the last confirmed entry.

        A recovery that closed it at the same point counts as success; otherwise
        ``LedgerFencedError`` (another client recovered it).
        """
        if self._core.state is WriterState.CLOSED:
            return
        if self._close_future is None:
            self._closing = True
            self._close_future = self._loop.create_future()
            while self._waiting and self._core.state is WriterState.OPEN:
                self._space.clear()
                await self._space.wait()
            if self._lac_timer is not None:
                self._lac_timer.cancel()
                self._lac_timer = None
            try:
                self._execute(self._core.close())
            except ScribaError as exc:
                self._close_future.set_exception(exc)
            self._settle_close()
        await asyncio.shield(self._close_future)
        self._log.info("ledger_closed", lac=self._core.last_add_confirmed)

    async def abort(self) -> None:
        """Stop without closing (tests, shutdown): pending appends fail, tasks end."""
        for task in list(self._tasks):
            task.cancel()
        for timer in self._timers:
            timer.cancel()
        if self._lac_timer is not None:
            self._lac_timer.cancel()


# --- one-shot operations (recovery, reads, LAC reads) ----------------------------------


class _Operation:
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

        A short answer continues with a range read from the next entry. An entry that
        is corrupt at rest is reported alone and the range goes on after it; any other
        error (missing, unavailable, timeout) reports every remaining entry at once,
        so the core asks the next replica for them together (again a range read).
        """
        while next_id <= last:
            try:
                got = await self._transport.read_range(
                    bookie_id, self._ledger_id, EntryId(next_id), EntryId(last),
                    max_entries=last - next_id + 1, timeout_s=self._config.read_timeout_s,
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
            record = await _update_record(
                self._store, self._ledger_id, effect, self._config.metadata_timeout_s
            )
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            error = _as_scriba_error(exc)
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
) -> LedgerMetadata:
    """Fence, recover and close the ledger; returns the CLOSED record."""
    core = RecoveryCore(metadata, digest=digest, config=recovery_config)
    op = _Operation(
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


# --- reader -------------------------------------------------------------------------


class LedgerReader:
    """A read handle (from ``Client.open_ledger``)."""

    def __init__(
        self,
        metadata: LedgerMetadata,
        *,
        store: MetadataStore,
        transport: BookieTransport,
        digest: Digest,
        master_key: bytes,
        read_order: ReadOrder,
        config: DriverConfig | None = None,
        read_config: ReadConfig | None = None,
    ) -> None:
        self._md = metadata
        self._store = store
        self._transport = transport
        self._digest = digest
        self._master_key = master_key
        self._read_order = read_order
        self._config = (config or DriverConfig()).validate()
        self._read_config = read_config
        self._lac = int(metadata.last_entry_id)
        self._poll_index = 0

    @property
    def ledger_id(self) -> LedgerId:
        return self._md.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._md

    @property
    def is_closed(self) -> bool:
        return self._md.is_closed

    @property
    def last_add_confirmed(self) -> EntryId:
        """The last entry known confirmed (for a closed ledger: its last entry)."""
        return EntryId(self._md.last_entry_id if self._md.is_closed else self._lac)

    def _operation(self, core: Any) -> _Operation:
        return _Operation(
            core, ledger_id=self._md.ledger_id, store=self._store, transport=self._transport,
            master_key=self._master_key, config=self._config,
        )

    async def refresh(self) -> LedgerMetadata:
        """Re-read the ledger's record (state, ensembles, last entry)."""
        self._md = await read_ledger_metadata(self._store, self._md.ledger_id, self._config.metadata_timeout_s)
        return self._md

    async def read_last_add_confirmed(self) -> EntryId:
        """The LAC: the record's last entry if closed, else max LAC of a quorum of bookies."""
        if self._md.is_closed:
            return self._md.last_entry_id
        core = LacReadCore(self._md)
        op = self._operation(core)
        async for _ in op.run(core.start()):
            pass
        lac = op.result
        if not isinstance(lac, int):
            raise InternalError("LAC read finished without a value")
        self._lac = max(self._lac, lac)
        return EntryId(self._lac)

    async def read(self, first: int = 0, last: int | None = None) -> AsyncIterator[Entry]:
        """Entries ``first..last`` (default: to the LAC), verified, in order.

        Only confirmed entries: beyond the LAC (or a closed ledger's last entry)
        raises ``NoSuchEntryError``.
        """
        bound = self.last_add_confirmed
        if last is None or last > bound:
            if not self._md.is_closed:
                bound = await self.read_last_add_confirmed()
            if last is None:
                last = bound
        if last > bound:
            raise NoSuchEntryError(
                f"ledger {self._md.ledger_id}: entry {last} is beyond the last confirmed "
                f"entry {bound}"
            )
        if first < 0:
            raise NoSuchEntryError(f"ledger {self._md.ledger_id}: entry {first} < 0")
        if first > last:
            return
        core = ReadCore(
            self._md, first, last, digest=self._digest, read_order=self._read_order,
            config=self._read_config,
        )
        async for batch in self._operation(core).run(core.start()):
            for entry in batch:
                yield entry

    async def tail(self, start: int = 0) -> AsyncIterator[Entry]:
        """Follow the ledger from ``start``: every entry in order, ending once it is closed."""
        next_id = start
        failures = 0
        while True:
            if self._md.is_closed:
                if next_id <= self._md.last_entry_id:
                    async for entry in self.read(next_id, self._md.last_entry_id):
                        yield entry
                return
            if next_id <= self._lac:
                last = self._lac
                async for entry in self.read(next_id, last):
                    yield entry
                next_id = last + 1
                continue
            advanced = await self._long_poll()
            if advanced is None:  # that bookie failed: back off (bounded), try the next
                failures += 1
                await asyncio.sleep(min(0.05 * failures, 1.0))
            else:
                failures = 0
            if not advanced:
                await self.refresh()

    async def _long_poll(self) -> bool | None:
        ensemble = self._md.current_ensemble
        bookie_id = ensemble[self._poll_index % len(ensemble)]
        try:
            async with asyncio.timeout(self._config.long_poll_s + self._config.read_timeout_s):
                result = await self._transport.long_poll_lac(
                    bookie_id, self._md.ledger_id, EntryId(self._lac), wait_s=self._config.long_poll_s
                )
        except (ScribaError, builtins.TimeoutError) as exc:
            log.debug("long_poll_failed", ledger_id=self._md.ledger_id, bookie_id=bookie_id, error=str(exc))
            self._poll_index += 1
            return None
        if result.lac > self._lac:
            self._lac = int(result.lac)
            return True
        return False

    async def close(self) -> None:
        """Nothing to release (reads hold no resources between calls)."""
