"""The ``scriba`` PySpark data source: batch and streaming reads, batch writes.

Everything Spark pickles (the source, readers, partitions) holds only options and
plain values; connections are opened inside ``read()``/``write()`` on the executor
(:class:`~scriba.pipeline.access.Access`) and closed when the task ends.

Write guarantee (``mode("append")``), by ``option("delivery", ...)``:

- ``exactly-once``: each task writes its partition to staged ledgers of its own (closed
  ledgers in segment format, outside the stream, tagged with the job's id) and returns
  their ids; the driver's ``commit`` adopts every successful task's ledgers, in
  partition order, as segments of the stream in ONE compare-and-set
  (``Namespace.adopt``: writer lock, fence, recover, CAS) and then deletes every other
  ledger the job staged (failed, retried or speculative attempts). A repeated commit
  adopts nothing twice; ``abort`` deletes every ledger of the job: nothing of an
  aborted job is ever visible. Readers see the job's records all at once, after the
  stream's earlier records. Left: a driver that dies between staging and commit leaves
  staged ledgers no stream names (tagged ``staged=<job>``); nothing deletes them yet.
- ``at-least-once`` (the default): each task takes the stream's writer lock for
  its whole partition and appends its rows in order, as one contiguous run of
  records in a fresh segment, and returns only once every record is confirmed by an
  ack quorum. If a task dies after some of its records were confirmed, those stay in
  the stream and Spark's retry appends the partition again (duplicates of that
  prefix); ``abort`` cannot remove them. Tasks of one job write one after another
  (they queue on the lock). tests/pipeline/test_kill.py kills a task's Python worker
  mid-write and checks exactly this.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (  # Spark >= 4.2
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from scriba.errors import ConfigError
from scriba.pipeline.access import Access, StreamView, open_access
from scriba.pipeline.plan import (
    SCHEMA_DDL,
    ReadTask,
    SourceOptions,
    decode_offset,
    encode_offset,
    parse_options,
    plan_ledger,
    plan_stream,
    starting_positions,
)
from scriba.stream import Position

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


class ScribaPartition(InputPartition):
    def __init__(self, task: ReadTask) -> None:
        super().__init__(task)
        self.task = task


def _rows(task: ReadTask) -> Iterator[tuple[Any, ...]]:
    with open_access(task) as access:
        if task.stream is None:
            for entry in access.read_entries(task):
                yield (None, None, None, task.ledger_id, int(entry.entry_id), 0, None, bytes(entry.payload),
                       {}, None, None)
            return
        for rec in access.read_records(task):
            p = rec.position
            yield (task.namespace, task.stream, p.segment_seq, task.ledger_id, p.entry_id, p.slot, str(p),
                   rec.payload, dict(rec.headers),
                   _EPOCH + datetime.timedelta(milliseconds=rec.publish_time_ms), None)


def _streams(access: Access, opts: SourceOptions) -> list[str]:
    if opts.namespace is not None:
        return [f"{opts.namespace}/{s}" for s in access.list_streams(opts.namespace)]
    return list(opts.streams)


class ScribaDataSource(DataSource):
    """``spark.read.format("scriba")``; see the package docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return "scriba"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return ScribaBatchReader(parse_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = parse_options(self.options)
        if opts.ledgers:
            raise ConfigError("a streaming read needs option('stream') or option('namespace'), not ledgers")
        return ScribaStreamReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ConfigError("a scriba stream is append-only: use mode('append')")
        if "payload" not in schema.fieldNames():
            raise ConfigError(f"writing to scriba needs a 'payload' column (binary or string); got {schema.fieldNames()}")
        opts = {k.lower(): v for k, v in self.options.items()}
        stream = opts.get("stream", "").strip()
        if not stream or "," in stream:
            raise ConfigError("writing to scriba needs option('stream', 'ns/stream') (one stream)")
        delivery = opts.get("delivery", "at-least-once").strip().lower()
        if delivery not in ("at-least-once", "exactly-once"):
            raise ConfigError(f"option delivery={delivery!r}: expected at-least-once or exactly-once")
        return ScribaWriter(parse_options(self.options), stream, "headers" in schema.fieldNames(),
                            delivery == "exactly-once", uuid.uuid4().hex)


class ScribaBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        tasks: list[ReadTask] = []
        with open_access(opts) as access:
            for ledger_id in opts.ledgers:
                tasks += plan_ledger(opts, ledger_id, access.ledger_last_entry(ledger_id),
                                     opts.max_records_per_partition)
            for full in _streams(access, opts):
                view = access.view(full)
                start = view.resolve(opts.starting, fail_on_data_loss=opts.fail_on_data_loss)
                end = view.resolve(opts.ending)
                tasks += plan_stream(opts, view.namespace, view.stream, view.spans, start, end)
        return [ScribaPartition(t) for t in tasks]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        yield from _rows(partition.task)  # type: ignore[attr-defined]


class ScribaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are per-stream positions; a micro-batch reads ``[start, end)`` of each stream."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._target: dict[str, Position] | None = None  # Trigger.AvailableNow's end
        self._last: dict[str, Position] | None = None  # if latestOffset() comes without a start
        self._access: Access | None = None

    def _conn(self) -> Access:  # the driver's connection, opened lazily (never pickled)
        if self._access is None:
            self._access = open_access(self.opts)
        return self._access

    def _views(self) -> dict[str, StreamView]:
        access = self._conn()
        return {full: access.view(full) for full in _streams(access, self.opts)}

    def initialOffset(self) -> dict[str, str]:
        views = self._views()
        starts = starting_positions(self.opts.starting, list(views))
        return encode_offset({s: v.resolve(starts[s], fail_on_data_loss=self.opts.fail_on_data_loss)
                              for s, v in views.items()})

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_trigger is not None:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {s: v.latest for s, v in self._views().items()}

    def latestOffset(self, start: dict[str, str] | None = None, limit: Any = None) -> dict[str, str]:
        views = self._views()
        begin = decode_offset(start) if start is not None else (self._last or decode_offset(self.initialOffset()))
        max_rows = self.opts.max_records_per_trigger
        if limit is not None:
            max_rows = getattr(limit, "max_rows", None)
        ends: dict[str, Position] = {}
        for s, view in views.items():
            end = view.latest if self._target is None else self._target.get(s, view.earliest)
            first = begin.get(s, view.earliest)
            end = max(end, first)
            if max_rows is not None:
                end = self._conn().admit(view, first, end, max_rows)  # the limit is per stream
            ends[s] = end
        self._last = ends
        return encode_offset(ends)

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[InputPartition]:
        begin, finish = decode_offset(start), decode_offset(end)
        tasks: list[ReadTask] = []
        for s, view in self._views().items():
            lo = begin.get(s, view.earliest)
            if lo < view.record.truncated_before:
                lo = view.resolve(str(lo), fail_on_data_loss=self.opts.fail_on_data_loss)
            hi = finish.get(s, lo)
            if hi > lo:
                tasks += plan_stream(self.opts, view.namespace, view.stream, view.spans, lo, hi)
        return [ScribaPartition(t) for t in tasks]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        yield from _rows(partition.task)  # type: ignore[attr-defined]

    def commit(self, end: dict[str, str]) -> None:
        """Nothing to release: positions stay readable until retention truncates them."""

    def stop(self) -> None:
        if self._access is not None:
            self._access.close()
            self._access = None


@dataclass(frozen=True)
class ScribaCommit(WriterCommitMessage):
    count: int
    first: str | None
    last: str | None
    staged: tuple[int, ...] = ()  # exactly-once: the task's staged ledgers, in order


class ScribaWriter(DataSourceWriter):
    def __init__(self, opts: SourceOptions, stream: str, with_headers: bool, exactly_once: bool = False,
                 job: str = "") -> None:
        self.opts = opts
        self.stream = stream
        self.with_headers = with_headers
        self.exactly_once = exactly_once
        self.job = job  # made on the driver, pickled to every task: tags the staged ledgers

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        def rows() -> Iterator[tuple[bytes, dict[str, bytes] | None]]:
            for row in iterator:
                payload = row["payload"]
                if payload is None:
                    raise ConfigError("payload is null: every row written to scriba needs a payload")
                if isinstance(payload, str):
                    payload = payload.encode()
                headers = row["headers"] if self.with_headers else None
                yield bytes(payload), ({k: bytes(v) for k, v in headers.items()} if headers else None)

        opts = self.opts
        with open_access(opts) as access:
            if self.exactly_once:
                counted = _Counted(rows())
                staged = access.stage(self.stream, counted, self.job,
                                      records_per_ledger=opts.max_records_per_partition)
                return ScribaCommit(counted.count, None, None, tuple(staged))
            count, first, last = access.append(self.stream, rows(), create=opts.create_stream)
        return ScribaCommit(count, str(first) if first else None, str(last) if last else None)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """At-least-once: every record was confirmed when its task returned. Exactly-once:
        the successful tasks' staged ledgers adopted in one CAS, the job's others deleted."""
        if not self.exactly_once:
            return
        adopted = [i for m in messages if isinstance(m, ScribaCommit) for i in m.staged]
        opts = self.opts
        with open_access(opts) as access:
            access.adopt(self.stream, adopted)
            access.delete_ledgers(set(access.staged_ledgers(self.job)) - set(adopted))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Exactly-once: every ledger the job staged is deleted (nothing was adopted).
        At-least-once: confirmed records cannot be withdrawn (see the module docstring)."""
        if not self.exactly_once:
            return
        opts = self.opts
        with open_access(opts) as access:
            access.delete_ledgers(access.staged_ledgers(self.job))


class _Counted:
    """Rows passed through, counted."""

    def __init__(self, rows: Iterator[tuple[bytes, dict[str, bytes] | None]]) -> None:
        self._rows = rows
        self.count = 0

    def __iter__(self) -> Iterator[tuple[bytes, dict[str, bytes] | None]]:
        for row in self._rows:
            self.count += 1
            yield row
