"""The asyncio driver of a ledger's single writer: ``LedgerWriter`` carries out ``WriteCore``'s effects.

It sends adds through a ``BookieTransport``, writes records through
``update_metadata``, runs timers and resolves the callers' futures. Everything runs
on one event loop: transport callbacks must arrive on it.

The write hot path costs, per entry, one ``WriteCore.append`` (pack + digest),
one ``transport.add_entry`` for the whole write set (``transport.add`` per bookie when
the transport has no batched path), and one future; answers come back per run, one
``WriteCore.on_add_responses`` call for many entries of one bookie.
``append_async`` lets a caller keep thousands of entries in flight without a
coroutine per entry; ``append`` awaits it. ``append_callback`` is the cheapest way in
(BookKeeper's ``asyncAddEntry`` with an ``AddCallback``): no future, and the callback is
called directly, in entry order, as the confirmation is processed; a future's
completion costs a scheduled loop callback (``call_soon``) per append on top of the
future itself.

Tailing readers learn of a confirmation from the LAC that the next entry carries
(piggybacked). When no entry is packed between a confirmation and the next loop turn
(``explicit_lac_delay_s``: an idle or slow-paced writer), the writer pushes the LAC to
its bookies explicitly (``WriteLac`` with ``hint_only``: raised in the bookies' memory,
not journaled, so it costs no fsync), one push at a time **per bookie**: a reader's long
poll then answers one round trip after the confirmation instead of when (if ever) a later
entry brings it, and a writer whose next entries carry the LAC sends no push at all. Each
bookie's pushes are paced by that bookie's own round trip, so a slow bookie (descheduled,
busy with its journal) delays only its own copy of the LAC, never the push to the bookie
a reader polls. Every value pushed is ``last_add_confirmed`` as the core holds it when
the push leaves: the LAC a bookie learns never runs ahead of what an ack quorum holds.
A writer whose entries usually follow each other within a few ms (an RSM leader with
one proposer) can set a longer delay for itself (``set_explicit_lac_delay``): it then
pushes only once that long has passed since its last confirmation with no entry packed
since (a check falling due earlier is put back, whether a timer or a push's return ran
it), as BookKeeper's ``explicitLacInterval`` does, and its pushes (a message to every
bookie and back) leave its critical path.

Every append entry point checks its payload before anything changes, so a refused
payload leaves the writer as it was: a bytes-like payload (``bytearray``,
``memoryview``, any buffer) is copied into ``bytes`` (the caller may reuse its buffer
once the call returns; ``bytes`` itself passes untouched), anything else is a
``TypeError``, and a payload whose packed entry would exceed the bookies' advertised
``entry_size_max`` is an ``EntryTooLargeError``: a bookie would refuse it, and no
ensemble change can help.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import functools
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol

from scriba.client.driver import DriverConfig, as_scriba_error, update_versioned_record
from scriba.client.effects import (
    CompleteAppends,
    Effects,
    FailAppends,
    SendAdd,
    StartTimer,
    WriteMetadata,
)
from scriba.client.fence_probe import Verdict, prove_unfenced
from scriba.client.transport import BookieTransport
from scriba.client.write_core import WriteCore
from scriba.client.writer_state import WriterState
from scriba.entry import ENTRY_SIZE_MAX_DEFAULT, HEADER_SIZE, make_digest
from scriba.errors import (
    EntryTooLargeError,
    InternalError,
    LedgerClosedError,
    ScribaError,
    Status,
    TooManyRequestsError,
)
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.invariant import invariant
from scriba.log import get_logger
from scriba.meta.records import LedgerMetadata
from scriba.meta.store import MetadataStore, Versioned

log = get_logger(__name__)


class EntryLimits(Protocol):
    """Where a writer learns the bookies' entry size limit (``BookieRegistry``)."""

    @property
    def entry_size_max(self) -> int: ...


AppendCallback = Callable[[int, "BaseException | None"], None]
"""``on_done(entry_id, error)`` of ``append_callback``: ``(entry_id, None)`` once the
entry is confirmed, ``(entry_id, error)`` when it failed (``-1`` for an append that
failed before it was given an id, while waiting for room in flight)."""

_Future: Final = asyncio.Future


class _DefaultLimits:
    entry_size_max: Final = ENTRY_SIZE_MAX_DEFAULT


def as_payload(payload: object) -> bytes:
    """``payload`` as immutable bytes (a copy of any other bytes-like object), else TypeError."""
    if type(payload) is bytes:
        return payload
    try:
        view = memoryview(payload)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            "ledger append: expected a bytes-like payload (bytes, bytearray, memoryview), "
            f"got {type(payload).__name__}"
        ) from None
    with view:
        return view.tobytes()


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
        limits: EntryLimits | None = None,
        record_version: int | None = None,
    ) -> None:
        self._core = core
        # The ledger record as this writer last wrote it (its creator passes the version it
        # created): a metadata update starts from it instead of reading it back.
        self._record = Versioned(core.metadata, record_version) if record_version is not None else None
        self._store = store
        self._transport = transport
        self._master_key = master_key
        self._config = (config or DriverConfig()).validate()
        self._ledger_id = LedgerId(core.ledger_id)
        self._limits: EntryLimits = limits if limits is not None else _DefaultLimits()
        # header and digest around each payload: what entry_size_max leaves for a payload
        self._entry_overhead = HEADER_SIZE + make_digest(core.metadata.digest_type.value, b"").size
        self._loop = asyncio.get_running_loop()
        # who waits for entries lac+1 .. next-1: a future (append_async) or an AppendCallback
        self._futures: deque[asyncio.Future[int] | AppendCallback] = deque()
        self._waiting: deque[tuple[bytes, asyncio.Future[int] | AppendCallback]] = deque()
        self._space = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._close_future: asyncio.Future[None] | None = None
        self._lac_timer: asyncio.Handle | None = None  # the LAC check to come
        self._timers: list[asyncio.TimerHandle] = []
        # per bookie: the highest LAC pushed to it explicitly, and its push in flight (at
        # most one per bookie: each bookie's pushes are paced by its own round trip)
        self._lac_pushed: dict[BookieId, int] = {}
        self._lac_pushes: dict[BookieId, asyncio.Task[None]] = {}
        self._lac_mark = core.next_entry_id  # entries from this id carry the LAC of the last confirmation
        self._lac_confirmed_s = 0.0  # when the last confirmation came (loop time): a push waits the delay from it
        self._log = log.bind(ledger_id=self._ledger_id)
        self._on_add = self._on_add_response  # bound once, passed per add
        self._on_adds = self._on_add_responses
        self._add = transport.add
        # the batched path (one call per write set, answers per run), when offered
        self._add_entry: Callable[..., None] | None = getattr(transport, "add_entry", None)
        self._new_future = functools.partial(asyncio.Future, loop=self._loop)  # create_future, one call less
        # a transport that can hold the adds a burst of callbacks makes (one message each bookie)
        self._cork: Callable[[], None] | None = getattr(transport, "cork", None)
        self._uncork: Callable[[], None] = getattr(transport, "uncork", lambda: None)

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

    @property
    def payload_bytes_max(self) -> int:
        """The largest payload the bookies accept now (their limit less header and digest)."""
        return self._limits.entry_size_max - self._entry_overhead

    # --- appends ---------------------------------------------------------------------
    def check_payload(self, payload: bytes | bytearray | memoryview) -> bytes:
        """``payload`` as bytes, or the error an append of it would raise (``TypeError``,
        ``EntryTooLargeError``); changes nothing."""
        if type(payload) is not bytes:
            payload = as_payload(payload)
        if len(payload) + self._entry_overhead > self._limits.entry_size_max:
            raise self._too_large(len(payload))
        return payload

    def _too_large(self, size: int) -> EntryTooLargeError:
        limit = self._limits.entry_size_max
        return EntryTooLargeError(
            f"ledger {self._ledger_id}: payload of {size} bytes exceeds the limit of "
            f"{limit - self._entry_overhead} bytes (the bookies' entry_size_max of {limit} "
            f"bytes less {self._entry_overhead} bytes of header and digest); nothing was written"
        )

    def append_async(self, payload: bytes | bytearray | memoryview) -> asyncio.Future[int]:
        """Append without waiting; the future resolves to the entry id once confirmed.

        Raises at once, changing nothing, for a payload that is not bytes-like
        (``TypeError``) or too large (``EntryTooLargeError``), if the ledger is closed
        or the writer failed, and ``TooManyRequestsError`` if ``appends_waiting_max``
        appends already wait for room in flight (use ``append`` to wait instead).
        """
        if type(payload) is not bytes or len(payload) + self._entry_overhead > self._limits.entry_size_max:
            payload = self.check_payload(payload)  # a copy of a bytes-like payload, or raises
        future: asyncio.Future[int] = self._new_future()
        self._append(payload, future)
        return future

    def _append(self, payload: bytes, waiter: asyncio.Future[int] | AppendCallback) -> None:
        """``payload`` (checked) packed and sent now, or queued for room in flight, or the
        refusal raised (closed, failed, too many waiting)."""
        if self._closing:
            raise LedgerClosedError(f"ledger {self._ledger_id}: close() was called")
        if not self._waiting:
            sent = self._core.append(payload)
            if sent is not None:  # the hot path: packed and sent now
                self._futures.append(waiter)
                self._send(*sent)
                return
        # No room in flight (or earlier appends wait already): wait in order.
        self._core.check_appendable()
        if len(self._waiting) >= self._config.appends_waiting_max:
            raise TooManyRequestsError(
                f"ledger {self._ledger_id}: {len(self._waiting)} appends waiting "
                "(appends_waiting_max)"
            )
        self._waiting.append((payload, waiter))
        self._space.clear()

    def append_callback(self, payload: bytes | bytearray | memoryview, on_done: AppendCallback) -> None:
        """Append without a future: ``on_done(entry_id, None)`` is called once the entry is
        confirmed, or ``on_done(entry_id, error)`` once it failed (``AppendCallback``).

        Callbacks are called in entry order, on the event loop, directly from the
        processing of the bookies' answers (never from within this call); a callback may
        append again. An exception it raises is logged and dropped: it cannot break the
        writer. Refusals are raised at once, changing nothing, as by ``append_async``.
        """
        if type(payload) is not bytes or self._limits.entry_size_max < len(payload) + self._entry_overhead:
            payload = self.check_payload(payload)  # a copy of a bytes-like payload, or raises
        self._append(payload, on_done)

    async def append(self, payload: bytes | bytearray | memoryview) -> EntryId:
        """Append ``payload``; returns its entry id once confirmed (ack quorum, in order)."""
        payload = self.check_payload(payload)  # before waiting: the buffer may change meanwhile
        while len(self._waiting) >= self._config.appends_waiting_max:
            self._space.clear()
            await self._space.wait()
        return EntryId(await self.append_async(payload))

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
            add(bookie_id, self._ledger_id, EntryId(entry_id), self._master_key, packed, self._on_add,
                recovery=recovery)

    def _drain_waiting(self) -> None:
        core = self._core
        waiting = self._waiting
        while waiting and core.state is WriterState.OPEN:
            sent = core.append(waiting[0][0])
            if sent is None:  # still no room in flight
                break
            self._futures.append(waiting.popleft()[1])
            self._send(*sent)
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

    def cork(self) -> None:
        """Hold the adds made (through this writer's transport) until ``uncork``: a caller
        that packs a burst of appends in one go (a stream writer's flush) has each idle
        bookie's adds sent as one message when it uncorks, without the loop turn an idle
        bookie's send otherwise waits for more. Calls nest; a transport without the hooks
        sends as it would."""
        if self._cork is not None:
            self._cork()

    def uncork(self) -> None:
        if self._cork is not None:
            self._uncork()

    def _timer_due(self, key: object) -> None:
        self._execute(self._core.on_timer(key))
        self._settle_close()

    def _complete(self, effect: CompleteAppends) -> None:
        futures = self._futures
        # Entries packed from here on carry this confirmation (callbacks may append).
        self._lac_mark = self._core.next_entry_id
        self._lac_confirmed_s = self._loop.time()
        cork = self._cork
        if cork is not None:  # appends made by the callbacks leave as one message per bookie
            cork()
        try:
            for entry_id in range(effect.first, effect.last + 1):
                waiter = futures.popleft()
                if type(waiter) is _Future:
                    if not waiter.done():  # type: ignore[union-attr]
                        waiter.set_result(entry_id)  # type: ignore[union-attr]
                else:
                    self._call_back(waiter, entry_id, None)  # type: ignore[arg-type]
        finally:
            if cork is not None:
                self._uncork()
        if self._waiting:
            self._drain_waiting()
        self._arm_lac_timer()

    def _arm_lac_timer(self) -> None:
        delay_s = self._config.explicit_lac_delay_s
        if (
            delay_s is not None and self._lac_timer is None
            and len(self._lac_pushes) < len(self._core.ensemble)
            and self._core.next_entry_id == self._lac_mark  # else an entry appended by a callback carries it
        ):
            self._lac_timer = (
                self._loop.call_later(delay_s, self._explicit_lac_due) if delay_s
                else self._loop.call_soon(self._explicit_lac_due)
            )

    def _fail(self, effect: FailAppends) -> None:
        error = effect.error
        self._log.warning("appends_failed", first=effect.first, last=effect.last, error=str(error))
        # The range is every unconfirmed entry: exactly the futures held.
        futures, self._futures = self._futures, deque()
        for entry_id, waiter in enumerate(futures, effect.first):
            self._settle_failed(waiter, entry_id, error)
        invariant(
            len(futures) == effect.last - effect.first + 1,
            f"ledger {self._ledger_id}: {len(futures)} appends pending, core failed "
            f"{effect.first}..{effect.last}",
        )
        while self._waiting:
            _, waiter = self._waiting.popleft()
            self._settle_failed(waiter, -1, error)
        self._space.set()
        if self._close_future is not None and not self._close_future.done():
            try:
                self._execute(self._core.close())
            except ScribaError as exc:
                self._close_future.set_exception(exc)

    def _settle_failed(self, waiter: asyncio.Future[int] | AppendCallback, entry_id: int, error: ScribaError) -> None:
        if type(waiter) is _Future:
            if not waiter.done():  # type: ignore[union-attr]
                waiter.set_exception(error)  # type: ignore[union-attr]
        else:
            self._call_back(waiter, entry_id, error)  # type: ignore[arg-type]

    def _call_back(self, on_done: AppendCallback, entry_id: int, error: ScribaError | None) -> None:
        try:
            on_done(entry_id, error)
        except Exception as exc:  # a caller's bug must not break the writer
            self._log.error("append_callback_failed", entry_id=entry_id, error=repr(exc))

    async def _write_metadata(self, effect: WriteMetadata) -> None:
        try:
            written = await update_versioned_record(
                self._store, self._ledger_id, effect, self._config.metadata_timeout_s,
                current=self._record,
            )
        except BaseException as exc:
            self._record = None  # outcome unknown: the next update reads the record first
            if isinstance(exc, asyncio.CancelledError):
                raise
            error = as_scriba_error(exc)
            self._log.warning("metadata_write_failed", purpose=effect.purpose, error=str(error))
            effects = self._core.on_metadata_failed(error)
        else:
            self._record = written
            record = written.value
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

    @property
    def explicit_lac_delay_s(self) -> float | None:
        """How long after its last confirmation, with no entry packed since, this writer pushes its LAC."""
        return self._config.explicit_lac_delay_s

    def set_explicit_lac_delay(self, delay_s: float | None) -> None:
        """This writer's ``explicit_lac_delay_s`` (the client's until set; ``None``: never
        push). A check already due is re-timed from now."""
        self._config = dataclasses.replace(self._config, explicit_lac_delay_s=delay_s).validate()
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None
            self._arm_lac_timer()

    def _explicit_lac_due(self) -> None:
        """Push the LAC explicitly unless a later entry carries it: to each bookie of the
        ensemble that has no push in flight and has not been sent it (see ``_push_lac``)."""
        self._lac_timer = None
        core = self._core
        if core.state is WriterState.FAILED:
            return  # closing or closed: still pushed (the last entries would wait for a poll's timeout)
        if core.next_entry_id > self._lac_mark:
            return  # an entry packed since the last confirmation carries it (piggybacked)
        delay_s = self._config.explicit_lac_delay_s
        if delay_s and not self._closing and (left_s := self._lac_confirmed_s + delay_s - self._loop.time()) > 0:
            # confirmed again since this check was set (or while a push was out): the delay
            # runs from the last confirmation, so a writer whose entries keep coming pushes nothing
            self._lac_timer = self._loop.call_later(left_s, self._explicit_lac_due)
            return
        lac = core.last_add_confirmed
        pushed = self._lac_pushed
        pushes = self._lac_pushes
        for bookie_id in core.ensemble:
            if bookie_id not in pushes and pushed.get(bookie_id, -1) < lac:
                pushed[bookie_id] = lac
                task = pushes[bookie_id] = self._loop.create_task(self._push_lac(bookie_id, lac))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _push_lac(self, bookie_id: BookieId, lac: int) -> None:
        """The LAC to one bookie, so that a tailing reader's long poll there answers now
        rather than when a later entry (if any) brings it. One push at a time per bookie:
        under a stream of confirmations a bookie's pushes coalesce, paced by its round trip
        (a slow bookie holds back no other's); entries that carry the LAC themselves make
        pushing unnecessary."""
        try:
            await self._write_lac(bookie_id, lac)
        finally:
            del self._lac_pushes[bookie_id]
        if self._lac_timer is None:
            self._explicit_lac_due()  # confirmed meanwhile, with no later entry to carry it?

    async def _write_lac(self, bookie_id: BookieId, lac: int) -> None:
        try:
            async with asyncio.timeout(self._config.read_timeout_s):
                await self._transport.write_lac(
                    bookie_id, self._ledger_id, EntryId(lac), self._master_key, hint_only=True
                )
        except (ScribaError, builtins.TimeoutError) as exc:
            self._log.debug("explicit_lac_failed", bookie_id=bookie_id, lac=lac, error=str(exc))

    # --- leadership check --------------------------------------------------------------
    async def prove_unfenced(self, timeout_s: float) -> bool:
        """Whether ``Qa`` bookies of one write set of the current ensemble answer, to plain
        LAC reads sent now, that this ledger is not fenced (``client.fence_probe``): then no
        recovery had fenced it when this call began. False when they do not (a bookie
        answered "fenced", failed, or was slow) or while an ensemble change is written."""
        target = self._core.fence_probe_target
        if target is None:
            return False
        ensemble, quorum, regions = target
        probe = await prove_unfenced(self._transport, self._ledger_id, ensemble, quorum, regions, timeout_s,
                                     self._master_key)
        if probe.fenced:
            self._log.info("ledger_fenced_seen", fenced=probe.fenced)
        return probe.verdict is Verdict.PROVEN

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
            try:
                self._execute(self._core.close())
            except ScribaError as exc:
                self._close_future.set_exception(exc)
            self._settle_close()
        await asyncio.shield(self._close_future)
        await self._last_push()
        self._log.info("ledger_closed", lac=self._core.last_add_confirmed)

    async def _last_push(self) -> None:
        """Closed: the last LAC reaches the bookies before ``close`` returns, so tailing
        readers need not wait out their long poll to see the last entries, even if this
        process exits at once. Waits at most ``long_poll_s`` (past that, a reader's poll
        has timed out and shown the close anyway): an unreachable bookie delays no close
        by more."""
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None
            self._explicit_lac_due()
        deadline = self._loop.time() + self._config.long_poll_s
        while (pushes := {t for t in self._lac_pushes.values() if not t.done()}) and (
            left := deadline - self._loop.time()
        ) > 0:
            await asyncio.wait(pushes, timeout=left)

    async def abort(self) -> None:
        """Stop without closing (tests, shutdown): pending appends fail, tasks end."""
        for task in list(self._tasks):
            task.cancel()
        for timer in self._timers:
            timer.cancel()
        if self._lac_timer is not None:
            self._lac_timer.cancel()
