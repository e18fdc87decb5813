"""Exactly-once writes' staged ledgers after a dead driver, on real bookies and etcd.

A Spark driver SIGKILLed before its commit leaves a staging record and staged ledgers:
a collector with the default grace keeps them (the job may still commit); the next
exactly-once job on the stream with a short grace collects them and writes its own rows
exactly once. The collector/commit race is played step by step both ways: the collector
first (the commit fails and adopts nothing) and the commit point first (the collector,
which read the record before it, takes nothing). A driver that dies after its commit
point is rolled forward by ``scriba pipeline gc-staged``."""

from __future__ import annotations

import asyncio
import json
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
    _staged_outside,
    _staging_jobs,
    _until,
    main,
)

from scriba.client import Client
from scriba.errors import NoSuchLedgerError
from scriba.pipeline.access import Access
from scriba.pipeline.commit import pass_commit_point, plan_collection, run_collection
from scriba.pipeline.source import ScribaCommit, ScribaDataSource, ScribaWriter
from scriba.pipeline.staging import Collect, StagedWriteCollectedError
from scriba.testing.checkers.acked_set import check_acked_set

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

CHILD = Path(__file__).with_name("_write_child.py")






async def _exists(uri: str, ledger_id: int) -> bool:
    async with Client.connect(uri) as client:
        try:
            await client.open_ledger(ledger_id, b"", recovery=False)
        except NoSuchLedgerError:
            return False
        return True


def _gc(uri: str, stream: str, capsys: pytest.CaptureFixture[str], *grace: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["pipeline", "gc-staged", "--metadata", uri, "--stream", stream, "--json", *grace]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report




def test_driver_killed_before_commit_is_collected_by_the_next_job(
        spark: Any, uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ns = _ns()
    stream = f"{ns}/out"
    asyncio.run(_append(uri, ns, "out", [(b"before", {})]))
    marker = tmp_path / "hanging"
    log = open(tmp_path / "child.log", "wb")
    proc = subprocess.Popen([sys.executable, str(CHILD), uri, stream, str(marker)],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=log)
    try:  # partition 0 staged its 5 ledgers; partition 1 hangs: the job cannot have committed
        _until(lambda: marker.exists() and len(asyncio.run(_staged_outside(uri, ns, "out"))) >= 5,
               "the child staged partition 0 and hung in partition 1", 300, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and Python workers: one group
        proc.wait()
        log.close()
    left = asyncio.run(_staged_outside(uri, ns, "out"))
    jobs = asyncio.run(_staging_jobs(uri, stream))
    assert len(left) >= 5 and list(jobs.values()) == ["staging"]
    assert _payloads(uri, ns) == [b"before"]  # nothing of the dead job is visible

    young = _gc(uri, stream, capsys)  # the default grace (a day): the job may still commit
    assert young["collected"] == [] and young["deleted_ledgers"] == [] and young["kept"] == 1
    assert asyncio.run(_staged_outside(uri, ns, "out")) == left

    # the next exactly-once job on the stream, with a grace its predecessor has outlived
    rows = spark.createDataFrame([(b"n%d" % i,) for i in range(300)], "payload binary").repartition(2)
    (rows.write.format("scriba").option("metadata", uri).option("stream", stream)
     .option("delivery", "exactly-once").option("stagingGraceS", "0").mode("append").save())
    assert asyncio.run(_staged_outside(uri, ns, "out")) == []
    assert asyncio.run(_staging_jobs(uri, stream)) == {}
    assert not any(asyncio.run(_exists(uri, i)) for i in left)
    read = _payloads(uri, ns)
    wanted = [b"before", *(b"n%d" % i for i in range(300))]
    result = check_acked_set(wanted, wanted, read)  # (two partitions: their order is Spark's)
    assert result.ok and not result.duplicated and read[0] == b"before", result.explain()


def _job(uri: str, ns: str) -> ScribaWriter:
    from pyspark.sql.types import BinaryType, StructField, StructType

    source = ScribaDataSource({"metadata": uri, "stream": f"{ns}/out", "delivery": "exactly-once",
                               "maxRecordsPerPartition": "40"})
    writer = source.writer(StructType([StructField("payload", BinaryType())]), False)
    assert isinstance(writer, ScribaWriter)
    return writer


def _staged(writer: ScribaWriter, tag: str, n: int = 50) -> ScribaCommit:
    message = writer.write(iter([{"payload": b"%s%d" % (tag.encode(), i)} for i in range(n)]))
    assert isinstance(message, ScribaCommit) and message.staged
    return message


def test_collector_and_commit_race_exactly_one_wins(uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    ns = _ns()
    stream = f"{ns}/out"
    asyncio.run(_append(uri, ns, "out", [(b"before", {})]))

    # the collector first: the commit finds its record gone and adopts nothing
    late = _job(uri, ns)
    message = _staged(late, "late")
    report = _gc(uri, stream, capsys, "--grace-s", "0")
    assert report["collected"] == [late.job] and sorted(report["deleted_ledgers"]) == sorted(message.staged)
    with pytest.raises(StagedWriteCollectedError, match="nothing of it was adopted"):
        late.commit([message])
    late.abort([message])  # what Spark does next: nothing left to delete, no error
    assert _payloads(uri, ns) == [b"before"]
    assert asyncio.run(_staged_outside(uri, ns, "out")) == []

    # the commit point first, between the collector's reads and its deletes: it takes nothing
    slow = _job(uri, ns)
    message = _staged(slow, "slow")
    with Access(uri) as access:
        planned = plan_collection(access, stream=stream, grace_s=0)
        assert [type(s) for s in planned.steps] == [Collect]  # it read the job as staging
        row = pass_commit_point(access, stream, slow.job, list(message.staged))
        assert row is not None and row.record.state == "committing"
        report_after = run_collection(access, planned)
    assert report_after.collected == [] and report_after.deleted_ledgers == [] and report_after.kept == 1
    assert all(asyncio.run(_exists(uri, i)) for i in message.staged)
    slow.commit([message])  # the driver finishes its commit
    _exactly_once([b"before", *(b"slow%d" % i for i in range(50))], _payloads(uri, ns))
    assert asyncio.run(_staged_outside(uri, ns, "out")) == [] and asyncio.run(_staging_jobs(uri, stream)) == {}


def test_driver_dead_after_commit_point_is_rolled_forward(uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    ns = _ns()
    stream = f"{ns}/out"
    asyncio.run(_append(uri, ns, "out", [(b"before", {})]))
    job = _job(uri, ns)
    lost_attempt = _staged(job, "kept")  # a retried attempt's ledgers: never adopted
    message = _staged(job, "kept")
    with Access(uri) as access:
        assert pass_commit_point(access, stream, job.job, list(message.staged)) is not None
    # ... and the driver dies here: nothing adopted yet
    assert _payloads(uri, ns) == [b"before"]
    assert _gc(uri, stream, capsys)["rolled_forward"] == []  # within the grace: left to its driver
    report = _gc(uri, stream, capsys, "--grace-s", "0")
    assert report["rolled_forward"] == [job.job] and sorted(report["deleted_ledgers"]) == sorted(lost_attempt.staged)
    wanted = [b"before", *(b"kept%d" % i for i in range(50))]
    _exactly_once(wanted, _payloads(uri, ns))
    job.commit([message])  # the driver's own commit, had it lived: a repeat, nothing twice
    _exactly_once(wanted, _payloads(uri, ns))
    assert asyncio.run(_staged_outside(uri, ns, "out")) == [] and asyncio.run(_staging_jobs(uri, stream)) == {}
