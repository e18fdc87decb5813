"""scriba.local_cluster (the launcher behind terraform's local environment): PID records
that never signal a recycled PID, idempotent starts, stops that keep or remove data, a
restart on kept data, a reused bookie id, and bad input refused with a clear error."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from terraform_kit import free_port_range

from scriba.client import Client
from scriba.errors import ConfigError
from scriba.local_cluster import (
    BOOKIES_DIR,
    METADATA_DIR,
    BookieSpec,
    ProcessRecord,
    process_start_ticks,
    read_records,
    start_bookie,
    start_metadata,
    status,
    stop_bookie,
    stop_metadata,
    write_topology,
)

_IGNORE_TERM = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


def _child(code: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _end(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _record(proc: subprocess.Popen[str], *, ticks_delta: int = 0) -> ProcessRecord:
    ticks = process_start_ticks(proc.pid)
    assert ticks is not None
    return ProcessRecord("child", proc.pid, ticks + ticks_delta, "-")


def test_a_record_signals_only_the_process_it_names() -> None:
    proc = _child("import time; print('ready', flush=True); time.sleep(60)")
    try:
        stranger = _record(proc, ticks_delta=1)  # same PID, another start time: a recycled PID
        assert not stranger.alive
        stranger.stop(timeout_s=0.2)
        assert proc.poll() is None  # negative control: untouched
        own = _record(proc)
        assert own.alive
        own.stop()
        assert not own.alive  # gone (a zombie until we reap it counts as gone)
        assert proc.wait(timeout=10) == -15
    finally:
        _end(proc)


def test_a_process_that_ignores_sigterm_is_killed() -> None:
    proc = _child(_IGNORE_TERM)
    try:
        record = _record(proc)
        record.stop(timeout_s=0.3)
        assert not record.alive and proc.wait(timeout=10) == -9
    finally:
        _end(proc)


async def _write(uri: str, entries: int) -> int:
    async with Client.connect(uri) as client:
        writer = await client.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
                                            password=b"k")
        for i in range(entries):
            await writer.append(b"e%d" % i)
        await writer.close()
        return int(writer.ledger_id)


async def _read(uri: str, ledger_id: int) -> list[bytes]:
    async with Client.connect(uri) as client:
        reader = await client.open_ledger(ledger_id, password=b"k")
        return [e.payload async for e in reader.read(0, reader.last_add_confirmed)]


def test_start_stop_keep_data_restart_and_remove(tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    base = free_port_range(4, set())
    spec = BookieSpec("z1.r1.1", "", "reg", "z1", "r1", base + 2, base + 3)
    try:
        uri = start_metadata(data, members=1, port_base=base, prefix="t")
        assert uri == f"etcd://127.0.0.1:{base}/t"
        spec = dataclasses.replace(spec, metadata_uri=uri)
        start_bookie(data, spec)
        pids = {r.name: r.pid for r in read_records(data / BOOKIES_DIR / spec.bookie_id / "process.json")}
        start_bookie(data, spec)  # running: nothing happens
        start_metadata(data, members=1, port_base=base, prefix="t")
        assert {r.name: r.pid for r in read_records(data / BOOKIES_DIR / spec.bookie_id / "process.json")} == pids
        ledger_id = asyncio.run(_write(uri, 20))

        doc = status(data)
        records = [ProcessRecord(**{k: r[k] for k in ("name", "pid", "start_ticks", "log")})
                   for r in doc["metadata"] + doc["bookies"][0]["processes"]]
        assert len(records) == 2 and all(r.alive for r in records)
        stop_bookie(data, spec.bookie_id, keep_data=True)
        stop_metadata(data, keep_data=True)
        assert not any(r.alive for r in records)
        assert (data / METADATA_DIR / "m0").is_dir() and (data / BOOKIES_DIR / spec.bookie_id / "data").is_dir()

        with pytest.raises(ConfigError, match="keep the ports it was created with"):
            start_metadata(data, members=1, port_base=base + 100, prefix="t")

        start_metadata(data, members=1, port_base=base, prefix="t")  # the same cluster, on its data
        start_bookie(data, spec)  # the same bookie: its cookie still matches
        assert asyncio.run(_read(uri, ledger_id)) == [b"e%d" % i for i in range(20)]

        # a new bookie under a used id (data removed, the store still has the old cookie)
        stop_bookie(data, spec.bookie_id, keep_data=False)
        assert not (data / BOOKIES_DIR / spec.bookie_id).exists()
        start_bookie(data, spec)
        assert status(data)["bookies"][0]["processes"][0]["alive"]
    finally:
        stop_bookie(data, spec.bookie_id, keep_data=False)
        stop_metadata(data, keep_data=False)
    assert not data.exists()
    stop_metadata(data, keep_data=False)  # nothing left to stop: no error


def test_bad_input_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="odd number"):
        start_metadata(tmp_path, members=2, port_base=30000, prefix="t")
    with pytest.raises(ConfigError, match="without '/'"):
        start_bookie(tmp_path, BookieSpec("a/b", "etcd://127.0.0.1:1/t", "r", "z", "k", 3000, 3001))
    with pytest.raises(ConfigError, match=r"not in 1\.\.65535"):
        start_bookie(tmp_path, BookieSpec("b", "etcd://127.0.0.1:1/t", "r", "z", "k", 70000, 3001))
    with pytest.raises(ConfigError, match="not valid JSON"):
        write_topology(tmp_path, "{bookies")
    with pytest.raises(ConfigError, match="expected /region/zone/rack"):
        write_topology(tmp_path, json.dumps({"bookies": {"b": "no-slash"}}))
    assert not (tmp_path / "topology.json").exists() and not (tmp_path / BOOKIES_DIR).exists()
    path = write_topology(tmp_path, json.dumps({"bookies": {"b": {"region": "r", "zone": "z", "rack": "k"}}}))
    assert json.loads(path.read_text()) == {"bookies": {"b": {"region": "r", "zone": "z", "rack": "k"}}}
