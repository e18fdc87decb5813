"""Disk space given back after ledgers are deleted: the GC cycle in-process, the admin
endpoint, and a real bookie process (etcd, short intervals, a restart).

The figure: after the ledgers are deleted from the metadata store, the entry logs'
bytes fall back to near their empty size within two GC intervals (the first cycle only
marks a missing ledger suspect), and every entry of the surviving ledgers still reads
back, digest checked, after compaction and after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from scriba.bookie.compaction import CompactionPolicy, PassKind
from scriba.bookie.entry_log import log_ids
from scriba.bookie.gc import GarbageCollector
from scriba.bookie.http import HttpEndpoint
from scriba.bookie.metrics import BookieMetrics
from scriba.bookie.storage import DiskLedgerStorage, open_storage
from scriba.bookie.storage_api import AddOp, StorageConfig
from scriba.entry import Crc32cDigest, master_key, pack_entry, unpack_entry
from scriba.errors import Status
from scriba.meta.connect import connect
from scriba.meta.records import ledger_key
from scriba.meta.store import MetadataStore
from scriba.proto import scriba_pb2 as pb
from scriba.proto import scriba_pb2_grpc as pb_grpc
from scriba.testing.cluster import BookieCluster
from scriba.testing.waiting import eventually

DIGEST = Crc32cDigest()
KEY = master_key(b"secret")


def entry(lid: int, eid: int, size: int = 1000) -> bytes:
    payload = (f"{lid}:{eid}:".encode() * (size // 4 + 1))[:size]
    return pack_entry(DIGEST, lid, eid, eid - 1, 0, payload)


# --- in-process: the GC cycle over a disk storage -------------------------------------


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    s = await connect(f"memory://compaction-{uuid.uuid4().hex[:8]}")
    yield s
    await s.close()


def storage_config(tmp: Path) -> StorageConfig:
    return StorageConfig(tmp / "journal", tmp / "ledgers", checkpoint_interval_s=3600,
                         entry_log_file_bytes_max=64 * 1024)


async def write(s: DiskLedgerStorage, ledgers: list[int], count: int) -> dict[tuple[int, int], bytes]:
    out: dict[tuple[int, int], bytes] = {}
    for first in range(0, count, 10):
        ops = [AddOp(lid, e, KEY, entry(lid, e)) for lid in ledgers for e in range(first, first + 10)]
        assert await s.add_batch(ops) == [Status.OK] * len(ops)
        out.update({(o.ledger_id, o.entry_id): o.entry for o in ops})
        await s.checkpoint()  # small flushes: ledgers share every log
    return out


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sample(metrics: BookieMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_gc_reclaims_in_the_cycle_that_deletes_and_runs_passes_by_interval(
    store: MetadataStore, tmp_path: Path
) -> None:
    clock = FakeClock()
    metrics = BookieMetrics()
    s = await open_storage(storage_config(tmp_path))
    try:
        for lid in range(1, 9):
            await store.create(ledger_key(lid), b"{}")
        data = await write(s, list(range(1, 9)), 60)
        logs_before = log_ids(tmp_path / "ledgers" / "entrylogs")
        gc = GarbageCollector(s, store, metrics, bookie_id="b", interval_s=1, clock=clock,
                              policy=CompactionPolicy(minor_interval_s=10, major_interval_s=100,
                                                      rate_bytes_per_s=0))
        for lid in range(1, 8):
            await store.delete(ledger_key(lid))
        first = await gc.run_once()  # suspects only
        assert first.deleted == () and first.compaction is not None
        assert first.compaction.kind is PassKind.NONE and first.compaction.logs_removed == 0
        second = await gc.run_once()
        assert second.deleted == tuple(range(1, 8))
        assert second.compaction is not None and second.compaction.kind is PassKind.NONE
        # logs holding only deleted ledgers go at once; those with some of ledger 8 stay
        # until a compaction pass is due
        usages = s._meta.usages()
        assert all(u.live_bytes > 0 for u in usages)
        assert len(usages) + second.compaction.logs_removed == len(logs_before)
        clock.now += 10
        minor = await gc.run_once()
        assert minor.compaction is not None and minor.compaction.kind is PassKind.MINOR
        assert minor.compaction.logs_compacted >= 1 and minor.compaction.entries_copied > 0
        assert sample(metrics, "scriba_bookie_compaction_runs_total", kind="minor") == 1
        assert sample(metrics, "scriba_bookie_compaction_reclaimed_bytes_total") > 300_000
        assert sample(metrics, "scriba_bookie_compaction_logs_total", how="compacted") >= 1
        clock.now += 90
        major = await gc.run_once()
        assert major.compaction is not None and major.compaction.kind is PassKind.MAJOR
        survivors = {k: v for k, v in data.items() if k[0] == 8}
        for (lid, eid), value in survivors.items():
            assert s.read_entry(lid, eid) == value
        assert s.stats()["entry_log_reclaimable_bytes"] <= 0.25 * s.stats()["entry_log_bytes"]
        assert gc.status()["cycles_completed"] == 4
    finally:
        await s.close()


async def test_gc_gives_space_back_after_a_restart_even_when_it_deletes_nothing(
    store: MetadataStore, tmp_path: Path
) -> None:
    """The reported bug: deletions before a restart left dead logs forever, because
    compaction only ran in a cycle that deleted something."""
    s = await open_storage(storage_config(tmp_path))
    await write(s, [1, 2, 3], 40)
    await s.delete_ledgers([1, 2, 3])
    await s.close()
    s = await open_storage(storage_config(tmp_path))
    try:
        logs = log_ids(tmp_path / "ledgers" / "entrylogs")
        assert len(logs) >= 2
        gc = GarbageCollector(s, store, BookieMetrics(), bookie_id="b", interval_s=60)
        result = await gc.run_once()
        assert result.deleted == () and result.compaction is not None
        assert result.compaction.logs_removed == len(logs)
        assert log_ids(tmp_path / "ledgers" / "entrylogs") == []
    finally:
        await s.close()


async def test_gc_request_runs_a_cycle_now_and_metadata_errors_do_not_stop_reclaiming(
    store: MetadataStore, tmp_path: Path
) -> None:
    from scriba.errors import MetadataUnavailableError

    class Unreachable:
        async def get(self, key: str) -> None:
            raise MetadataUnavailableError("down")

        async def scan(self, prefix: str, *, page_size: int = 500):  # type: ignore[no-untyped-def]
            raise MetadataUnavailableError("down")
            yield  # pragma: no cover

    s = await open_storage(storage_config(tmp_path))
    try:
        await write(s, [1], 200)  # logs of ledger 1 alone
        await write(s, [2], 10)  # a ledger still stored: the GC must ask the store about it
        await s.delete_ledgers([1])
        gc = GarbageCollector(s, Unreachable(), BookieMetrics(), bookie_id="b",  # type: ignore[arg-type]
                              interval_s=3600)
        gc.start()
        try:
            cycle = gc.request(major=True)
            assert cycle == 1

            async def done() -> bool:
                return gc.cycles >= cycle

            await eventually(done, 20, what="the requested GC cycle", interval_s=0.05)
            status = gc.status()
            assert "down" in str(status["last_error"])
            last = status["last"]
            assert isinstance(last, dict) and last["compaction"]["logs_removed"] >= 3  # type: ignore[index]
            assert s.ledger_ids() == [2]  # nothing deleted while the store cannot answer
            assert s.read_entry(2, 9) == entry(2, 9)
        finally:
            await gc.stop()
    finally:
        await s.close()


# --- the admin endpoint ---------------------------------------------------------------


class FakeGc:
    def __init__(self) -> None:
        self.requests: list[tuple[bool, bool]] = []

    def request(self, *, major: bool = False, minor: bool = False) -> int:
        self.requests.append((major, minor))
        return len(self.requests)

    def status(self) -> dict[str, object]:
        return {"cycles_completed": 0, "running": False}


def http(method: str, url: str, body: bytes | None = None) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


async def test_admin_endpoint_requests_and_reports_gc() -> None:
    fake = FakeGc()
    current: list[FakeGc | None] = [None]
    endpoint = HttpEndpoint("127.0.0.1", 0, health=lambda: (True, {}), metrics=lambda: b"",
                            gc=lambda: current[0])
    await endpoint.start()
    base = f"http://{endpoint.address}/api/gc"
    try:
        code, body = await asyncio.to_thread(http, "POST", base, b"")
        assert code == 503 and "not running" in str(body["error"])
        current[0] = fake
        code, body = await asyncio.to_thread(http, "POST", base + "?major=1", b"{}")
        assert code == 202 and body["requested_cycle"] == 1 and fake.requests == [(True, False)]
        code, body = await asyncio.to_thread(http, "PUT", base + "?minor=true&major=0", None)
        assert code == 202 and fake.requests[-1] == (False, True)
        code, body = await asyncio.to_thread(http, "GET", base, None)
        assert code == 200 and body == {"cycles_completed": 0, "running": False}
        code, body = await asyncio.to_thread(http, "POST", base + "?force=1", b"")
        assert code == 400 and "force" in str(body["error"]) and len(fake.requests) == 2
        code, body = await asyncio.to_thread(http, "DELETE", base, None)
        assert code == 405
    finally:
        await endpoint.stop()


# --- a real bookie process -----------------------------------------------------------

GC_INTERVAL_S = 1.0
BOOKIE_ARGS = [
    "--session-timeout-s", "2",
    "--gc-interval-s", str(GC_INTERVAL_S),
    "--minor-compaction-interval-s", str(GC_INTERVAL_S),
    "--major-compaction-interval-s", str(2 * GC_INTERVAL_S),
    "--storage-option", "checkpoint_interval_s=0.2",
    "--storage-option", f"entry_log_file_bytes_max={256 * 1024}",
    "--storage-option", f"journal_file_bytes_max={4 * 1024 * 1024}",
]


def entry_log_bytes(data_dir: Path) -> int:
    """The entry logs' bytes on disk; a log the bookie deletes between the listing and
    its ``stat`` (compaction at work) counts as gone, not as an error."""
    total = 0
    for log_path in (data_dir / "ledgers" / "entrylogs").glob("*.elog"):
        with contextlib.suppress(FileNotFoundError):
            total += log_path.stat().st_size
    return total


async def gc_cycles(http_address: str) -> int:
    code, status = await asyncio.to_thread(http, "GET", f"http://{http_address}/api/gc", None)
    assert code == 200
    return int(status["cycles_completed"])  # type: ignore[call-overload]


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def add(stub: pb_grpc.BookieStub, batches: list[list[pb.AddRequest]]) -> list[int]:
    call = stub.AddStream(iter([pb.AddBatch(adds=b) for b in batches]), timeout=30)
    return [r.status async for resp in call for r in resp.responses]


async def read_checked(stub: pb_grpc.BookieStub, lid: int, count: int) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    async for chunk in stub.ReadRange(pb.ReadRangeRequest(master_key=KEY, ledger_id=lid, first_entry_id=0,
                                                          last_entry_id=count - 1), timeout=30):
        assert chunk.status == Status.OK
        for i, e in enumerate(chunk.entries):
            unpack_entry(DIGEST, e)  # digest checked
            out[chunk.first_entry_id + i] = e
    return out


async def test_a_bookie_gives_deleted_ledgers_disk_back_within_two_gc_intervals(
    bookie_cluster: BookieCluster,
) -> None:
    store = await connect(bookie_cluster.metadata_uri)
    ledgers = list(range(100, 160))
    survivors = ledgers[::20]  # 3 of 60 ledgers stay
    per_ledger = 40
    try:
        for lid in ledgers:
            await store.create(ledger_key(lid), b"{}")
        (bk,) = bookie_cluster.start_bookies(1, extra_args=BOOKIE_ARGS)
        empty = entry_log_bytes(bk.data_dir)
        async with grpc.aio.insecure_channel(bk.address) as ch:
            stub = pb_grpc.BookieStub(ch)
            for first in range(0, per_ledger, 10):  # every ledger in every log
                batch = [pb.AddRequest(ledger_id=lid, entry_id=e, master_key=KEY, entry=entry(lid, e))
                         for lid in ledgers for e in range(first, first + 10)]
                assert await add(stub, [batch]) == [Status.OK] * len(batch)

            async def flushed() -> bool:
                return entry_log_bytes(bk.data_dir) > len(ledgers) * per_ledger * 1000

            await eventually(flushed, 30, what="entries flushed to entry logs", interval_s=0.05)
            full = entry_log_bytes(bk.data_dir)
            cycles_before = await gc_cycles(bk.http_address)
            for lid in ledgers:
                if lid not in survivors:
                    await store.delete(ledger_key(lid))
            live_bytes = len(survivors) * per_ledger * 1100

            async def reclaimed() -> bool:
                return entry_log_bytes(bk.data_dir) <= empty + 1.3 * live_bytes

            start = time.monotonic()
            await eventually(reclaimed, 30, what="disk space given back", interval_s=0.05)
            took = time.monotonic() - start
            # a cycle under way when the ledgers went may have listed them; the next marks
            # them suspect; the one after deletes them and gives the space back
            assert await gc_cycles(bk.http_address) - cycles_before <= 3
            print(f"entry logs: empty {empty} B, full {full} B, after GC "
                  f"{entry_log_bytes(bk.data_dir)} B in {took:.1f}s (gc interval {GC_INTERVAL_S}s)")
            for lid in survivors:
                assert await read_checked(stub, lid, per_ledger) == {e: entry(lid, e) for e in range(per_ledger)}
            metrics = (await asyncio.to_thread(urllib.request.urlopen,
                                               f"http://{bk.http_address}/metrics", None, 5)).read().decode()
            assert metric(metrics, "scriba_bookie_compaction_reclaimed_bytes_total") > full / 2
            assert metric(metrics, "scriba_bookie_compaction_runs_total") >= 2
            assert "scriba_storage_entry_log_reclaimable_bytes" in metrics
            assert "scriba_storage_compaction_pass_scanned_bytes" in metrics

            for lid in survivors:  # now everything goes, the current log included
                await store.delete(ledger_key(lid))
            code, body = await asyncio.to_thread(http, "POST", f"http://{bk.http_address}/api/gc?major=1", b"")
            assert code == 202
            target = int(body["requested_cycle"]) + 1  # type: ignore[call-overload]  # suspect, then delete

            async def all_gone() -> bool:
                return await gc_cycles(bk.http_address) >= target and entry_log_bytes(bk.data_dir) <= empty

            await eventually(all_gone, 30, what="every entry-log byte given back", interval_s=0.05)
        bk.restart()
        assert entry_log_bytes(bk.data_dir) <= empty
    finally:
        await store.close()


async def test_surviving_entries_read_back_after_compaction_and_a_restart(
    bookie_cluster: BookieCluster,
) -> None:
    store = await connect(bookie_cluster.metadata_uri)
    try:
        for lid in (1, 2):
            await store.create(ledger_key(lid), b"{}")
        (bk,) = bookie_cluster.start_bookies(1, extra_args=BOOKIE_ARGS)
        async with grpc.aio.insecure_channel(bk.address) as ch:
            stub = pb_grpc.BookieStub(ch)
            for first in range(0, 300, 50):  # one flush per batch: both ledgers in every log
                batch = [pb.AddRequest(ledger_id=lid, entry_id=e, master_key=KEY, entry=entry(lid, e))
                         for e in range(first, first + 50) for lid in (1, 2)]
                assert await add(stub, [batch]) == [Status.OK] * 100

                async def flushed(first: int = first) -> bool:
                    return entry_log_bytes(bk.data_dir) >= (first + 50) * 2 * 1000

                await eventually(flushed, 30, what="batch flushed to the entry logs", interval_s=0.05)
            await store.delete(ledger_key(1))

            async def compacted() -> bool:
                text = (await asyncio.to_thread(urllib.request.urlopen, f"http://{bk.http_address}/metrics",
                                                None, 5)).read().decode()
                return metric(text, 'scriba_bookie_compaction_logs_total{how="compacted"}') >= 1

            await eventually(compacted, 30, what="ledger 2's logs compacted", interval_s=0.05)
            assert await read_checked(stub, 2, 300) == {e: entry(2, e) for e in range(300)}
        bk.restart()
        async with grpc.aio.insecure_channel(bk.address) as ch:
            stub = pb_grpc.BookieStub(ch)
            assert await read_checked(stub, 2, 300) == {e: entry(2, e) for e in range(300)}
            resp = await stub.ReadEntry(pb.ReadEntryRequest(master_key=KEY, ledger_id=1, entry_id=0))
            assert resp.status == Status.NO_SUCH_LEDGER
    finally:
        await store.close()
