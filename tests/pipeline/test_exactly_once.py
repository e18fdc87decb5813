"""Exactly-once batch writes (``option("delivery", "exactly-once")``) on real bookies and
etcd: a task killed mid-write leaves nothing visible and the re-run writes every row once;
a retried (or speculative) attempt's staged ledgers are never adopted and are deleted; a
duplicate commit adopts nothing twice; an aborted job leaves nothing visible and no staged
ledger. Each is checked with the acked-set checker (nothing lost, nothing unexpected,
nothing twice) and the order of the rows."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from _pipeline_support import _append, _exactly_once, _ns, _read, _staged_outside, dying_frame

from scriba.pipeline.source import ScribaCommit, ScribaDataSource

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]




def test_task_killed_mid_write_then_rerun_is_exactly_once(spark: Any, uri: str, tmp_path: Path) -> None:
    ns = _ns()
    asyncio.run(_append(uri, ns, "out", []))
    marker = tmp_path / "died"
    total = 3000
    df = dying_frame(spark, total, marker)
    writer = (df.write.format("scriba").option("metadata", uri).option("stream", f"{ns}/out")
              .option("delivery", "exactly-once").option("maxRecordsPerPartition", "700").mode("append"))
    with pytest.raises(Exception):  # noqa: B017 - local mode does not retry a task: the job fails
        writer.save()
    assert marker.exists()
    assert asyncio.run(_read(uri, ns, "out")) == []  # nothing of the failed job is visible
    assert asyncio.run(_staged_outside(uri, ns, "out")) == []  # abort deleted what it staged
    writer.save()  # the re-run (Spark's retry on a cluster)
    _exactly_once([b"k%d" % i for i in range(total)], [p for _, p, _ in asyncio.run(_read(uri, ns, "out"))])
    assert asyncio.run(_staged_outside(uri, ns, "out")) == []


def test_retried_attempt_duplicate_commit_and_abort(uri: str) -> None:
    from pyspark.sql.types import BinaryType, StructField, StructType

    ns = _ns()
    asyncio.run(_append(uri, ns, "out", [(b"before", {})]))
    schema = StructType([StructField("payload", BinaryType())])
    source = ScribaDataSource({"metadata": uri, "stream": f"{ns}/out", "delivery": "exactly-once",
                               "maxRecordsPerPartition": "40"})
    rows = [{"payload": b"r%d" % i} for i in range(100)]
    job = source.writer(schema, False)
    first = job.write(iter(rows[:50]))  # partition 0, attempt 1: "lost" (a retried or speculative attempt)
    again = job.write(iter(rows[:50]))  # partition 0, attempt 2: the one Spark commits
    other = job.write(iter(rows[50:]))  # partition 1
    assert isinstance(first, ScribaCommit) and len(first.staged) == 2 and first.count == 50
    assert asyncio.run(_read(uri, ns, "out"))[-1][1] == b"before"  # staged: nothing visible yet
    job.commit([again, other])
    job.commit([again, other])  # a duplicate commit message
    wanted = [b"before", *[r["payload"] for r in rows]]
    _exactly_once(wanted, [p for _, p, _ in asyncio.run(_read(uri, ns, "out"))])
    assert asyncio.run(_staged_outside(uri, ns, "out")) == []  # attempt 1's ledgers deleted

    aborted = source.writer(schema, False)
    message = aborted.write(iter([{"payload": b"never"}] * 30))
    aborted.abort([message])
    _exactly_once(wanted, [p for _, p, _ in asyncio.run(_read(uri, ns, "out"))])
    assert asyncio.run(_staged_outside(uri, ns, "out")) == []


def test_checker_negative_control_at_least_once_retry_duplicates(uri: str) -> None:
    """The same retry at-least-once: the checker must see the partition twice."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    ns = _ns()
    asyncio.run(_append(uri, ns, "out", []))
    schema = StructType([StructField("payload", BinaryType())])
    job = ScribaDataSource({"metadata": uri, "stream": f"{ns}/out"}).writer(schema, False)
    rows = [{"payload": b"r%d" % i} for i in range(20)]
    job.write(iter(rows))  # attempt 1 (its records are confirmed as it goes)
    job.commit([job.write(iter(rows))])  # attempt 2
    with pytest.raises(AssertionError, match="read more than once: 20"):
        _exactly_once([r["payload"] for r in rows], [p for _, p, _ in asyncio.run(_read(uri, ns, "out"))])


def test_write_task_waits_for_the_writer_lock_as_long_as_asked(uri: str) -> None:
    """At-least-once tasks queue on the stream's writer lock (a 1M-row job's second task waited
    longer than the stream layer's 30 s default and failed): they wait ``writerLockTimeoutS``."""
    import threading

    from pyspark.sql.types import BinaryType, StructField, StructType

    from scriba.errors import WriterLockedError
    from scriba.pipeline.access import Access

    ns = _ns()
    asyncio.run(_append(uri, ns, "out", []))
    schema = StructType([StructField("payload", BinaryType())])
    rows = [{"payload": b"r%d" % i} for i in range(20)]
    with Access(uri) as holder:
        held = holder.run(holder.namespace(ns).open_writer("out"))  # an earlier task, still writing
        short = ScribaDataSource({"metadata": uri, "stream": f"{ns}/out", "writerLockTimeoutS": "1"})
        with pytest.raises(WriterLockedError, match=r"not free within 1\.0 s"):
            short.writer(schema, False).write(iter(rows))
        release = threading.Thread(target=lambda: holder.run(held.close()))
        long = ScribaDataSource({"metadata": uri, "stream": f"{ns}/out", "writerLockTimeoutS": "600"})
        release.start()  # whenever it lets go, the waiting task takes the lock and writes
        try:
            long.writer(schema, False).write(iter(rows))
        finally:
            release.join(60)
    assert [p for _, p, _ in asyncio.run(_read(uri, ns, "out"))] == [r["payload"] for r in rows]
