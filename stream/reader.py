"""``StreamReader``: records of a stream in order, across segments, then tailing.

A producer task walks the segment list (kept current by a watch on the stream
record) and feeds decoded records, one entry's worth per chunk, into a bounded
queue (the read-ahead: while the consumer works, the next range reads are already
under way, bounded by ``read_ahead_entries``):

- a CLOSED segment is read from the reader's position to its last entry with range
  reads (``LedgerReader.read``);
- the OPEN segment is tailed (``LedgerReader.tail``: confirmed entries only, by
  long poll) until the stream record shows it CLOSED or its ledger is closed; then
  the rest up to the recorded last entry is read. A writer fail-over closes the
  segment at what recovery kept, so a reader sees exactly those records.

A start position ``p`` yields the records with positions ``>= p``. Positions below
the stream's truncation point raise ``PositionTruncatedError``; a deleted stream
``StreamNotFoundError``. Errors reach the consumer in order, after the records
read before them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import deque
from dataclasses import dataclass
from typing import Any, Final

from scriba.client import Client, LedgerReader
from scriba.client.reader import POLL_REPLICAS, POLL_REPLICAS_CHOICES
from scriba.config import require
from scriba.errors import (
    NoSuchLedgerError,
    PositionTruncatedError,
    ScribaError,
    StreamNotFoundError,
)
from scriba.log import get_logger
from scriba.meta.store import EventKind
from scriba.stream.catalog import Catalog
from scriba.stream.ledgers import Record, records_of
from scriba.stream.position import Position
from scriba.stream.segments import Segment, StreamRecord, StreamState, stream_key

log = get_logger(__name__)

_END: Final = object()


@dataclass(frozen=True, slots=True)
class ReaderOptions:
    read_ahead_entries: int = 1024  # entries decoded ahead of the consumer
    range_entries_max: int = 512  # entries per range read of a closed segment
    # replicas each tail long poll waits at (``LedgerReader.tail``): 2 takes the first
    # bookie to learn the LAC (lower tail p99), 1 halves the poll answers per entry
    tail_poll_replicas: int = POLL_REPLICAS
    # a pause after each tail poll's answer, so entries confirmed meanwhile come in one
    # answer (``LedgerReader.tail``): 0 delivers each entry a round trip after it is confirmed;
    # none while the reader's ``hurry`` is set
    tail_poll_pause_s: float = 0.0

    def validate(self) -> ReaderOptions:
        require(self.read_ahead_entries >= 1, "read_ahead_entries", "must be >= 1")
        require(self.range_entries_max >= 1, "range_entries_max", "must be >= 1")
        require(self.tail_poll_replicas in POLL_REPLICAS_CHOICES, "tail_poll_replicas",
                f"one of {POLL_REPLICAS_CHOICES}")
        require(0.0 <= self.tail_poll_pause_s <= 1.0, "tail_poll_pause_s", "must be in [0, 1] s")
        return self


class StreamReader:
    """An async iterator of :class:`~scriba.stream.ledgers.Record` (from ``Namespace.open_reader``)."""

    def __init__(
        self, client: Client, catalog: Catalog, name: str, record: StreamRecord, start: Position,
        password: bytes, options: ReaderOptions,
    ) -> None:
        self._client = client
        self._catalog = catalog
        self.name = name
        self._record = record
        self._password = password
        self._options = options.validate()
        self._position = start  # where the producer continues
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=max(1, options.read_ahead_entries))
        self._chunk: deque[Record] = deque()
        self._held: Any = None  # an error (or the end) taken from the queue by read_batch, not yet raised
        self._changed = asyncio.Event()
        # set while someone waits for the next records (an RSM follower's read): the tail
        # does not pause (``ReaderOptions.tail_poll_pause_s``) while it is set
        self.hurry = asyncio.Event()
        self._done = False
        self._watch_task = asyncio.get_running_loop().create_task(self._watch())
        self._task = asyncio.get_running_loop().create_task(self._produce())
        self._log = log.bind(stream=f"{catalog.namespace}/{name}")

    @property
    def position(self) -> Position:
        """Where the next record read ahead will come from (ahead of what was consumed)."""
        return self._position

    def __aiter__(self) -> StreamReader:
        return self

    async def __anext__(self) -> Record:
        while not self._chunk:
            if self._done:
                raise StopAsyncIteration
            item, self._held = (self._held, None) if self._held is not None else (await self._queue.get(), None)
            if isinstance(item, BaseException):
                self._done = True
                raise item
            if item is _END:
                self._done = True
                raise StopAsyncIteration
            self._chunk.extend(item)
        return self._chunk.popleft()

    async def read_next(self, timeout_s: float | None = None) -> Record | None:
        """The next record, or ``None`` if none arrives within ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                return await self.__anext__()
        except TimeoutError:
            return None

    async def read_batch(self, records_max: int, timeout_s: float | None = None) -> list[Record]:
        """Up to ``records_max`` records: waits (at most ``timeout_s``) for the first, then
        takes only what is already read ahead. An error comes with the next call, after
        the records before it."""
        first = await self.read_next(timeout_s)
        if first is None:
            return []
        batch = [first]
        chunk = self._chunk
        while len(batch) < records_max:
            if not chunk:
                if self._held is not None or self._queue.empty():
                    break
                item = self._queue.get_nowait()
                if isinstance(item, BaseException) or item is _END:
                    self._held = item
                    break
                chunk.extend(item)
            batch.append(chunk.popleft())
        return batch

    async def close(self) -> None:
        await _stop(self._task, self._watch_task)
        self._done = True

    async def __aenter__(self) -> StreamReader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- stream record ----------------------------------------------------------------
    async def _watch(self) -> None:
        key = stream_key(self._catalog.namespace, self.name)
        store = self._catalog.store
        async with contextlib.aclosing(store.watch(key)) as events:
            async for event in events:
                if event.kind is EventKind.PUT and event.value is not None:
                    self._record = StreamRecord.from_bytes(event.value)
                elif event.kind is EventKind.DELETE:
                    self._record = _deleted(self._record)
                self._changed.set()

    async def _wait_change(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    def _check(self, position: Position) -> StreamRecord:
        record = self._record
        if record.state is not StreamState.ACTIVE:
            raise StreamNotFoundError(f"stream {self._catalog.namespace}/{self.name} was deleted")
        if position < record.truncated_before:
            raise PositionTruncatedError(
                f"stream {self.name}: position {position} is before the truncation point {record.truncated_before}"
            )
        return record

    # --- producing ----------------------------------------------------------------------
    async def _produce(self) -> None:
        try:
            while True:
                record = self._check(self._position)
                segment = next((s for s in record.segments if s.seq >= self._position.segment_seq), None)
                if segment is None:
                    await self._wait_change()
                    continue
                if segment.seq > self._position.segment_seq:
                    self._position = segment.start
                if segment.is_open:
                    await self._tail(segment)
                else:
                    await self._read_closed(segment)
                self._position = max(self._position, segment.end)
        except asyncio.CancelledError:
            raise
        except ScribaError as exc:
            await self._queue.put(exc)
        except Exception as exc:  # a bug: surface it to the consumer rather than hang
            self._log.exception("stream_reader_failed")
            await self._queue.put(exc)

    async def _open(self, segment: Segment) -> LedgerReader:
        try:
            return await self._client.open_ledger(segment.ledger_id, self._password, recovery=False)
        except NoSuchLedgerError:
            await self._explain_missing()
            raise

    async def _explain_missing(self) -> None:
        """A segment's ledger vanished: truncated or deleted meanwhile? Ask the store, say so."""
        record = (await self._catalog.read_stream(self.name)).value  # StreamNotFoundError if gone
        if record.state is StreamState.ACTIVE and self._record.state is not StreamState.ACTIVE:
            return
        self._record = record
        self._check(self._position)

    async def _emit_range(self, reader: LedgerReader, segment: Segment, last: int) -> None:
        """Entries from the reader's position to ``last`` (inclusive), as records."""
        step = self._options.range_entries_max
        while self._position.segment_seq == segment.seq and self._position.entry_id <= last:
            first = self._position.entry_id
            upto = min(last, first + step - 1)
            try:
                async for entry in reader.read(first, upto):
                    await self._deliver(segment, entry)
            except NoSuchLedgerError:
                await self._explain_missing()
                raise

    async def _deliver(self, segment: Segment, entry: Any) -> None:
        """One entry's records to the queue, then advance (a cancelled put re-reads the entry)."""
        records = records_of(segment.seq, entry, self._position.slot)
        if records:
            queue = self._queue
            if queue.full():
                await queue.put(records)
            else:
                queue.put_nowait(records)  # (no coroutine per entry while the consumer keeps up)
        self._position = Position(segment.seq, int(entry.entry_id) + 1, 0)

    async def _read_closed(self, segment: Segment) -> None:
        last = segment.summary.last_entry_id
        if self._position.entry_id > last:
            return
        reader = await self._open(segment)
        await self._emit_range(reader, segment, last)

    async def _tail(self, segment: Segment) -> None:
        reader = await self._open(segment)
        seq = segment.seq
        while True:
            tailer = asyncio.get_running_loop().create_task(self._tail_entries(reader, segment))
            closed = asyncio.get_running_loop().create_task(self._until_closed(seq))
            try:
                done, _ = await asyncio.wait({tailer, closed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                await _stop(tailer, closed)
            if tailer in done and tailer.exception() is None and reader.is_closed:
                return  # the ledger is closed and everything in it was read
            if tailer in done and tailer.exception() is not None:
                if isinstance(tailer.exception(), NoSuchLedgerError):
                    await self._explain_missing()
                raise tailer.exception()  # type: ignore[misc]
            current = self._record.segment(seq)
            if current is None:
                self._check(self._position)
                return
            if not current.is_open:
                await reader.refresh()
                await self._emit_range(reader, current, current.summary.last_entry_id)
                return

    async def _tail_entries(self, reader: LedgerReader, segment: Segment) -> None:
        # aclosing: a tail stopped while delivering ends its long polls now, not when collected
        tail = reader.tail(self._position.entry_id, poll_replicas=self._options.tail_poll_replicas,
                           poll_pause_s=self._options.tail_poll_pause_s, hurry=self.hurry)
        async with contextlib.aclosing(tail) as entries:
            async for entry in entries:
                await self._deliver(segment, entry)

    async def _until_closed(self, seq: int) -> None:
        while True:
            record = self._record
            current = record.segment(seq)
            if current is None or not current.is_open or record.state is not StreamState.ACTIVE:
                return
            await self._wait_change()


async def _stop(*tasks: asyncio.Task[Any]) -> None:
    """Cancel ``tasks`` and wait until they are done, without swallowing a cancellation of
    the caller (awaiting each under ``suppress(CancelledError)`` would: a reader being
    closed would then read on). Their errors are marked seen; the caller asks for them."""
    for task in tasks:
        task.cancel()
        task.add_done_callback(_seen)
    await asyncio.wait(tasks)


def _seen(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _deleted(record: StreamRecord) -> StreamRecord:
    return dataclasses.replace(record, state=StreamState.DELETING)
