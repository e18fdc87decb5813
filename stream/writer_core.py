"""The stream writer's rules without I/O: packing, bounds, rolls, ordered confirms, failure.

``WriterCore`` is one opened writer (one fencing token). The asyncio
``StreamWriter`` and the seeded simulation (tests/stream/sim_stream.py) both drive
it; neither decides anything the core decides.

Inputs (method calls):
- ``check_record(payload, headers)`` then ``append(record, handle)``: queue one record;
  ``handle`` is the driver's (a future, say) and comes back in the record's
  confirmation or failure. A bad record, a writer that failed or is closing, or
  ``records_waiting_max`` reached raise a typed error and queue nothing.
- ``flush()``: pack waiting records into record sets (up to ``record_set_bytes_max``
  each, at most ``sets_inflight_max`` sets in flight) -> ``SendSet`` effects, and a
  ``StartRoll`` once the segment passes a rolling limit (checked after each set, so a
  segment overshoots by at most one set).
- ``on_set_confirmed(set_id, entry_id)`` / ``on_set_failed(set_id, error)``: the
  ledger's answer for one set (a ledger confirms its entries in order).
- ``on_segment_added(seq)`` / ``on_roll_failed(error)``: the roll's new ledger is in
  the stream record (CAS done), or the roll failed.
- ``on_segment_closed(seq)``: a ``CloseSegment`` was carried out (ledger closed,
  segment marked CLOSED).
- ``on_lock_lost(reason)``, ``abort()``, ``begin_close()`` then ``close()``.

Outputs (effects, frozen values): ``SendSet``, ``ConfirmRecords`` (a set's records,
slot by slot), ``FailRecords``, ``StartRoll``, ``CloseSegment``, ``AbandonSegment`` (a
roll's new ledger that will never be written), ``WriterFailed`` (release the lock).

A roll: ``StartRoll`` (nothing more goes to the old segment; appends still queue) ->
the driver creates a ledger and adds its segment (:func:`add_segment_steps`) ->
``on_segment_added`` -> once the old segment's sets are all answered, the core
switches to the new segment and emits ``CloseSegment`` for the old one. A new roll
starts only after ``on_segment_closed`` for the previous one, so at most one OPEN
segment ever precedes the one being added.

Invariants: records are confirmed in the order they were appended (a segment's sets
drain before the next segment gets any); after a set fails, no later record is
confirmed; after a fenced writer or a lost lock (``WriterFencedError``) nothing more
is confirmed at all; a roll failing otherwise lets the sets already sent finish as
the bookies say. ``CloseSegment`` carries the summary the segment record keeps.

:func:`open_steps` and :func:`add_segment_steps` are the opening and roll procedures
as generators of ``Step`` values (no I/O: the driver performs each step and sends
back its result, or throws its error in): fence the token, recover and close every
OPEN segment, finish deletes a crashed truncation left, add a new segment.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from scriba.clock import Clock
from scriba.errors import (
    ConfigError,
    LedgerClosedError,
    LedgerFencedError,
    RecordTooLargeError,
    ScribaError,
    StreamNotFoundError,
    StreamWriterClosedError,
    TooManyRequestsError,
    WriterFencedError,
)
from scriba.invariant import invariant
from scriba.stream import record_set
from scriba.stream.segments import (
    Segment,
    SegmentStats,
    SegmentSummary,
    StagedSegment,
    StreamRecord,
    add_segment,
    adopt_segments,
    close_segment,
    fence,
    finish_deletes,
    next_publish_ms,
    open_segments,
    roll_due,
    segment_closed,
)
from scriba.stream.settings import StreamSettings

H = TypeVar("H")

CheckedRecord = tuple[bytes, Mapping[str, bytes], int]
"""``(payload, headers, encoded size)`` from :meth:`WriterCore.check_record`."""


# --- effects --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SendSet:
    """Append ``data`` (one record set) to segment ``segment_seq``'s ledger; answer with
    ``on_set_confirmed(set_id, entry_id)`` or ``on_set_failed(set_id, error)``."""

    set_id: int
    segment_seq: int
    data: bytes


@dataclass(frozen=True, slots=True)
class ConfirmRecords(Generic[H]):
    """The records of one set are confirmed: ``handles[slot]`` is at ``(segment_seq, entry_id, slot)``."""

    segment_seq: int
    entry_id: int
    handles: Sequence[H]


@dataclass(frozen=True, slots=True)
class FailRecords(Generic[H]):
    handles: Sequence[H]
    error: ScribaError


@dataclass(frozen=True, slots=True)
class StartRoll:
    """Create the next segment (:func:`add_segment_steps`); answer ``on_segment_added`` or
    ``on_roll_failed``."""

    reason: str
    segment_seq: int  # the segment being rolled


@dataclass(frozen=True, slots=True)
class CloseSegment:
    """Close segment ``segment_seq``'s ledger (its last entry must be ``summary.last_entry_id``)
    and mark the segment CLOSED with ``summary``; answer ``on_segment_closed`` (or
    ``on_roll_failed``)."""

    segment_seq: int
    summary: SegmentSummary


@dataclass(frozen=True, slots=True)
class AbandonSegment:
    """A roll's new segment will never be written (the writer failed): drop its ledger
    handle; the segment stays OPEN and empty until the next writer recovers it."""

    segment_seq: int


@dataclass(frozen=True, slots=True)
class WriterFailed:
    """The writer is unusable from now on: release the lock."""

    error: ScribaError


Effect = SendSet | ConfirmRecords[Any] | FailRecords[Any] | StartRoll | CloseSegment | AbandonSegment | WriterFailed


def as_stream_error(exc: BaseException, name: str) -> ScribaError:
    """A ledger's or store's error as the stream writer reports it."""
    if isinstance(exc, LedgerFencedError | LedgerClosedError):
        return WriterFencedError(f"stream {name}: a newer writer recovered the segment ({exc})")
    if isinstance(exc, ScribaError):
        return exc
    return StreamWriterClosedError(f"stream {name}: {type(exc).__name__}: {exc}")


# --- the core -------------------------------------------------------------------------
@dataclass(slots=True)
class _SegmentState:
    seq: int
    started_s: float
    records: int = 0
    size_bytes: int = 0
    entries: int = 0
    last_slot: int = -1
    last_publish_ms: int = 0
    inflight: int = 0  # sets sent, not answered

    def summary(self) -> SegmentSummary:
        if not self.entries:
            return SegmentSummary()
        return SegmentSummary(self.entries - 1, self.last_slot, self.records, self.size_bytes, self.last_publish_ms)


@dataclass(slots=True)
class _Set(Generic[H]):
    segment_seq: int
    entry_id: int  # the ledger entry it must land at
    handles: list[H]


class WriterCore(Generic[H]):
    def __init__(
        self,
        name: str,
        settings: StreamSettings,
        clock: Clock,
        *,
        segment_seq: int,
        publish_ms: int,
        sets_inflight_max: int,
        records_waiting_max: int,
    ) -> None:
        invariant(sets_inflight_max >= 1 and records_waiting_max >= 1, "writer bounds must be >= 1")
        self.name = name
        self.settings = settings
        self._record_bytes_max = settings.record_bytes_max
        self._clock = clock
        self._sets_inflight_max = sets_inflight_max
        self._records_waiting_max = records_waiting_max
        self._segment = _SegmentState(segment_seq, clock.monotonic())
        self._publish_ms = publish_ms
        self._waiting: deque[tuple[bytes, Mapping[str, bytes], int, H]] = deque()
        self._inflight: dict[int, _Set[H]] = {}
        self._next_set_id = 0
        self._error: ScribaError | None = None
        self._fails_inflight = True
        self._closing = False
        self._closed = False
        # rolls: rolling (nothing more to this segment) -> adding -> pending switch -> closing old
        self._roll_reason: str | None = None  # a roll is due
        self._adding = False  # StartRoll emitted, no answer yet
        self._pending_seq: int | None = None  # the added segment, waiting for the old one to drain
        self._closing_seq: int | None = None  # CloseSegment emitted, no answer yet

    # --- views ----------------------------------------------------------------------
    @property
    def segment_seq(self) -> int:
        return self._segment.seq

    @property
    def error(self) -> ScribaError | None:
        return self._error

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def sets_inflight(self) -> int:
        return len(self._inflight)

    @property
    def idle(self) -> bool:
        """Nothing queued, in flight, or rolling: ``close()`` may be called."""
        return not (self._waiting or self._inflight or self._roll_reason or self._adding
                    or self._pending_seq is not None or self._closing_seq is not None)

    def check_usable(self) -> None:
        if self._error is not None:
            if isinstance(self._error, WriterFencedError):
                raise self._error
            raise StreamWriterClosedError(f"stream writer {self.name} failed: {self._error}")
        if self._closing or self._closed:
            raise StreamWriterClosedError(f"stream writer {self.name}: close() was called")

    # --- appends --------------------------------------------------------------------
    def check_record(self, payload: bytes, headers: Mapping[str, bytes] | None) -> CheckedRecord:
        """A record as it will be queued; ``ConfigError`` / ``RecordTooLargeError`` if it cannot be."""
        if type(payload) is not bytes:
            if not isinstance(payload, bytes | bytearray | memoryview):
                raise ConfigError(f"record payload must be bytes, got {type(payload).__name__}")
            payload = bytes(payload)
        if headers:
            checked = record_set.check_headers(headers)
            size = record_set.encoded_size(payload, checked)
        else:
            checked = record_set.NO_HEADERS
            size = record_set.RECORD_OVERHEAD_BYTES + len(payload)
        if size > self._record_bytes_max:
            raise RecordTooLargeError(
                f"record of {size} bytes (with headers) exceeds record_bytes_max {self.settings.record_bytes_max}"
            )
        return payload, checked, size

    def check_records(self, records: Iterable[bytes | tuple[bytes, Mapping[str, bytes] | None]]) -> list[CheckedRecord]:
        """``check_record`` for each of ``records`` (payloads, or ``(payload, headers)``)."""
        limit = self._record_bytes_max
        overhead = record_set.RECORD_OVERHEAD_BYTES
        no_headers = record_set.NO_HEADERS
        checked: list[CheckedRecord] = []
        for record in records:
            if type(record) is bytes and len(record) + overhead <= limit:
                checked.append((record, no_headers, len(record) + overhead))  # the common case, inline
            elif isinstance(record, tuple):
                checked.append(self.check_record(*record))
            else:
                checked.append(self.check_record(record, None))  # type: ignore[arg-type]
        return checked

    def append_all(self, records: Sequence[CheckedRecord], handle: H) -> int:
        """Queue as many of ``records`` as may wait now, all with ``handle``; how many."""
        if self._error is not None or self._closing:
            self.check_usable()
        room = self._records_waiting_max - len(self._waiting)
        if room <= 0:
            return 0
        taken = records if len(records) <= room else records[:room]
        self._waiting.extend([(payload, headers, size, handle) for payload, headers, size in taken])
        return len(taken)

    def append(self, record: CheckedRecord, handle: H) -> None:
        """Queue a checked record; it goes out with the next ``flush``."""
        if self._error is not None or self._closing:
            self.check_usable()
        if len(self._waiting) >= self._records_waiting_max:
            raise TooManyRequestsError(f"{len(self._waiting)} records waiting (records_waiting_max)")
        payload, headers, size = record
        self._waiting.append((payload, headers, size, handle))

    def room(self) -> int:
        """How many more records may wait now."""
        return self._records_waiting_max - len(self._waiting)

    def flush(self) -> list[Effect]:
        """Pack what waits into record sets, as far as the bounds and rolls allow."""
        effects: list[Effect] = []
        waiting = self._waiting
        segment = self._segment
        limit = self.settings.record_set_bytes_max
        while waiting and self._error is None and self._roll_reason is None:
            if segment.inflight >= self._sets_inflight_max:
                break
            first = waiting.popleft()
            batch = [first]
            total = record_set.HEADER_BYTES + first[2]
            while waiting and total + waiting[0][2] <= limit:
                item = waiting.popleft()
                total += item[2]
                batch.append(item)
            effects.append(self._pack(segment, batch))
            stats = SegmentStats(segment.records, segment.size_bytes, self._clock.monotonic() - segment.started_s)
            reason = roll_due(self.settings, stats)
            if reason is not None:
                self._roll_reason = reason
                effects.extend(self._start_roll())
        return effects

    def _pack(self, segment: _SegmentState, batch: list[tuple[bytes, Mapping[str, bytes], int, H]]) -> SendSet:
        publish_ms = next_publish_ms(self._publish_ms, int(self._clock.wall() * 1000))
        self._publish_ms = publish_ms
        data = record_set.encode(
            batch, records_before=segment.records, bytes_before=segment.size_bytes, publish_time_ms=publish_ms
        )
        set_id = self._next_set_id
        self._next_set_id = set_id + 1
        self._inflight[set_id] = _Set(segment.seq, segment.entries, [item[3] for item in batch])
        segment.records += len(batch)
        segment.size_bytes += len(data)
        segment.entries += 1
        segment.last_slot = len(batch) - 1
        segment.last_publish_ms = publish_ms
        segment.inflight += 1
        return SendSet(set_id, segment.seq, data)

    # --- ledger answers ---------------------------------------------------------------
    def on_set_confirmed(self, set_id: int, entry_id: int) -> list[Effect]:
        sent = self._take_set(set_id)
        effects: list[Effect] = []
        if self._error is not None and self._fails_inflight:
            effects.append(FailRecords(sent.handles, self._error))
        else:
            invariant(entry_id == sent.entry_id,
                      f"stream {self.name}: set {set_id} landed at entry {entry_id}, expected {sent.entry_id}")
            effects.append(ConfirmRecords(sent.segment_seq, entry_id, sent.handles))
        effects.extend(self._maybe_switch())
        return effects

    def on_set_failed(self, set_id: int, error: ScribaError) -> list[Effect]:
        """A set failed: it, and every record after it, fails (ordered confirms)."""
        sent = self._take_set(set_id)
        effects = self._fail(error)
        self._fails_inflight = True  # nothing after a failed set may be confirmed
        effects.append(FailRecords(sent.handles, self._error or error))
        effects.extend(self._maybe_switch())
        return effects

    def _take_set(self, set_id: int) -> _Set[H]:
        sent = self._inflight.pop(set_id, None)
        invariant(sent is not None, f"stream {self.name}: answer for set {set_id}, which is not in flight")
        assert sent is not None  # for mypy; the invariant above raises
        invariant(sent.segment_seq == self._segment.seq,
                  f"stream {self.name}: set of segment {sent.segment_seq} in flight after the switch")
        self._segment.inflight -= 1
        return sent

    # --- rolls ------------------------------------------------------------------------
    def _start_roll(self) -> list[Effect]:
        if self._closing_seq is not None or self._adding or self._pending_seq is not None:
            return []  # the previous roll is not finished; on_segment_closed starts this one
        invariant(self._roll_reason is not None, "a roll starts only when one is due")
        self._adding = True
        return [StartRoll(self._roll_reason or "", self._segment.seq)]

    def on_segment_added(self, seq: int) -> list[Effect]:
        invariant(self._adding, f"stream {self.name}: segment {seq} added without a roll")
        self._adding = False
        if self._error is not None:
            return [AbandonSegment(seq)]
        self._pending_seq = seq
        return self._maybe_switch()

    def _maybe_switch(self) -> list[Effect]:
        seq = self._pending_seq
        if seq is None or self._segment.inflight:
            return []
        self._pending_seq = None
        if self._error is not None:
            return [AbandonSegment(seq)]
        old = self._segment
        self._segment = _SegmentState(seq, self._clock.monotonic())
        self._roll_reason = None
        self._closing_seq = old.seq
        return [CloseSegment(old.seq, old.summary())]

    def on_segment_closed(self, seq: int) -> list[Effect]:
        invariant(self._closing_seq == seq, f"stream {self.name}: segment {seq} closed, {self._closing_seq} expected")
        self._closing_seq = None
        if self._error is None and self._roll_reason is not None:
            return self._start_roll()
        return []

    def on_roll_failed(self, error: ScribaError) -> list[Effect]:
        """Creating, adding or closing a segment failed. A fenced writer confirms nothing
        more; otherwise the sets already sent finish as the bookies say."""
        self._adding = False
        self._closing_seq = None
        return self._fail(error, inflight=isinstance(error, WriterFencedError))

    # --- failure and close -------------------------------------------------------------
    def on_lock_lost(self, reason: str) -> list[Effect]:
        return self._fail(WriterFencedError(f"stream {self.name}: writer lock lost ({reason})"))

    def abort(self) -> list[Effect]:
        """Stop at once (a crash as the next writer sees it): everything not confirmed fails."""
        self._closing = True
        effects = self._fail(StreamWriterClosedError(f"stream writer {self.name}: aborted"))
        self._closed = True
        return effects

    def _fail(self, error: ScribaError, *, inflight: bool = True) -> list[Effect]:
        if self._error is not None:
            return []
        self._error = error
        self._fails_inflight = inflight
        effects: list[Effect] = [WriterFailed(error)]
        if self._waiting:
            effects.append(FailRecords([item[3] for item in self._waiting], error))
            self._waiting.clear()
        if self._pending_seq is not None:
            effects.append(AbandonSegment(self._pending_seq))
            self._pending_seq = None
        return effects

    def begin_close(self) -> None:
        """No more appends; the driver waits until ``idle`` (or an error), then ``close()``."""
        self._closing = True

    def close(self) -> CloseSegment:
        """The current segment's close (the writer's last step)."""
        invariant(self.idle and self._error is None, f"stream {self.name}: close() while busy or failed")
        self._closing = True
        self._closed = True
        return CloseSegment(self._segment.seq, self._segment.summary())


# --- opening and adding a segment: steps the driver performs ---------------------------
@dataclass(frozen=True, slots=True)
class UpdateStream:
    """``update_metadata`` on the stream record; the result is the record after it."""

    needs_update: Callable[[StreamRecord], bool]
    transform: Callable[[StreamRecord], StreamRecord]


@dataclass(frozen=True, slots=True)
class RecoverSegment:
    """Open the segment's ledger with recovery (fencing its writer); the result is the
    :class:`SegmentSummary` its last entry gives (``stream.ledgers.recover_segment``)."""

    segment: Segment


@dataclass(frozen=True, slots=True)
class DeleteLedgers:
    """Delete the ledgers (gone already counts as deleted); the result is the ids done."""

    ledger_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CreateLedger:
    """Create a ledger with the stream's settings; the result is its id (the driver keeps the handle)."""


@dataclass(frozen=True, slots=True)
class DiscardLedger:
    """A created ledger that is not in the stream record: drop the handle, and delete the
    ledger if ``delete`` (only when the CAS surely did not land: after a timeout the
    record may hold it, and deleting it then would cut the stream)."""

    ledger_id: int
    delete: bool


Step = UpdateStream | RecoverSegment | DeleteLedgers | CreateLedger | DiscardLedger
Steps = Generator[Step, Any, tuple[StreamRecord, int]]


def open_steps(token: int, now_ms: Callable[[], int]) -> Steps:
    """Opening a writer once its lock is held with ``token``; returns the record and the new segment."""
    yield from _fence_and_recover(token, now_ms)
    return (yield from add_segment_steps(token, now_ms))


def _fence_and_recover(token: int, now_ms: Callable[[], int]) -> Generator[Step, Any, StreamRecord]:
    """Fence with ``token``, close every OPEN segment at its recovered end, finish deletes."""
    record: StreamRecord = yield UpdateStream(lambda r: r.writer_epoch != token, lambda r: fence(r, token))
    for segment in open_segments(record):
        summary: SegmentSummary = yield RecoverSegment(segment)
        seq = segment.seq
        record = yield UpdateStream(
            lambda r, seq=seq: not segment_closed(r, seq),  # type: ignore[misc]
            lambda r, seq=seq, s=summary: close_segment(r, seq, s, now_ms(), token),  # type: ignore[misc]
        )
    if record.deleting:  # a truncation that crashed before deleting its ledgers
        done: list[int] = yield DeleteLedgers(record.deleting)
        record = yield UpdateStream(lambda r: bool(set(r.deleting) & set(done)), lambda r: finish_deletes(r, done))
    return record


def adopt_steps(token: int, ledger_ids: Sequence[int], now_ms: Callable[[], int]
                ) -> Generator[Step, Any, StreamRecord]:
    """Staged ledgers adopted as segments (``segments.adopt_segments``) once the lock is held
    with ``token``: fence and recover as an opening writer does, summarise each staged
    ledger (opened with recovery, so no late add can change it), then ONE CAS."""
    yield from _fence_and_recover(token, now_ms)
    staged = []
    for ledger_id in ledger_ids:
        summary: SegmentSummary = yield RecoverSegment(Segment(-1, ledger_id))
        staged.append(StagedSegment(ledger_id, summary))
    ids = set(ledger_ids)
    record: StreamRecord = yield UpdateStream(
        lambda r: not ids <= {s.ledger_id for s in r.segments} | set(r.deleting),
        lambda r: adopt_segments(r, token, staged, now_ms()),
    )
    return record


def add_segment_steps(token: int, now_ms: Callable[[], int]) -> Steps:
    """A new ledger added as the next segment (fenced by ``token``); returns the record and its seq."""
    ledger_id: int = yield CreateLedger()
    try:
        record: StreamRecord = yield UpdateStream(
            lambda r: all(s.ledger_id != ledger_id for s in r.segments),
            lambda r: add_segment(r, token, ledger_id, now_ms()),
        )
    except GeneratorExit:
        raise
    except BaseException as exc:
        yield DiscardLedger(ledger_id, delete=isinstance(exc, WriterFencedError | StreamNotFoundError))
        raise
    seq = next(s.seq for s in record.segments if s.ledger_id == ledger_id)
    return record, seq
