"""The ``scriba`` PySpark data source: batch and streaming reads and writes.

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
  stream's earlier records. The job is recorded before its tasks run (a staging record
  in the metadata store, :mod:`scriba.pipeline.staging`); ``commit`` passes its commit
  point by one CAS on that record before it adopts. A driver that dies before that
  point leaves staged ledgers that the next exactly-once job on the stream (or
  ``scriba pipeline gc-staged``) deletes once the record is older than
  ``stagingGraceS`` (default one day); after it, they are adopted (rolled forward). A
  commit that loses the race to the collector fails and adopts nothing.
  Streaming (``writeStream.format("scriba")``): the same per micro-batch, idempotent per
  batch id (:class:`ScribaStreamWriter`): a batch Spark replays after a restart adds
  nothing if it was committed. The sink is named by ``option("sinkId")`` or, by
  default, the query's ``checkpointLocation``.
- ``at-least-once`` (the default): each task takes the stream's writer lock for
  its whole partition and appends its rows in order, as one contiguous run of
  records in a fresh segment, and returns only once every record is confirmed by an
  ack quorum. If a task dies after some of its records were confirmed, those stay in
  the stream and Spark's retry appends the partition again (duplicates of that
  prefix); ``abort`` cannot remove them. Tasks of one job write one after another
  (they queue on the lock, ``writerLockTimeoutS``, default an hour, each).
  tests/pipeline/test_kill.py kills a task's Python worker
  mid-write and checks exactly this.
"""

from __future__ import annotations

import datetime
import hashlib
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
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

from scriba.errors import ConfigError, ScribaError
from scriba.log import get_logger
from scriba.pipeline.access import Access, StreamView
from scriba.pipeline.commit import (
    abort_batch,
    abort_job,
    collect_staged,
    commit_batch,
    commit_job,
    start_job,
)
from scriba.pipeline.plan import (
    SCHEMA_DDL,
    ReadTask,
    SourceOptions,
    decode_offset,
    encode_offset,
    parse_options,
    plan_ledger,
    plan_stream,
    split_stream,
    starting_positions,
)
from scriba.stream import Position

log = get_logger(__name__)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


class ScribaPartition(InputPartition):
    def __init__(self, task: ReadTask) -> None:
        super().__init__(task)
        self.task = task


def _rows(task: ReadTask) -> Iterator[tuple[Any, ...]]:
    with Access(task.metadata, task.password, call_timeout_s=task.call_timeout_s, tls=task.tls) as access:
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
        writer = self._writer(schema, overwrite)
        if writer.exactly_once:
            writer.start()
        return writer

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """``writeStream.format("scriba")``; exactly-once needs a stable sink id: option
        ``sinkId``, or the query's ``checkpointLocation`` (the same on every restart)."""
        writer = self._writer(schema, overwrite)
        opts = {k.lower(): v for k, v in self.options.items()}
        sink = opts.get("sinkid", "").strip()
        if not sink and opts.get("checkpointlocation", "").strip():
            sink = "cp" + hashlib.sha256(opts["checkpointlocation"].strip().encode()).hexdigest()[:24]
        if writer.exactly_once and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", sink):
            raise ConfigError("an exactly-once streaming write needs option('checkpointLocation') or "
                              f"option('sinkId', [A-Za-z0-9_.-]+): the same on every restart of the query; got {sink!r}")
        return ScribaStreamWriter(writer, sink)

    def _writer(self, schema: StructType, overwrite: bool) -> ScribaWriter:
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
        with Access(opts.metadata, opts.password, call_timeout_s=opts.call_timeout_s, tls=opts.tls) as access:
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
            self._access = Access(self.opts.metadata, self.opts.password, call_timeout_s=self.opts.call_timeout_s,
                                  tls=self.opts.tls)
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
    job: str = ""  # exactly-once: the job they are staged under


class ScribaWriter(DataSourceWriter):
    def __init__(self, opts: SourceOptions, stream: str, with_headers: bool, exactly_once: bool = False,
                 job: str = "") -> None:
        self.opts = opts
        self.stream = stream
        self.with_headers = with_headers
        self.exactly_once = exactly_once
        self.job = job  # made on the driver, pickled to every task: tags the staged ledgers

    def _access(self) -> Access:
        return Access(self.opts.metadata, self.opts.password, call_timeout_s=self.opts.call_timeout_s,
                      lock_timeout_s=self.opts.writer_lock_timeout_s, tls=self.opts.tls)

    def start(self) -> None:
        """Exactly-once, on the driver before any task: collect the stream's orphaned staging
        sets (older than ``stagingGraceS``), then record this job's."""
        split_stream(self.stream)
        with self._access() as access:
            try:
                collect_staged(access, stream=self.stream, grace_s=self.opts.staging_grace_s)
            except ScribaError as exc:  # someone else's leftovers must not stop this job
                log.warning("pipeline_staged_gc_failed", stream=self.stream, error=repr(exc))
            start_job(access, self.stream, self.job)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return self.write_as(iterator, self.job)

    def write_as(self, iterator: Iterator[Any], job: str, *, record_job: bool = False) -> ScribaCommit:
        """One task's rows; exactly-once: staged under ``job`` (``record_job``: the task
        records the job itself, as a streaming sink's tasks do)."""
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
        with self._access() as access:
            if self.exactly_once:
                if record_job:
                    start_job(access, self.stream, job)
                counted = _Counted(rows())
                staged = access.stage(self.stream, counted, job, records_per_ledger=opts.max_records_per_partition)
                return ScribaCommit(counted.count, None, None, tuple(staged), job)
            count, first, last = access.append(self.stream, rows(), create=opts.create_stream)
        return ScribaCommit(count, str(first) if first else None, str(last) if last else None)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """At-least-once: every record was confirmed when its task returned. Exactly-once:
        the successful tasks' staged ledgers adopted in one CAS, the job's others deleted."""
        if not self.exactly_once:
            return
        adopted = [i for m in messages if isinstance(m, ScribaCommit) for i in m.staged]
        with self._access() as access:
            commit_job(access, self.stream, self.job, adopted)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Exactly-once: every ledger the job staged is deleted (nothing was adopted).
        At-least-once: confirmed records cannot be withdrawn (see the module docstring)."""
        if not self.exactly_once:
            return
        with self._access() as access:
            abort_job(access, self.stream, self.job)


class ScribaStreamWriter(DataSourceStreamWriter):
    """``writeStream.format("scriba")``: each micro-batch's tasks write as the batch writer's
    do. Exactly-once: each task stages under a job of its own and the batch's ``commit``
    adopts them all in one commit point, idempotent per batch id
    (:func:`~scriba.pipeline.commit.commit_batch`): a batch Spark replays after a
    restart is discarded if it was committed."""

    def __init__(self, writer: ScribaWriter, sink: str) -> None:
        self.writer = writer
        self.sink = sink

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return self.writer.write_as(iterator, uuid.uuid4().hex, record_job=True)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        w = self.writer
        if not w.exactly_once:
            return
        parts = [(m.job, list(m.staged)) for m in messages if isinstance(m, ScribaCommit)]
        with w._access() as access:
            commit_batch(access, w.stream, self.sink, batchId, parts)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        w = self.writer
        if not w.exactly_once:
            return
        with w._access() as access:
            abort_batch(access, w.stream, self.sink, batchId, [m.job for m in messages if isinstance(m, ScribaCommit)])


class _Counted:
    """Rows passed through, counted."""

    def __init__(self, rows: Iterator[tuple[bytes, dict[str, bytes] | None]]) -> None:
        self._rows = rows
        self.count = 0

    def __iter__(self) -> Iterator[tuple[bytes, dict[str, bytes] | None]]:
        for row in self._rows:
            self.count += 1
            yield row
