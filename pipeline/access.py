"""``Access``: the blocking connection the driver and each Spark task open to Scriba.

A :class:`~scriba.client.sync.SyncClient` runs the asyncio client on a private
loop thread; the stream-layer coroutines (namespaces, catalog reads, writers) run
on that same loop through :meth:`Access.run`. Each task opens its own ``Access``
inside ``read()``/``write()`` and closes it when done: nothing holding a
connection is ever pickled.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from scriba.client import ClientConfig, LedgerReader
from scriba.client.sync import SyncClient
from scriba.entry import Entry
from scriba.errors import PositionOutOfRangeError, PositionTruncatedError
from scriba.log import get_logger
from scriba.meta.records import LEDGERS_PREFIX
from scriba.pipeline.plan import (
    WRITE_BATCH_RECORDS,
    WRITER_LOCK_TIMEOUT_S_DEFAULT,
    ReadTask,
    SegmentSpan,
    split_stream,
)
from scriba.stream import Namespace, Position, Record, WriterOptions, open_namespace
from scriba.stream.ledgers import delete_ledgers, read_entry, records_of
from scriba.stream.record_set import decode_header
from scriba.stream.segments import StreamRecord, check_active
from scriba.tls import TlsConfig

T = TypeVar("T")
log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class StreamView:
    """A stream as the driver saw it: its record and readable segments."""

    namespace: str
    stream: str
    record: StreamRecord
    spans: list[SegmentSpan]

    @property
    def earliest(self) -> Position:
        first = Position(self.spans[0].seq, 0, 0) if self.spans else Position(self.record.next_seq, 0, 0)
        return max(first, self.record.truncated_before)

    @property
    def latest(self) -> Position:
        """Right after the last confirmed record."""
        return self.spans[-1].end if self.spans else Position(self.record.next_seq, 0, 0)

    def resolve(self, text: str, *, fail_on_data_loss: bool = True) -> Position:
        if text == "earliest":
            return self.earliest
        if text == "latest":
            return self.latest
        position = Position.parse(text)
        if position < self.record.truncated_before:
            if fail_on_data_loss:
                raise PositionTruncatedError(
                    f"stream {self.namespace}/{self.stream}: position {position} is before the truncation "
                    f"point {self.record.truncated_before} (failOnDataLoss=false skips ahead)")
            log.warning("pipeline_position_truncated", stream=f"{self.namespace}/{self.stream}",
                        position=str(position), truncated_before=str(self.record.truncated_before))
            return self.record.truncated_before
        if position > self.latest and position.segment_seq >= self.record.next_seq:
            raise PositionOutOfRangeError(
                f"stream {self.namespace}/{self.stream}: position {position} is beyond the end {self.latest}")
        return position


class Access:
    """One blocking connection (driver or task); use as a context manager."""

    def __init__(self, metadata: str, password: bytes = b"", *, call_timeout_s: float = 120.0,
                 lock_timeout_s: float = WRITER_LOCK_TIMEOUT_S_DEFAULT, tls: TlsConfig | None = None) -> None:
        """``tls``: dial the bookies over (mutual) TLS (None: plaintext)."""
        self._password = password
        self._timeout_s = call_timeout_s
        self._lock_timeout_s = lock_timeout_s  # a writer lock held by an earlier task is waited for this long
        self._sync = SyncClient.connect(metadata, call_timeout_s=call_timeout_s, config=ClientConfig(tls=tls))
        self._namespaces: dict[str, Namespace] = {}
        self._ledgers: dict[int, LedgerReader] = {}  # async readers for header reads (driver)

    def run(self, coro: Coroutine[Any, Any, T], *, extra_s: float = 0.0) -> T:
        return self._sync.call(coro, self._timeout_s + extra_s)

    def _locked(self, coro: Coroutine[Any, Any, T]) -> T:
        """A call that first waits for the stream's writer lock."""
        return self.run(coro, extra_s=self._lock_timeout_s)

    @property
    def _writer_options(self) -> WriterOptions:
        return WriterOptions(lock_timeout_s=self._lock_timeout_s)

    def close(self) -> None:
        self._sync.close()

    def __enter__(self) -> Access:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def namespace(self, name: str) -> Namespace:
        if name not in self._namespaces:
            self._namespaces[name] = self.run(open_namespace(self._sync.client, name, password=self._password))
        return self._namespaces[name]

    @property
    def client(self) -> Any:
        """The asyncio client (its coroutines go through :meth:`run`)."""
        return self._sync.client

    def list_streams(self, namespace: str) -> list[str]:
        return sorted(self.run(self.namespace(namespace).list_streams()))

    def ledger_ids(self, namespace: str | None) -> list[int]:
        """The segment ledgers of every stream of ``namespace``; None: every ledger there is."""
        if namespace is None:
            async def scan() -> list[int]:
                return [int(key.rsplit("/", 1)[-1]) async for key, _ in self._sync.client.store.scan(LEDGERS_PREFIX)]
            return sorted(self.run(scan()))
        return sorted(span.ledger_id for s in self.list_streams(namespace)
                      for span in self.view(f"{namespace}/{s}").spans)

    # --- driver: what there is to read ----------------------------------------------------
    def view(self, full_name: str) -> StreamView:
        ns_name, stream = split_stream(full_name)
        ns = self.namespace(ns_name)
        record = self.run(ns.catalog.read_stream(stream)).value
        check_active(record)
        spans = []
        for s in record.segments:
            if s.is_open:
                reader = self._sync.open_ledger(s.ledger_id, self._password, recovery=False)
                spans.append(SegmentSpan(s.seq, s.ledger_id, int(reader.read_last_add_confirmed()), None, True))
            else:
                spans.append(SegmentSpan(s.seq, s.ledger_id, s.summary.last_entry_id, s.summary.record_count, False))
        return StreamView(ns_name, stream, record, spans)

    def ledger_last_entry(self, ledger_id: int) -> int:
        reader = self._sync.open_ledger(ledger_id, self._password, recovery=False)
        return int(reader.read_last_add_confirmed())

    def records_before(self, ledger_id: int, entry_id: int) -> tuple[int, int]:
        """(records before ``entry_id`` in its segment, records in it): one header read."""
        async def header() -> tuple[int, int]:
            reader = self._ledgers.get(ledger_id)
            if reader is None:
                reader = await self._sync.client.open_ledger(ledger_id, self._password, recovery=False)
                self._ledgers[ledger_id] = reader
            h = decode_header((await read_entry(reader, entry_id)).payload)
            return h.records_before, h.count

        return self.run(header())

    def admit(self, view: StreamView, start: Position, end: Position, limit: int) -> Position:
        """The position after at most ``limit`` records from ``start`` (never past ``end``)."""
        left = limit
        for span in view.spans:
            if span.seq < start.segment_seq or span.last_entry < 0 or span.seq > end.segment_seq:
                continue
            first = start.entry_id if span.seq == start.segment_seq else 0
            slot = start.slot if span.seq == start.segment_seq else 0
            if first > span.last_entry:
                continue
            base_before, _ = self.records_before(span.ledger_id, first)
            last_before, last_count = self.records_before(span.ledger_id, span.last_entry)
            base = base_before + slot
            available = last_before + last_count - base
            if available <= left:
                left -= available
                if left == 0:
                    return min(span.end, end)
                continue
            target = base + left  # cumulative index of the first record NOT admitted
            low, high = first, span.last_entry  # the entry holding record `target`
            while low < high:
                mid = (low + high + 1) // 2
                if self.records_before(span.ledger_id, mid)[0] <= target:
                    low = mid
                else:
                    high = mid - 1
            before, _ = self.records_before(span.ledger_id, low)
            return min(Position(span.seq, low, target - before), end)
        return end

    # --- tasks: reading -------------------------------------------------------------------------
    def read_records(self, task: ReadTask) -> Iterator[Record]:
        reader = self._sync.open_ledger(task.ledger_id, self._password, recovery=False)
        seq = task.segment_seq
        for entry in reader.read(task.first_entry, task.last_entry):
            for rec in records_of(seq or 0, entry):
                if task.start is not None and rec.position < task.start:
                    continue
                if task.end is not None and rec.position >= task.end:
                    return
                yield rec

    def read_entries(self, task: ReadTask) -> Iterator[Entry]:
        reader = self._sync.open_ledger(task.ledger_id, self._password, recovery=False)
        yield from reader.read(task.first_entry, task.last_entry)

    # --- tasks: writing -------------------------------------------------------------------------
    def append(
        self, full_name: str, rows: Iterable[tuple[bytes, Mapping[str, bytes] | None]], *, create: bool
    ) -> tuple[int, Position | None, Position | None]:
        """Append every row under the stream's writer lock (held for the whole call);
        returns (count, first position, last position), all confirmed."""
        ns_name, stream = split_stream(full_name)
        ns = self.namespace(ns_name)
        writer = self._locked(ns.open_writer(stream, create=create, options=self._writer_options))
        count, first, last = 0, None, None
        try:
            batch: list[tuple[bytes, Mapping[str, bytes] | None]] = []
            for row in rows:
                batch.append(row)
                if len(batch) >= WRITE_BATCH_RECORDS:
                    count, first, last = self._flush(writer, batch, count, first)
                    batch = []
            if batch:
                count, first, last = self._flush(writer, batch, count, first)
        except BaseException:
            self.run(writer.abort())
            raise
        self.run(writer.close())
        return count, first, last

    def _flush(self, writer: Any, batch: list[Any], count: int, first: Position | None
               ) -> tuple[int, Position | None, Position | None]:
        positions = self.run(writer.append_many(batch))
        return count + len(positions), first or positions[0], positions[-1]

    # --- exactly-once writes: staged ledgers adopted at commit ---------------------------------
    def stage(self, full_name: str, rows: Iterable[tuple[bytes, Mapping[str, bytes] | None]], job: str,
              *, records_per_ledger: int) -> list[int]:
        """Every row written to staged ledgers (``records_per_ledger`` each) tagged ``job``; their ids."""
        ns_name, stream = split_stream(full_name)
        ns = self.namespace(ns_name)
        staged: list[int] = []
        batch: list[tuple[bytes, Mapping[str, bytes]]] = []
        for payload, headers in rows:
            batch.append((payload, headers or {}))
            if len(batch) >= records_per_ledger:
                staged.append(self.run(ns.stage(stream, batch, staged_by=job)))
                batch = []
        if batch:
            staged.append(self.run(ns.stage(stream, batch, staged_by=job)))
        return staged

    def adopt(self, full_name: str, ledger_ids: list[int]) -> None:
        ns_name, stream = split_stream(full_name)
        self._locked(self.namespace(ns_name).adopt(stream, ledger_ids, options=self._writer_options))

    def delete_ledgers(self, ledger_ids: Iterable[int]) -> None:
        self.run(delete_ledgers(self._sync.client, tuple(ledger_ids)))
