"""``StreamWriter``: the single writer of a stream (from ``Namespace.open_writer``).

The rules are :class:`~scriba.stream.writer_core.WriterCore`'s and the steps of
:func:`~scriba.stream.writer_core.open_steps`; this module carries them out over the
ledger client, the metadata store and the event loop.

Opening (:func:`open_stream_writer`): take the writer lock (an
:class:`~scriba.meta.election.Election`; its token fences), record the token in the
stream record, recover and close every OPEN segment, then start a new segment.

Appends: ``append_async`` queues a record and returns a future; the records queued
in one event-loop turn (or given to ``append_many``) are packed into one record set,
up to ``record_set_bytes_max``, and sent as one ledger entry. ``append_many`` (and
``append_many_nowait``, an RSM leader's group commit) sends at once: its caller packed
the records already, so no loop turn waits for more. The sets a flush packs leave as
one message per bookie when it ends (the ledger writer corked), and a set's
confirmation reaches the writer as the ledger writer processes the bookies' answers
(``append_callback``), not a loop turn later. At most
``sets_inflight_max`` sets are in flight; more records wait (bounded by
``records_waiting_max``). Futures resolve in order with each record's
:class:`~scriba.stream.position.Position`.

Rolling: once the current segment passes a limit, nothing more is sent to it;
appends are still accepted and wait. A new ledger is created and added to the stream
record (CAS, fenced by the token); once the old ledger's sets are all confirmed the
writer switches to the new segment and sends what waited, and the old ledger is
closed and its segment marked CLOSED in the background.

Retention: with ``retention_interval_s`` set, the writer applies the stream's retention
settings that often (``stream.retention``) until it closes; a failed pass is logged
and the next one tries again.

Failure: a failed set fails its records and every later one; the writer is then
unusable (``StreamWriterClosedError`` naming the cause) and releases its lock. A
fenced ledger or a lost lock is ``WriterFencedError``: after it, nothing more is
ever confirmed by this writer.

The opening, adoption and roll steps are performed, and the writer lock taken, by
``stream.writer_steps`` (off the append path).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scriba.client import Client, LedgerWriter
from scriba.errors import (
    NoSuchKeyError,
    ScribaError,
    StreamWriterClosedError,
    TooManyRequestsError,
)
from scriba.invariant import invariant
from scriba.log import get_logger
from scriba.meta.election import Election, Leadership
from scriba.stream.catalog import Catalog
from scriba.stream.position import Position, trusted
from scriba.stream.retention import apply_retention
from scriba.stream.segments import (
    StreamRecord,
    close_segment,
    last_publish_ms,
    lock_name,
    segment_closed,
)
from scriba.stream.settings import StreamSettings
from scriba.stream.writer_core import (
    AbandonSegment,
    CloseSegment,
    ConfirmRecords,
    Effect,
    FailRecords,
    SendSet,
    StartRoll,
    WriterCore,
    WriterFailed,
    add_segment_steps,
    adopt_steps,
    as_stream_error,
    open_steps,
)
from scriba.stream.writer_steps import StepRunner, candidate_name, take_lock

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class WriterOptions:
    lock_timeout_s: float = 30.0
    sets_inflight_max: int = 256
    records_waiting_max: int = 100_000
    # how long after a confirmation with no later set sent the writer pushes the LAC to its
    # bookies (``LedgerWriter.set_explicit_lac_delay``); None: the client's explicit_lac_delay_s
    lac_push_delay_s: float | None = None


class _Group:
    """The records of one ``append_many``: one future for all their positions (records
    are confirmed in order, so positions arrive in order)."""

    __slots__ = ("count", "future", "positions")

    def __init__(self, future: asyncio.Future[list[Position]], count: int) -> None:
        self.future = future
        self.count = count
        self.positions: list[Position] = []

    def confirm(self, positions: list[Position]) -> None:
        self.positions += positions
        if len(self.positions) >= self.count and not self.future.done():
            self.future.set_result(self.positions)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


Handle = asyncio.Future[Position] | _Group
"""What the core carries for each record: its ``append_async`` future, or its ``append_many`` group."""


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a future's exception as seen (its caller gave up on it)."""
    if not future.cancelled():
        future.exception()


class StreamWriter:
    def __init__(
        self,
        client: Client,
        catalog: Catalog,
        name: str,
        settings: StreamSettings,
        password: bytes,
        election: Election,
        leadership: Leadership,
        ledger: LedgerWriter,
        seq: int,
        publish_ms: int,
        options: WriterOptions,
    ) -> None:
        self.name = name
        self.settings = settings
        self._catalog = catalog
        self._steps = StepRunner(client, catalog, name, settings, password)
        self._election = election
        self._leadership = leadership
        self._loop = asyncio.get_running_loop()
        self._core: WriterCore[Handle] = WriterCore(
            name, settings, catalog.clock, segment_seq=seq, publish_ms=publish_ms,
            sets_inflight_max=options.sets_inflight_max, records_waiting_max=options.records_waiting_max,
        )
        self._lac_push_delay_s = options.lac_push_delay_s
        self._ledgers: dict[int, LedgerWriter] = {seq: self._configured(ledger)}  # by segment seq
        self._flush_scheduled = False
        self._closing = False
        self._closed = False
        self._progress = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._log = log.bind(stream=f"{catalog.namespace}/{name}", token=leadership.token)
        self._spawn(self._watch_lock())
        self.retention_passes = 0  # retention passes this writer ran
        self._retention: asyncio.Task[None] | None = None
        if settings.retention_interval_s is not None:
            self._retention = self._spawn(self._retain(client, settings.retention_interval_s))

    # --- views ---------------------------------------------------------------------
    @property
    def token(self) -> int:
        """The fencing token this writer holds the stream with."""
        return self._leadership.token

    @property
    def segment_seq(self) -> int:
        return self._core.segment_seq

    @property
    def current_ledger(self) -> LedgerWriter | None:
        """The ledger of the segment appends go to now (during a roll, until the switch,
        the old one): never one this writer has started to close (the RSM's leadership
        check, ``scriba.rsm.term``, asks its bookies whether it is fenced)."""
        return self._ledgers.get(self._core.segment_seq)

    @property
    def error(self) -> ScribaError | None:
        return self._core.error

    @property
    def pending(self) -> int:
        return self._core.waiting + self._core.sets_inflight

    # --- appends -------------------------------------------------------------------
    def append_async(self, payload: bytes, headers: Mapping[str, bytes] | None = None) -> asyncio.Future[Position]:
        """Queue one record; the future resolves to its position once confirmed."""
        core = self._core
        core.check_usable()
        record = core.check_record(payload, headers)
        future: asyncio.Future[Position] = self._loop.create_future()
        core.append(record, future)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return future

    async def append(self, payload: bytes, headers: Mapping[str, bytes] | None = None) -> Position:
        """Append one record; returns its position once confirmed."""
        await self._wait_room(1)
        return await self.append_async(payload, headers)

    async def append_many(
        self, records: Iterable[bytes | tuple[bytes, Mapping[str, bytes] | None]]
    ) -> list[Position]:
        """Append records in order (packed together); their positions once all are confirmed.

        Every record is checked before any is queued: a bad one queues nothing.
        """
        core = self._core
        core.check_usable()
        checked = core.check_records(records)
        group = _Group(self._loop.create_future(), len(checked))
        if not checked:
            return []
        try:
            queued = core.append_all(checked, group)
            while queued < len(checked):  # more than may wait: queue the rest as room frees
                self._schedule_flush()
                await self._wait_room(1)
                queued += core.append_all(checked[queued:], group)
        except BaseException as exc:  # refused part-way: the records queued go on, unobserved
            group.future.add_done_callback(_retrieve)
            group.fail(exc if isinstance(exc, ScribaError) else StreamWriterClosedError(repr(exc)))
            self._schedule_flush()
            raise
        self._flush()  # the caller packed them: they leave now, not a loop turn later
        return await group.future

    def append_many_nowait(
        self, records: Iterable[bytes | tuple[bytes, Mapping[str, bytes] | None]]
    ) -> asyncio.Future[list[Position]]:
        """``append_many`` without a coroutine: the records are checked, queued and sent
        now; the future resolves to their positions once all are confirmed. When they do not
        all fit (``records_waiting_max``) nothing is queued and ``TooManyRequestsError`` is
        raised: ``append_many`` waits for room instead."""
        core = self._core
        core.check_usable()
        checked = core.check_records(records)
        future: asyncio.Future[list[Position]] = self._loop.create_future()
        if not checked:
            future.set_result([])
            return future
        if core.room() < len(checked):
            raise TooManyRequestsError(
                f"stream writer {self.name}: {len(checked)} records do not fit, {core.room()} may wait now"
            )
        invariant(core.append_all(checked, _Group(future, len(checked))) == len(checked),
                  "append_many_nowait: every record fits")
        self._flush()
        return future

    async def _wait_room(self, n: int) -> None:
        core = self._core
        while core.room() < n and core.error is None and core.waiting:
            self._progress.clear()
            await self._progress.wait()

    # --- carrying out the core's effects -------------------------------------------------
    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and self._core.waiting:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        ledger = self.current_ledger
        if ledger is None:
            self._execute(self._core.flush())
        else:
            ledger.cork()  # the sets packed now leave when packing ends, as one message per bookie
            try:
                self._execute(self._core.flush())
            finally:
                ledger.uncork()
        self._progress.set()

    def _execute(self, effects: list[Effect]) -> None:
        for effect in effects:
            kind = type(effect)
            if kind is SendSet:
                self._send(effect)  # type: ignore[arg-type]
            elif kind is ConfirmRecords:
                self._confirm(effect)  # type: ignore[arg-type]
            elif kind is FailRecords:
                error = effect.error  # type: ignore[union-attr]
                for handle in effect.handles:  # type: ignore[union-attr]
                    if type(handle) is _Group:
                        handle.fail(error)
                    elif not handle.done():
                        handle.set_exception(error)
            elif kind is StartRoll:
                self._spawn(self._roll(effect))  # type: ignore[arg-type]
            elif kind is CloseSegment:
                self._spawn(self._finish_roll(effect))  # type: ignore[arg-type]
                self._schedule_flush()
            elif kind is AbandonSegment:
                abandoned = self._ledgers.pop(effect.segment_seq, None)  # type: ignore[union-attr]
                if abandoned is not None:
                    self._spawn(abandoned.abort())
            elif kind is WriterFailed:
                self._log.warning("stream_writer_failed", error=str(effect.error))  # type: ignore[union-attr]
                if not self._closing:
                    self._spawn(self._release())
            else:
                invariant(False, f"unknown stream writer effect {effect!r}")

    @staticmethod
    def _confirm(effect: ConfirmRecords[Handle]) -> None:
        seq, entry_id, handles = effect.segment_seq, effect.entry_id, effect.handles
        first = handles[0]
        if type(first) is _Group and first is handles[-1]:  # a set of one append_many's records
            first.confirm([trusted(seq, entry_id, slot) for slot in range(len(handles))])
            return
        for slot, handle in enumerate(handles):
            if isinstance(handle, _Group):
                handle.confirm([trusted(seq, entry_id, slot)])
            elif not handle.done():
                handle.set_result(trusted(seq, entry_id, slot))

    def _send(self, effect: SendSet) -> None:
        try:
            self._ledgers[effect.segment_seq].append_callback(
                effect.data, functools.partial(self._on_sent, effect.set_id))
        except ScribaError as exc:
            self._execute(self._core.on_set_failed(effect.set_id, as_stream_error(exc, self.name)))

    def _on_sent(self, set_id: int, entry_id: int, error: ScribaError | None) -> None:
        """A set's entry confirmed (``error`` None) or failed: called by the ledger writer
        as it processes the bookies' answers, in entry order."""
        core = self._core
        if error is not None:
            effects = core.on_set_failed(set_id, as_stream_error(error, self.name))
        else:
            effects = core.on_lock_lost(self._leadership.reason) if self._leadership.lost.is_set() else []
            effects += core.on_set_confirmed(set_id, entry_id)
        self._execute(effects)
        self._progress.set()
        self._schedule_flush()

    def _configured(self, ledger: LedgerWriter) -> LedgerWriter:
        if self._lac_push_delay_s is not None:
            ledger.set_explicit_lac_delay(self._lac_push_delay_s)
        return ledger

    # --- rolling -------------------------------------------------------------------
    async def _roll(self, start: StartRoll) -> None:
        try:
            record, seq = await self._steps.run(add_segment_steps(self.token, self._catalog.now_ms))
            self._ledgers[seq] = self._configured(self._steps.take(record, seq))
            effects = self._core.on_segment_added(seq)
        except ScribaError as exc:
            effects = self._core.on_roll_failed(exc)
        except Exception as exc:  # a bug or a closed client: fail loudly, through the writer
            self._log.exception("stream_roll_failed")
            effects = self._core.on_roll_failed(StreamWriterClosedError(f"stream {self.name}: roll failed: {exc!r}"))
        self._execute(effects)
        self._progress.set()

    async def _finish_roll(self, effect: CloseSegment) -> None:
        self._log.info("stream_segment_rolled", segment=effect.segment_seq, next_segment=self._core.segment_seq,
                       records=effect.summary.record_count)
        try:
            await self._close_segment(effect)
            effects = self._core.on_segment_closed(effect.segment_seq)
        except ScribaError as exc:
            effects = self._core.on_roll_failed(exc)
        except Exception as exc:
            self._log.exception("stream_roll_failed")
            effects = self._core.on_roll_failed(StreamWriterClosedError(f"stream {self.name}: roll failed: {exc!r}"))
        self._execute(effects)
        self._progress.set()

    async def _close_segment(self, effect: CloseSegment) -> None:
        """Close the segment's ledger (at the summary's last entry) and mark the segment CLOSED."""
        seq, summary = effect.segment_seq, effect.summary
        ledger = self._ledgers[seq]
        await ledger.close()
        invariant(
            int(ledger.last_add_confirmed) == summary.last_entry_id,
            f"segment {seq}: LAC {ledger.last_add_confirmed} != last entry {summary.last_entry_id}",
        )
        token = self.token
        await self._catalog.update_stream(
            self.name,
            lambda r: not segment_closed(r, seq),
            lambda r: close_segment(r, seq, summary, self._catalog.now_ms(), token),
        )
        self._ledgers.pop(seq, None)

    # --- close ---------------------------------------------------------------------
    async def close(self) -> None:
        """Confirm everything queued, close the current segment, release the lock."""
        if self._closed:
            return
        self._closing = True
        core = self._core
        core.begin_close()
        try:
            while core.error is None and not core.idle:
                self._progress.clear()
                await self._progress.wait()
            if core.error is not None:
                raise core.error
            effect = core.close()
            await self._close_segment(effect)
            self._log.info("stream_writer_closed", segment=effect.segment_seq)
        finally:
            self._closed = True
            await self._stop_retention()
            await self._release()

    async def abort(self) -> None:
        """Stop at once without closing the segment (a crash, as the next writer sees it)."""
        self._closing = True
        self._execute(self._core.abort())
        for task in list(self._tasks):
            task.cancel()
        for ledger in [*self._ledgers.values(), *self._steps.created.values()]:
            await ledger.abort()
        self._closed = True
        await self._release()

    async def _release(self) -> None:
        with contextlib.suppress(ScribaError, NoSuchKeyError):
            await self._election.resign()

    async def _retain(self, client: Client, interval_s: float) -> None:
        """Apply retention every ``interval_s`` while the writer writes."""
        while not self._closing and self._core.error is None:
            await asyncio.sleep(interval_s)  # the period, not a wait for a condition
            try:
                point = await apply_retention(client, self._catalog, self.name)
            except ScribaError as exc:
                self._log.warning("stream_retention_failed", error=str(exc))
                continue
            self.retention_passes += 1
            if point is not None:
                self._log.info("stream_retention_applied", truncated_before=str(point))

    async def _stop_retention(self) -> None:
        if self._retention is not None:
            self._retention.cancel()
            await asyncio.wait({self._retention})  # a cancellation of close() itself still propagates

    async def __aenter__(self) -> StreamWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if exc_info[0] is None:
            await self.close()
        else:
            await self.abort()

    # --- internals -----------------------------------------------------------------
    async def _watch_lock(self) -> None:
        await self._leadership.lost.wait()
        if not self._closed and not self._closing:
            self._execute(self._core.on_lock_lost(self._leadership.reason))

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


# --- opening ----------------------------------------------------------------------------
async def open_stream_writer(
    client: Client,
    catalog: Catalog,
    name: str,
    settings: StreamSettings,
    password: bytes,
    options: WriterOptions,
) -> StreamWriter:
    """Lock, fence, recover every OPEN segment, start a new one (``writer_core.open_steps``)."""
    election = Election(catalog.store, lock_name(catalog.namespace, name))
    leadership = await take_lock(election, candidate_name(), options.lock_timeout_s)
    token = leadership.token
    steps = StepRunner(client, catalog, name, settings, password)
    try:
        record, seq = await steps.run(open_steps(token, catalog.now_ms))
        ledger = steps.take(record, seq)
    except BaseException:
        with contextlib.suppress(ScribaError):
            await election.resign()
        raise
    log.info("stream_writer_opened", stream=f"{catalog.namespace}/{name}", token=token, segment=seq)
    return StreamWriter(client, catalog, name, settings, password, election, leadership, ledger, seq,
                        last_publish_ms(record), options)


async def adopt_ledgers(
    client: Client, catalog: Catalog, name: str, settings: StreamSettings, password: bytes,
    options: WriterOptions, ledger_ids: Sequence[int],
) -> StreamRecord:
    """Take the writer lock, fence and recover, adopt the staged ``ledger_ids`` as CLOSED
    segments in one CAS (``writer_core.adopt_steps``), let the lock go. Repeating it
    with the same ledgers changes nothing."""
    election = Election(catalog.store, lock_name(catalog.namespace, name))
    leadership = await take_lock(election, candidate_name(), options.lock_timeout_s)
    try:
        steps = StepRunner(client, catalog, name, settings, password)
        record: StreamRecord = await steps.run(adopt_steps(leadership.token, ledger_ids, catalog.now_ms))
    finally:
        with contextlib.suppress(ScribaError):
            await election.resign()
    log.info("stream_ledgers_adopted", stream=f"{catalog.namespace}/{name}", token=leadership.token,
             ledgers=list(ledger_ids))
    return record
