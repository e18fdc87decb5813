"""Kill tests: a streaming query's driver SIGKILLed mid-batch and restarted from its
checkpoint delivers every record exactly once into an idempotent sink; a batch write
whose task dies mid-write keeps what it confirmed (at-least-once, as documented in
``scriba.pipeline.source``)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _pipeline_support import _append, _ns, _read, _records, _until, dying_frame

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CHILD = Path(__file__).with_name("_stream_child.py")




def test_streaming_driver_killed_mid_batch_resumes_exactly_once(spark: Any, uri: str, tmp_path: Path) -> None:
    from test_spark_source import _run_available_now, _sink

    ns = _ns()
    asyncio.run(_append(uri, ns, "s", _records(120)))
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    sink.mkdir()
    log = open(tmp_path / "child.log", "wb")
    proc = subprocess.Popen([sys.executable, str(CHILD), uri, f"{ns}/s", str(checkpoint), str(sink), "1"],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=log)
    try:
        _until(lambda: (sink / "hanging").exists(), "the child hung inside batch 1", 180, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and Python workers: one group
        proc.wait()
        log.close()
    assert sorted(f.name for f in sink.glob("batch-*")) == ["batch-000000.txt"]
    assert (sink / ".batch-000001.tmp").exists()  # batch 1 was half written when it died
    # restart from the checkpoint (in this process's Spark): batch 2 is re-run, nothing repeats
    _run_available_now(spark, uri, f"{ns}/s", checkpoint, sink, max_per_trigger=40)
    rows, sizes = _sink(sink)
    expected = asyncio.run(_read(uri, ns, "s"))
    assert rows == [(p, q.decode()) for p, q, _ in expected] and len(rows) == 120
    assert max(sizes) <= 40


def test_batch_write_task_killed_mid_write_is_at_least_once(spark: Any, uri: str, tmp_path: Path) -> None:
    ns = _ns()
    asyncio.run(_append(uri, ns, "out", []))
    marker = tmp_path / "died"
    total = 3000
    df = dying_frame(spark, total, marker)
    writer = df.write.format("scriba").option("metadata", uri).option("stream", f"{ns}/out").mode("append")
    with pytest.raises(Exception):  # noqa: B017 - local mode does not retry a task: the job fails
        writer.save()
    assert marker.exists()
    wanted = [b"k%d" % i for i in range(total)]
    kept = [p for _, p, _ in asyncio.run(_read(uri, ns, "out"))]
    assert len(kept) < total and kept == wanted[:len(kept)]  # a confirmed prefix, in order, nothing else
    writer.save()  # the re-run (Spark's retry on a cluster) appends the whole partition again
    after = [p for _, p, _ in asyncio.run(_read(uri, ns, "out"))]
    assert after == wanted[:len(kept)] + wanted  # every row at least once; the prefix twice
