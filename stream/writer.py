"""``StreamWriter``: the single writer of a stream (from ``Namespace.open_writer``).

Opening (:func:`open_stream_writer`) follows :mod:`scriba.stream.segments`: take
the writer lock (an :class:`~scriba.meta.election.Election`; its token fences),
record the token in the stream record, recover and close every OPEN segment, then
start a new segment.

Appends: ``append_async`` queues a record and returns a future; the records queued
in one event-loop turn (or given to ``append_many``) are packed into one record set,
up to ``record_set_bytes_max``, and sent as one ledger entry. At most
``sets_inflight_max`` sets are in flight; more records wait (bounded by
``records_waiting_max``). Futures resolve in order with each record's
:class:`~scriba.stream.position.Position`.

Rolling: once the current segment passes a limit (checked after each set, so a
segment overshoots by at most one set), nothing more is sent to it; appends are
still accepted and wait. A new ledger is created and added to the stream record
(CAS, fenced by the token); once the old ledger's sets are all confirmed (so a
failure there can never leave later records in the stream without earlier ones)
the writer switches to the new segment and sends what waited, and the old ledger
is closed and its segment marked CLOSED in the background. Rolls run one at a time.

Failure: a failed set fails its records and every later one; the writer is then
unusable (``StreamWriterClosedError`` naming the cause) and releases its lock. A
fenced ledger or a lost lock is ``WriterFencedError``: after it, nothing more is
ever confirmed by this writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from scriba.client import Client, LedgerWriter
from scriba.errors import (
    ConfigError,
    LedgerClosedError,
    LedgerFencedError,
    NoSuchKeyError,
    RecordTooLargeError,
    ScribaError,
    StreamNotFoundError,
    StreamWriterClosedError,
    TooManyRequestsError,
    WriterFencedError,
    WriterLockedError,
)
from scriba.invariant import invariant
from scriba.log import get_logger
from scriba.meta.election import Election, Leadership
from scriba.stream import record_set
from scriba.stream.catalog import Catalog
from scriba.stream.ledgers import create_segment_ledger, delete_ledgers, recover_segment
from scriba.stream.position import Position
from scriba.stream.segments import (
    SegmentStats,
    SegmentSummary,
    StreamRecord,
    add_segment,
    close_segment,
    fence,
    finish_deletes,
    last_publish_ms,
    lock_name,
    next_publish_ms,
    open_segments,
    roll_due,
    segment_closed,
)
from scriba.stream.settings import StreamSettings

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class WriterOptions:
    lock_timeout_s: float = 30.0
    sets_inflight_max: int = 256
    records_waiting_max: int = 100_000


@dataclass(slots=True)
class _Segment:
    """The writer's view of the segment it writes."""

    seq: int
    ledger: LedgerWriter
    started: float
    records: int = 0
    size_bytes: int = 0
    entries: int = 0
    last_slot: int = -1
    inflight: int = 0


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
        self._client = client
        self._catalog = catalog
        self.name = name
        self.settings = settings
        self._password = password
        self._election = election
        self._leadership = leadership
        self._options = options
        self._loop = asyncio.get_running_loop()
        self._segment = _Segment(seq, ledger, time.monotonic())
        self._publish_ms = publish_ms
        self._waiting: deque[tuple[bytes, Mapping[str, bytes], int, asyncio.Future[Position]]] = deque()
        self._flush_scheduled = False
        self._error: ScribaError | None = None
        self._fails_inflight = True
        self._closing = False
        self._closed = False
        self._switching = False  # a roll waits for the old segment's sets: do not send
        self._roll_task: asyncio.Task[None] | None = None  # the roll that has not switched yet
        self._rolls_running = 0
        self._roll_lock = asyncio.Lock()
        self._progress = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._log = log.bind(stream=f"{catalog.namespace}/{name}", token=leadership.token)
        self._spawn(self._watch_lock())

    # --- views ---------------------------------------------------------------------
    @property
    def token(self) -> int:
        """The fencing token this writer holds the stream with."""
        return self._leadership.token

    @property
    def segment_seq(self) -> int:
        return self._segment.seq

    @property
    def error(self) -> ScribaError | None:
        return self._error

    @property
    def pending(self) -> int:
        return len(self._waiting) + self._segment.inflight

    # --- appends -------------------------------------------------------------------
    def append_async(self, payload: bytes, headers: Mapping[str, bytes] | None = None) -> asyncio.Future[Position]:
        """Queue one record; the future resolves to its position once confirmed."""
        self._check_usable()
        if not isinstance(payload, bytes):
            if isinstance(payload, bytearray | memoryview):
                payload = bytes(payload)
            else:
                raise ConfigError(f"record payload must be bytes, got {type(payload).__name__}")
        checked = record_set.check_headers(headers)
        size = record_set.encoded_size(payload, checked)
        if size > self.settings.record_bytes_max:
            raise RecordTooLargeError(
                f"record of {size} bytes (with headers) exceeds record_bytes_max {self.settings.record_bytes_max}"
            )
        if len(self._waiting) >= self._options.records_waiting_max:
            raise TooManyRequestsError(f"{len(self._waiting)} records waiting (records_waiting_max)")
        future: asyncio.Future[Position] = self._loop.create_future()
        self._waiting.append((payload, checked, size, future))
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
        items = [r if isinstance(r, tuple) else (r, None) for r in records]
        self._check_usable()
        for payload, headers in items:
            if not isinstance(payload, bytes | bytearray | memoryview):
                raise ConfigError(f"record payload must be bytes, got {type(payload).__name__}")
            size = record_set.encoded_size(bytes(payload), record_set.check_headers(headers))
            if size > self.settings.record_bytes_max:
                raise RecordTooLargeError(
                    f"record of {size} bytes exceeds record_bytes_max {self.settings.record_bytes_max}"
                )
        await self._wait_room(len(items))
        futures = [self.append_async(p, h) for p, h in items]
        return list(await asyncio.gather(*futures))

    async def _wait_room(self, n: int) -> None:
        limit = max(self._options.records_waiting_max - n, 0)
        while len(self._waiting) > limit and self._error is None:
            self._progress.clear()
            await self._progress.wait()

    def _check_usable(self) -> None:
        if self._error is not None:
            raise self._error if isinstance(self._error, WriterFencedError) else StreamWriterClosedError(
                f"stream writer {self.name} failed: {self._error}"
            )
        if self._closing or self._closed:
            raise StreamWriterClosedError(f"stream writer {self.name}: close() was called")

    # --- sending -------------------------------------------------------------------
    def _flush(self) -> None:
        self._flush_scheduled = False
        waiting = self._waiting
        limit = self.settings.record_set_bytes_max
        while waiting and self._error is None and not self._switching:
            segment = self._segment
            if segment.inflight >= self._options.sets_inflight_max:
                return
            batch = [waiting.popleft()]
            total = record_set.HEADER_BYTES + batch[0][2]
            while waiting and total + waiting[0][2] <= limit:
                item = waiting.popleft()
                total += item[2]
                batch.append(item)
            self._send(segment, batch)
            if self._roll_task is None and self._error is None:
                stats = SegmentStats(segment.records, segment.size_bytes, time.monotonic() - segment.started)
                reason = roll_due(self.settings, stats)
                if reason is not None:  # nothing more goes to this segment
                    self._switching = True
                    self._roll_task = self._spawn(self._roll(reason))
        self._progress.set()

    def _send(self, segment: _Segment, batch: list[tuple[bytes, Mapping[str, bytes], int, asyncio.Future[Position]]]) -> None:
        publish_ms = next_publish_ms(self._publish_ms, self._catalog.now_ms())
        self._publish_ms = publish_ms
        data = record_set.encode(
            [(p, h) for p, h, _, _ in batch], records_before=segment.records,
            bytes_before=segment.size_bytes, publish_time_ms=publish_ms,
        )
        futures = [f for _, _, _, f in batch]
        try:
            sent = segment.ledger.append_async(data)
        except ScribaError as exc:
            self._fail(self._as_stream_error(exc))
            self._fail_futures(futures)
            return
        segment.records += len(batch)
        segment.size_bytes += len(data)
        segment.entries += 1
        segment.last_slot = len(batch) - 1
        segment.inflight += 1
        sent.add_done_callback(lambda done: self._on_sent(segment, futures, done))

    def _on_sent(self, segment: _Segment, futures: list[asyncio.Future[Position]], done: asyncio.Future[int]) -> None:
        segment.inflight -= 1
        if done.cancelled():
            self._fail(StreamWriterClosedError(f"stream writer {self.name}: append cancelled"))
        elif done.exception() is not None:
            self._fail(self._as_stream_error(done.exception()))  # type: ignore[arg-type]
        elif self._leadership.lost.is_set():
            self._fail(WriterFencedError(f"stream {self.name}: writer lock lost ({self._leadership.reason})"))
        if self._error is not None and (self._fails_inflight or done.exception() is not None or done.cancelled()):
            self._fail_futures(futures)
        else:
            entry_id = done.result()
            seq = segment.seq
            for slot, future in enumerate(futures):
                if not future.done():
                    future.set_result(Position(seq, entry_id, slot))
        self._progress.set()
        if self._waiting and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _fail_futures(self, futures: Iterable[asyncio.Future[Position]]) -> None:
        error = self._error or StreamWriterClosedError("stream writer failed")
        for future in futures:
            if not future.done():
                future.set_exception(error)

    def _as_stream_error(self, exc: BaseException) -> ScribaError:
        if isinstance(exc, LedgerFencedError | LedgerClosedError):
            return WriterFencedError(f"stream {self.name}: a newer writer recovered the segment ({exc})")
        if isinstance(exc, ScribaError):
            return exc
        return StreamWriterClosedError(f"stream {self.name}: {type(exc).__name__}: {exc}")

    def _fail(self, error: ScribaError, *, inflight: bool = True) -> None:
        """Fail the waiting records and all later ones; with ``inflight`` also the sets sent.

        A roll that failed leaves the sets already sent to finish as the bookies say
        (they precede everything failed); a fenced or lock-less writer confirms nothing more.
        """
        if self._error is not None:
            return
        self._error = error
        self._fails_inflight = inflight
        self._log.warning("stream_writer_failed", error=str(error))
        while self._waiting:
            *_, future = self._waiting.popleft()
            if not future.done():
                future.set_exception(error)
        self._progress.set()
        if not self._closing:
            self._spawn(self._release())

    # --- rolling -------------------------------------------------------------------
    async def _roll(self, reason: str) -> None:
        self._rolls_running += 1
        try:
            async with self._roll_lock:
                await self._roll_locked(reason)
        except ScribaError as exc:
            self._fail(exc, inflight=isinstance(exc, WriterFencedError))
        except Exception as exc:  # a bug or a closed client: fail loudly, through the writer
            self._log.exception("stream_roll_failed")
            self._fail(StreamWriterClosedError(f"stream {self.name}: roll failed: {exc!r}"), inflight=False)
        finally:
            self._rolls_running -= 1
            self._progress.set()

    async def _roll_locked(self, reason: str) -> None:
        old = self._segment
        token = self.token
        new_ledger = await create_segment_ledger(
            self._client, self.settings, self._password, namespace=self._catalog.namespace, stream=self.name
        )
        try:
            record = await self._catalog.update_stream(
                self.name,
                lambda r: all(s.ledger_id != new_ledger.ledger_id for s in r.segments),
                lambda r: add_segment(r, token, new_ledger.ledger_id, self._catalog.now_ms()),
            )
        except BaseException as exc:
            await _discard(self._client, new_ledger, exc)
            raise
        new_seq = next(s.seq for s in record.segments if s.ledger_id == new_ledger.ledger_id)
        while old.inflight and self._error is None:
            self._progress.clear()
            await self._progress.wait()
        if self._error is not None:
            await new_ledger.abort()
            return  # the new segment stays OPEN and empty: the next writer recovers it
        self._segment = _Segment(new_seq, new_ledger, time.monotonic())
        self._switching = False
        self._roll_task = None
        self._log.info("stream_segment_rolled", reason=reason, segment=old.seq, next_segment=new_seq,
                       records=old.records)
        self._flush()
        await self._close_segment(old)

    async def _close_segment(self, segment: _Segment) -> None:
        invariant(segment.inflight == 0, f"closing segment {segment.seq} with sets in flight")
        await segment.ledger.close()
        invariant(
            int(segment.ledger.last_add_confirmed) == segment.entries - 1,
            f"segment {segment.seq}: LAC {segment.ledger.last_add_confirmed} != {segment.entries - 1} entries",
        )
        summary = SegmentSummary(
            segment.entries - 1, segment.last_slot if segment.entries else -1,
            segment.records, segment.size_bytes, self._publish_ms if segment.entries else 0,
        )
        token = self.token
        await self._catalog.update_stream(
            self.name,
            lambda r: not segment_closed(r, segment.seq),
            lambda r: close_segment(r, segment.seq, summary, self._catalog.now_ms(), token),
        )

    # --- close ---------------------------------------------------------------------
    async def close(self) -> None:
        """Confirm everything queued, close the current segment, release the lock."""
        if self._closed:
            return
        self._closing = True
        try:
            while self._error is None and (self._waiting or self._segment.inflight or self._rolls_running):
                self._progress.clear()
                await self._progress.wait()
            if self._error is not None:
                raise self._error
            await self._close_segment(self._segment)
            self._log.info("stream_writer_closed", segment=self._segment.seq)
        finally:
            self._closed = True
            await self._release()

    async def abort(self) -> None:
        """Stop at once without closing the segment (a crash, as the next writer sees it)."""
        self._closing = True
        self._fail(StreamWriterClosedError(f"stream writer {self.name}: aborted"))
        for task in list(self._tasks):
            task.cancel()
        await self._segment.ledger.abort()
        self._closed = True
        await self._release()

    async def _release(self) -> None:
        with contextlib.suppress(ScribaError, NoSuchKeyError):
            await self._election.resign()

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
            self._fail(WriterFencedError(f"stream {self.name}: writer lock lost ({self._leadership.reason})"))

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


# --- opening ----------------------------------------------------------------------------
def _candidate() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


async def _take_lock(election: Election, candidate: str, timeout_s: float) -> Leadership:
    try:
        async with asyncio.timeout(timeout_s):
            return await election.campaign(candidate)
    except TimeoutError:
        # A create that landed just before the deadline would hold the lock for nobody.
        with contextlib.suppress(ScribaError):
            leader = await election.leader()
            if leader is not None and leader[0] == candidate:
                record = await election.store.get(election.key)
                await election.store.delete(election.key, expected_version=record.version)
        holder = await election.leader()
        raise WriterLockedError(
            f"writer lock {election.name} held by {holder[0] if holder else 'someone'}; "
            f"not free within {timeout_s} s"
        ) from None


async def open_stream_writer(
    client: Client,
    catalog: Catalog,
    name: str,
    settings: StreamSettings,
    password: bytes,
    options: WriterOptions,
) -> StreamWriter:
    """Lock, fence, recover every OPEN segment, start a new one (see the module docstring)."""
    election = Election(catalog.store, lock_name(catalog.namespace, name))
    leadership = await _take_lock(election, _candidate(), options.lock_timeout_s)
    token = leadership.token
    try:
        record = await catalog.update_stream(name, lambda r: r.writer_epoch != token, lambda r: fence(r, token))
        record = await _recover_open_segments(client, catalog, name, record, token, password)
        ledger = await create_segment_ledger(client, settings, password, namespace=catalog.namespace, stream=name)
        try:
            record = await catalog.update_stream(
                name,
                lambda r: all(s.ledger_id != ledger.ledger_id for s in r.segments),
                lambda r: add_segment(r, token, ledger.ledger_id, catalog.now_ms()),
            )
        except BaseException as exc:
            await _discard(client, ledger, exc)
            raise
        seq = next(s.seq for s in record.segments if s.ledger_id == ledger.ledger_id)
    except BaseException:
        with contextlib.suppress(ScribaError):
            await election.resign()
        raise
    log.info("stream_writer_opened", stream=f"{catalog.namespace}/{name}", token=token, segment=seq)
    return StreamWriter(client, catalog, name, settings, password, election, leadership, ledger, seq,
                        last_publish_ms(record), options)


async def _discard(client: Client, ledger: LedgerWriter, error: BaseException) -> None:
    """A new segment's ledger whose CAS failed: delete it only if the CAS surely did not land.

    After a timeout the record may hold it; deleting it then would cut the stream,
    while keeping an unused ledger only leaks it.
    """
    await ledger.abort()
    if isinstance(error, WriterFencedError | StreamNotFoundError):
        with contextlib.suppress(ScribaError):
            await delete_ledgers(client, (ledger.ledger_id,))


async def _recover_open_segments(
    client: Client, catalog: Catalog, name: str, record: StreamRecord, token: int, password: bytes
) -> StreamRecord:
    for segment in open_segments(record):
        summary = await recover_segment(client, segment, password)
        record = await catalog.update_stream(
            name,
            lambda r, seq=segment.seq: not segment_closed(r, seq),  # type: ignore[misc]
            lambda r, seq=segment.seq, s=summary: close_segment(r, seq, s, catalog.now_ms(), token),  # type: ignore[misc]
        )
        log.info("stream_segment_recovered", stream=f"{catalog.namespace}/{name}", segment=segment.seq,
                 records=summary.record_count)
    if record.deleting:  # a truncation that crashed before deleting its ledgers
        done = await delete_ledgers(client, record.deleting)
        record = await catalog.update_stream(name, lambda r: bool(set(r.deleting) & set(done)),
                                             lambda r: finish_deletes(r, done))
    return record
