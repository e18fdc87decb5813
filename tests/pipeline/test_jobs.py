"""The pipeline jobs on real bookies and etcd with the shared local[2] Spark: ``export``
(Parquet, resumes exactly where it stopped) on a 100k-record stream
(``SCRIBA_PIPELINE_RECORDS`` sets another size), and ``audit``
(healthy namespace = no rows; a deliberately deleted and a deliberately corrupted
replica are found, exactly those)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from _pipeline_support import _append, _ns, _records, main

from scriba.client import Client
from scriba.entry import make_digest, master_key, pack_entry
from scriba.errors import Status
from scriba.ids import EntryId
from scriba.meta.records import LedgerMetadata, ledger_key
from scriba.meta.store import Check, Put
from scriba.pipeline.jobs.audit import audit
from scriba.pipeline.jobs.export import export, read_export, read_positions

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RECORDS = int(os.environ.get("SCRIBA_PIPELINE_RECORDS", "100000"))


@pytest.fixture(scope="module")
def big(uri: str) -> str:
    """A namespace with one stream of RECORDS records over several segments."""
    ns = _ns()
    asyncio.run(_append(uri, ns, "s", _records(RECORDS), batch=1000, segment_records_max=RECORDS // 4))
    return ns


def test_export_to_parquet_resumes_where_it_stopped(spark: Any, uri: str, big: str, tmp_path: Path) -> None:
    out = tmp_path / "export"
    first = export(spark, uri, out, streams=(f"{big}/s",))
    assert first.records == RECORDS and first.streams == 1
    df = read_export(spark, out)
    assert df.count() == RECORDS and df.select("position").distinct().count() == RECORDS
    payloads = {bytes(r.payload) for r in df.select("payload").collect()}
    assert payloads == {p for p, _ in _records(RECORDS)}
    assert [p.name for p in (out / f"namespace={big}").iterdir()] == ["stream=s"]
    assert all(d.name.startswith("date=") for d in (out / f"namespace={big}" / "stream=s").iterdir())
    assert read_positions(out) == {f"{big}/s": first.ranges[f"{big}/s"][1]}
    # more records: the re-run exports exactly those, after the last exported position
    asyncio.run(_append(uri, big, "s", _records(50, "more")))
    second = export(spark, uri, out, streams=(f"{big}/s",))
    assert second.records == 50 and second.ranges[f"{big}/s"][0] == first.ranges[f"{big}/s"][1]
    df = read_export(spark, out)
    assert df.count() == RECORDS + 50 and df.select("position").distinct().count() == RECORDS + 50
    assert {bytes(r.payload) for r in df.where(df.position >= second.ranges[f"{big}/s"][0])
            .where(df.segment >= 0).select("payload").collect()} >= {p for p, _ in _records(50, "more")}
    # nothing new: nothing exported
    third = export(spark, uri, out, namespace=big)
    assert third.records == 0 and third.streams == 0 and read_export(spark, out).count() == RECORDS + 50
    assert "50 records of 1 streams" in second.line()


PASSWORD = b"audit-pw"


async def _forge_faults(uri: str) -> tuple[int, list[str]]:
    """A closed E3/W3/A2 ledger of 5 entries whose entry 3 was never written to its third
    bookie and whose entry 4 is corrupt there (the digest no longer matches)."""
    async with Client.connect(uri) as client:
        writer = await client.create_ledger(3, 3, 2, password=PASSWORD)
        for i in range(3):
            await writer.append(b"good %d" % i)
        await writer.close()
        ledger_id = writer.ledger_id
        raw = await client.store.get(ledger_key(ledger_id))
        md = LedgerMetadata.from_bytes(raw.value)
        ensemble = [str(b) for b in md.ensembles[0][1]]
        digest = make_digest(md.digest_type.value, PASSWORD)
        loop = asyncio.get_running_loop()
        adds = []
        for entry_id, targets in ((3, md.ensembles[0][1][:2]), (4, md.ensembles[0][1])):
            payload = b"forged %d" % entry_id
            data = pack_entry(digest, ledger_id, entry_id, 2, len(payload), payload)
            for n, bookie in enumerate(targets):
                copy = data if (entry_id, n) != (4, 2) else data[:-1] + bytes([data[-1] ^ 0xFF])
                fut: asyncio.Future[Any] = loop.create_future()
                client.transport.add(bookie, ledger_id, EntryId(entry_id), master_key(PASSWORD), copy,
                                     lambda _b, _l, _e, status, f=fut: f.done() or f.set_result(status),
                                     recovery=True)
                adds.append(fut)
        assert all(s == Status.OK for s in await asyncio.gather(*adds))
        closed = dataclasses.replace(md, last_entry_id=EntryId(4))
        await client.store.txn([Check(ledger_key(ledger_id), raw.version)],
                               [Put(ledger_key(ledger_id), closed.to_bytes())])
        return ledger_id, ensemble


def test_audit_finds_a_deleted_and_a_corrupted_replica(spark: Any, uri: str, big: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # negative control: a healthy namespace yields no problem rows
    problems, report = audit(spark, uri, namespace=big)
    assert report.healthy and problems.count() == 0, problems.collect()
    assert report.ledgers >= 4 and report.replicas_checked >= 3 * report.ledgers
    ledger_id, ensemble = asyncio.run(_forge_faults(uri))
    problems, report = audit(spark, uri, ledgers=(ledger_id,), password=PASSWORD.decode())
    rows = sorted((r.entry_id, r.bookie, r.problem) for r in problems.collect())
    assert rows == [(3, ensemble[2], "missing"), (4, ensemble[2], "corrupt")]
    assert not report.healthy and (report.missing, report.corrupt, report.replicas_checked) == (1, 1, 15)
    assert "PROBLEMS" in report.line()
    # every ledger (no scope): the forged one is among them, the stream's are clean
    problems, report = audit(spark, uri, password=PASSWORD.decode())
    assert {r.ledger_id for r in problems.collect()} >= {ledger_id}
    # the command line: exit 1 with problems, 0 without, one JSON summary line
    assert main(["pipeline", "audit", "--metadata", uri, "--ledgers", str(ledger_id),
                 "--password", PASSWORD.decode(), "--json"]) == 1
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["corrupt"] == 1
    assert main(["pipeline", "audit", "--metadata", uri, "--namespace", big, "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["healthy"] is True


def test_export_command_line(spark: Any, uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ns = _ns()
    asyncio.run(_append(uri, ns, "a", _records(30)))
    args = ["pipeline", "export", "--metadata", uri, "--stream", f"{ns}/a", "--to", str(tmp_path / "x")]
    assert main(args) == 0 and capsys.readouterr().out.strip().endswith(f"30 records of 1 streams to {tmp_path / 'x'}")
    assert main([*args, "--json"]) == 0 and json.loads(capsys.readouterr().out)["records"] == 0
    assert read_export(spark, tmp_path / "x").count() == 30
