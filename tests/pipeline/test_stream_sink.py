"""The exactly-once streaming sink (``writeStream.format("scriba")``, ``delivery`` exactly-once),
on real bookies and etcd: a query from one stream into another delivers every record once
and in order, across a restart from its checkpoint; a batch Spark replays after a restart
is discarded; a batch whose driver died past its commit point is finished (by the next
batch's commit, before its own, or by Spark's abort) and never duplicated; a query whose
driver is SIGKILLed mid-batch and restarted from its checkpoint delivers every record
once, and its dead task's staging set is collected."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _pipeline_support import (
    _append,
    _exactly_once,
    _ns,
    _payloads,
    _read,
    _records,
    _staged_outside,
    _staging_jobs,
    _until,
    main,
)

import scriba.pipeline.commit as commit_module
from scriba.client import Client
from scriba.errors import InternalError
from scriba.pipeline.source import ScribaCommit, ScribaDataSource, ScribaStreamWriter
from scriba.pipeline.staging import SinkRecord, sink_key

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

SINK_CHILD = Path(__file__).with_name("_sink_child.py")






async def _sink_record(uri: str, stream: str, sink: str) -> SinkRecord:
    async with Client.connect(uri) as client:
        return SinkRecord.from_bytes((await client.store.get(sink_key(stream, sink))).value)


def _copy(spark: Any, uri: str, ns: str, checkpoint: Path) -> None:
    query = (spark.readStream.format("scriba").option("metadata", uri).option("stream", f"{ns}/s")
             .option("maxRecordsPerTrigger", "40").load().select("payload", "headers")
             .writeStream.format("scriba").option("metadata", uri).option("stream", f"{ns}/out")
             .option("delivery", "exactly-once").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert not query.isActive and query.exception() is None


def test_stream_to_stream_exactly_once_across_a_restart(spark: Any, uri: str, tmp_path: Path) -> None:
    ns = _ns()
    asyncio.run(_append(uri, ns, "s", _records(120)))
    asyncio.run(_append(uri, ns, "out", []))
    checkpoint = tmp_path / "checkpoint"
    _copy(spark, uri, ns, checkpoint)
    source = asyncio.run(_read(uri, ns, "s"))
    out = asyncio.run(_read(uri, ns, "out"))
    assert [(p, h) for _, p, h in out] == [(p, h) for _, p, h in source]  # payloads and headers, in order
    asyncio.run(_append(uri, ns, "s", _records(50, "m")))
    _copy(spark, uri, ns, checkpoint)  # the restarted query: only the new records, once
    _exactly_once([p for _, p, _ in asyncio.run(_read(uri, ns, "s"))], _payloads(uri, ns))
    assert asyncio.run(_staged_outside(uri, ns, "out")) == [] and asyncio.run(_staging_jobs(uri, f"{ns}/out")) == {}


def _sink_writer(uri: str, ns: str) -> ScribaStreamWriter:
    from pyspark.sql.types import BinaryType, StructField, StructType

    source = ScribaDataSource({"metadata": uri, "stream": f"{ns}/out", "delivery": "exactly-once",
                               "sinkId": "q1", "maxRecordsPerPartition": "30"})
    writer = source.streamWriter(StructType([StructField("payload", BinaryType())]), False)
    assert isinstance(writer, ScribaStreamWriter)
    return writer


def _batch(writer: ScribaStreamWriter, tag: str) -> ScribaCommit:
    message = writer.write(iter([{"payload": b"%s%d" % (tag.encode(), i)} for i in range(40)]))
    assert isinstance(message, ScribaCommit) and message.staged and message.job
    return message


def _rows(*tags: str) -> list[bytes]:
    return [b"%s%d" % (t.encode(), i) for t in tags for i in range(40)]


def test_replays_and_commits_dying_past_the_commit_point(uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = _ns()
    asyncio.run(_append(uri, ns, "out", []))
    w = _sink_writer(uri, ns)
    w.commit([_batch(w, "a"), _batch(w, "b")], 0)  # two tasks, one batch
    _exactly_once(_rows("a", "b"), _payloads(uri, ns))
    replay = _batch(w, "a")  # Spark re-runs batch 0 after a restart (its commit log was lost)
    w.commit([replay], 0)
    _exactly_once(_rows("a", "b"), _payloads(uri, ns))
    assert asyncio.run(_staged_outside(uri, ns, "out")) == []  # the replay's staged ledgers deleted

    real_finish = commit_module.finish_commit

    def dies(*args: Any) -> None:
        raise InternalError("the driver died past the commit point")

    monkeypatch.setattr(commit_module, "finish_commit", dies)
    with pytest.raises(InternalError):
        w.commit([_batch(w, "c")], 1)
    monkeypatch.setattr(commit_module, "finish_commit", real_finish)
    assert _payloads(uri, ns) == _rows("a", "b")  # past the commit point, not yet adopted
    assert asyncio.run(_sink_record(uri, f"{ns}/out", "q1")).batch == 1
    w.commit([_batch(w, "c")], 1)  # the restarted query replays batch 1: the dead commit is finished
    _exactly_once(_rows("a", "b", "c"), _payloads(uri, ns))
    w.commit([_batch(w, "d")], 2)
    _exactly_once(_rows("a", "b", "c", "d"), _payloads(uri, ns))

    monkeypatch.setattr(commit_module, "finish_commit", dies)
    late = _batch(w, "e")
    with pytest.raises(InternalError):
        w.commit([late], 3)
    monkeypatch.setattr(commit_module, "finish_commit", real_finish)
    w.abort([late], 3)  # Spark's abort after a commit that failed past its commit point: finished
    _exactly_once(_rows("a", "b", "c", "d", "e"), _payloads(uri, ns))

    given_up = _batch(w, "f")
    w.abort([given_up], 4)  # before the commit point: nothing visible, nothing left
    _exactly_once(_rows("a", "b", "c", "d", "e"), _payloads(uri, ns))
    assert asyncio.run(_staged_outside(uri, ns, "out")) == [] and asyncio.run(_staging_jobs(uri, f"{ns}/out")) == {}
    assert asyncio.run(_sink_record(uri, f"{ns}/out", "q1")).batch == 3


def test_driver_killed_mid_batch_restarts_exactly_once(spark: Any, uri: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from _sink_child import query

    ns = _ns()
    asyncio.run(_append(uri, ns, "s", _records(120)))
    asyncio.run(_append(uri, ns, "out", []))
    checkpoint, marker = tmp_path / "checkpoint", tmp_path / "hanging"
    log = open(tmp_path / "child.log", "wb")
    proc = subprocess.Popen([sys.executable, str(SINK_CHILD), uri, f"{ns}/s", f"{ns}/out", str(checkpoint),
                             str(marker)], start_new_session=True, stdout=subprocess.DEVNULL, stderr=log)
    try:
        _until(marker.exists, "the child hung inside batch 1", 300, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and Python workers: one group
        proc.wait()
        log.close()
    source = asyncio.run(_read(uri, ns, "s"))
    assert _payloads(uri, ns) == [p for _, p, _ in source[:40]]  # batch 0 committed, batch 1 not
    assert set(asyncio.run(_staging_jobs(uri, f"{ns}/out")).values()) <= {"staging"}  # the dead task's, if any
    restarted = query(spark, uri, f"{ns}/s", f"{ns}/out", str(checkpoint), None, None)
    restarted.awaitTermination(300)
    assert not restarted.isActive and restarted.exception() is None
    out = asyncio.run(_read(uri, ns, "out"))
    _exactly_once([p for _, p, _ in source], [p for _, p, _ in out])
    assert [h for _, _, h in out] == [h for _, _, h in source]
    capsys.readouterr()
    assert main(["pipeline", "gc-staged", "--metadata", uri, "--stream", f"{ns}/out", "--grace-s", "0"]) == 0
    assert asyncio.run(_staged_outside(uri, ns, "out")) == [] and asyncio.run(_staging_jobs(uri, f"{ns}/out")) == {}
    _exactly_once([p for _, p, _ in source], _payloads(uri, ns))
