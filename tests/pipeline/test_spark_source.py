"""The ``scriba`` data source on a real (unmodified) local[2] Spark, 3 real bookie
processes and real etcd: batch read equals the client's read, append write reads
back, streaming reads resume from their checkpoint exactly once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from _pipeline_support import Rec, _append, _ns, _read, _records

from scriba.client import Client
from scriba.errors import PositionTruncatedError
from scriba.stream import Position, open_namespace

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

def _rows(df: Any) -> list[Rec]:
    return sorted(((r.position, bytes(r.payload), {k: bytes(v) for k, v in (r.headers or {}).items()})
                   for r in df.collect()), key=lambda t: Position.parse(t[0]))


def test_batch_read_equals_client_read(spark: Any, uri: str) -> None:
    ns = _ns()
    asyncio.run(_append(uri, ns, "s", _records(500)))
    expected = asyncio.run(_read(uri, ns, "s"))
    assert len(expected) == 500 and len({p for p, _, _ in expected}) == 500
    base = spark.read.format("scriba").option("metadata", uri).option("stream", f"{ns}/s")
    one = base.option("maxRecordsPerPartition", "100000").load()
    segments = {Position.parse(p).segment_seq for p, _, _ in expected}
    assert len(segments) >= 3 and one.rdd.getNumPartitions() == len(segments)  # one task per segment
    assert _rows(one) == expected
    many = base.option("maxRecordsPerPartition", "40").load()
    assert many.rdd.getNumPartitions() > 10
    assert _rows(many) == expected
    # the other columns
    row = many.where("position = '1:0:0'").collect()
    assert len(row) == 1 and row[0].namespace == ns and row[0].stream == "s" and row[0].segment == 1
    assert row[0].origin is None and row[0].publish_time is not None and row[0].slot == 0
    # projection and position bounds (end exclusive, mid-entry slots honoured)
    lo, hi = expected[130][0], expected[333][0]
    bounded = base.option("maxRecordsPerPartition", "40").option("startingPosition", lo) \
        .option("endingPosition", hi).load()
    assert [r.position for r in bounded.select("position").collect()] == [p for p, _, _ in expected[130:333]]
    # the whole namespace
    asyncio.run(_append(uri, ns, "t", _records(7, "t")))
    whole = spark.read.format("scriba").option("metadata", uri).option("namespace", ns).load()
    assert sorted(r.stream for r in whole.select("stream").distinct().collect()) == ["s", "t"]
    assert whole.count() == 507


def test_read_errors_are_clear(spark: Any, uri: str) -> None:
    ns = _ns()
    asyncio.run(_append(uri, ns, "s", _records(300), segment_records_max=100))

    async def truncate() -> None:
        async with Client.connect(uri) as client:
            await (await open_namespace(client, ns)).truncate("s", before=Position(2, 0, 0))

    asyncio.run(truncate())
    base = spark.read.format("scriba").option("metadata", uri).option("stream", f"{ns}/s") \
        .option("startingPosition", "0:0:0")
    with pytest.raises(Exception, match=PositionTruncatedError.__name__):
        base.load().count()
    skipped = base.option("failOnDataLoss", "false").load()
    assert skipped.count() == len(asyncio.run(_read(uri, ns, "s"))) > 0
    with pytest.raises(Exception, match="metadata"):
        spark.read.format("scriba").option("stream", f"{ns}/s").load().count()


def test_write_then_read_back(spark: Any, uri: str) -> None:
    ns = _ns()
    asyncio.run(_append(uri, ns, "out", []))  # namespace and stream exist
    rows = [(f"w{i}".encode(), {"k": str(i).encode()}) for i in range(300)]
    df = spark.createDataFrame(rows, "payload BINARY, headers MAP<STRING, BINARY>").repartition(3)
    df.write.format("scriba").option("metadata", uri).option("stream", f"{ns}/out").mode("append").save()
    back = asyncio.run(_read(uri, ns, "out"))
    assert sorted((p, h) for _, p, h in back) == sorted(rows)
    # each task's records form one contiguous run (it holds the writer lock throughout)
    payload_only = spark.createDataFrame([(f"x{i}",) for i in range(10)], "payload STRING").coalesce(1)
    payload_only.write.format("scriba").option("metadata", uri).option("stream", f"{ns}/out") \
        .mode("append").save()
    tail = asyncio.run(_read(uri, ns, "out"))[300:]
    assert [p for _, p, _ in tail] == [f"x{i}".encode() for i in range(10)]
    with pytest.raises(Exception, match="payload"):
        spark.createDataFrame([(1,)], "x INT").write.format("scriba").option("metadata", uri) \
            .option("stream", f"{ns}/out").mode("append").save()
    with pytest.raises(Exception, match="does not exist"):
        payload_only.write.format("scriba").option("metadata", uri).option("stream", f"{ns}/missing") \
            .mode("append").save()


def _run_available_now(spark: Any, uri: str, stream: str, checkpoint: Path, sink: Path,
                       max_per_trigger: int | None = None) -> None:
    reader = spark.readStream.format("scriba").option("metadata", uri).option("stream", stream)
    if max_per_trigger is not None:
        reader = reader.option("maxRecordsPerTrigger", str(max_per_trigger))

    def write_batch(batch_df: Any, batch_id: int) -> None:  # idempotent: one file per batch id
        rows = [f"{r.position}\t{bytes(r.payload).decode()}" for r in batch_df.collect()]
        (sink / f"batch-{batch_id:06d}.txt").write_text("\n".join(rows))

    query = (reader.load().writeStream.foreachBatch(write_batch)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert not query.isActive and query.exception() is None


def _sink(sink: Path) -> tuple[list[tuple[str, str]], list[int]]:
    rows: list[tuple[str, str]] = []
    sizes = []
    for f in sorted(sink.glob("batch-*.txt")):
        lines = [tuple(line.split("\t")) for line in f.read_text().splitlines() if line]
        sizes.append(len(lines))
        rows += lines  # type: ignore[arg-type]
    return rows, sizes


def test_streaming_resumes_from_checkpoint_exactly_once(spark: Any, uri: str, tmp_path: Path) -> None:
    ns = _ns()
    stream = f"{ns}/s"
    asyncio.run(_append(uri, ns, "s", _records(250)))
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    sink.mkdir()
    _run_available_now(spark, uri, stream, checkpoint, sink, max_per_trigger=60)
    rows, sizes = _sink(sink)
    assert len(sizes) >= 5 and max(sizes) <= 60  # admission control
    assert [p for _, p in rows] == [f"r{i}" for i in range(250)]
    # more records; the restarted query delivers only those, once
    asyncio.run(_append(uri, ns, "s", _records(90, "m")))
    _run_available_now(spark, uri, stream, checkpoint, sink, max_per_trigger=60)
    rows, _ = _sink(sink)
    expected = asyncio.run(_read(uri, ns, "s"))
    assert [(p, q) for p, q in rows] == [(p, q.decode()) for p, q, _ in expected]
    assert len(rows) == 340
    # a rerun with nothing new adds no rows
    _run_available_now(spark, uri, stream, checkpoint, sink, max_per_trigger=60)
    assert len(_sink(sink)[0]) == 340
