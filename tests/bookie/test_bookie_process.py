"""Real bookie processes on 127.0.0.1 with a real etcd: durability, fencing, registration, limits."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import urllib.request
from collections.abc import AsyncIterator, Sequence

import grpc
import pytest

from scriba.embedded.bookie import BookieProcess
from scriba.entry import Crc32cDigest, master_key, pack_entry
from scriba.errors import NoSuchKeyError, Status
from scriba.meta.connect import connect
from scriba.meta.records import BookieRegistration, bookie_key
from scriba.proto import scriba_pb2 as pb
from scriba.proto import scriba_pb2_grpc as pb_grpc
from scriba.testing.cluster import BookieCluster
from scriba.testing.waiting import eventually

DIGEST = Crc32cDigest()
KEY = master_key(b"secret")
FAST = ["--session-timeout-s", "2", "--storage-option", "checkpoint_interval_s=1"]


def entry(lid: int, eid: int, size: int = 1024) -> bytes:
    payload = (f"{lid}:{eid}:".encode() * (size // 8 + 1))[:size]
    return pack_entry(DIGEST, lid, eid, eid - 1, size * (eid + 1), payload)


def add(lid: int, eid: int, *, key: bytes = KEY, data: bytes | None = None, recovery: bool = False) -> pb.AddRequest:
    return pb.AddRequest(ledger_id=lid, entry_id=eid, master_key=key,
                         flags=pb.RECOVERY_ADD if recovery else 0,
                         entry=entry(lid, eid) if data is None else data)


def channel(bookie: BookieProcess) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(bookie.address, options=[
        ("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)])


async def send(stub: pb_grpc.BookieStub, batches: Sequence[Sequence[pb.AddRequest]]) -> list[pb.AddResponse]:
    call = stub.AddStream(iter([pb.AddBatch(adds=list(b)) for b in batches]), timeout=30)
    return [r async for resp in call for r in resp.responses]


async def read_all(stub: pb_grpc.BookieStub, lid: int, first: int, last: int) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    async for chunk in stub.ReadRange(pb.ReadRangeRequest(master_key=KEY, ledger_id=lid, first_entry_id=first, last_entry_id=last), timeout=30):
        if chunk.status == Status.OK:
            for i, e in enumerate(chunk.entries):
                out[chunk.first_entry_id + i] = e
    return out


def http_get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.read()


async def registration(uri: str, bookie_id: str) -> BookieRegistration | None:
    store = await connect(uri)
    try:
        return BookieRegistration.from_bytes((await store.get(bookie_key(bookie_id))).value)
    except NoSuchKeyError:
        return None
    finally:
        await store.close()


async def test_adds_read_back_health_metrics_and_sigterm_deregisters(bookie_cluster: BookieCluster) -> None:
    (bk,) = bookie_cluster.start_bookies(1, zones=["z1"], racks=["r7"], extra_args=FAST)
    reg = await registration(bookie_cluster.metadata_uri, bk.bookie_id)
    assert reg is not None and reg.address == bk.address and (reg.zone, reg.rack) == ("z1", "r7")
    async with channel(bk) as ch:
        stub = pb_grpc.BookieStub(ch)
        out = await send(stub, [[add(1, i) for i in range(j, j + 64)] for j in range(0, 256, 64)])
        assert [r.status for r in out] == [Status.OK] * 256
        got = await read_all(stub, 1, 0, 255)
        assert got == {i: entry(1, i) for i in range(256)}
        last = await stub.ReadEntry(pb.ReadEntryRequest(master_key=KEY, ledger_id=1, entry_id=-1))
        assert (last.status, last.entry_id) == (Status.OK, 255)
    health = await asyncio.to_thread(http_get, f"http://{bk.http_address}/health")
    assert health[0] == 200 and b'"read_only": false' in health[1]
    metrics = await asyncio.to_thread(http_get, f"http://{bk.http_address}/metrics")
    assert metrics[0] == 200 and b'scriba_bookie_adds_total{status="OK"} 256.0' in metrics[1]
    assert b"scriba_storage_journal" in metrics[1]  # journal figures from storage
    started = time.monotonic()
    bk.stop()
    assert bk.returncode == 0
    assert await registration(bookie_cluster.metadata_uri, bk.bookie_id) is None
    assert time.monotonic() - started < 5


async def test_registration_disappears_when_the_process_is_killed(bookie_cluster: BookieCluster) -> None:
    (bk,) = bookie_cluster.start_bookies(1, extra_args=FAST)
    assert await registration(bookie_cluster.metadata_uri, bk.bookie_id) is not None
    bk.kill()

    async def gone() -> bool:
        return await registration(bookie_cluster.metadata_uri, bk.bookie_id) is None

    await eventually(gone, 10, what="registration expiry after SIGKILL", interval_s=0.05)
    bk.start()  # the same id comes back at once
    assert await registration(bookie_cluster.metadata_uri, bk.bookie_id) is not None


async def _load(stub: pb_grpc.BookieStub, lid: int, acked: dict[tuple[int, int], bytes], stop: asyncio.Event) -> None:
    """Stream batches of 64 (several in flight) until the stream breaks; record every OK."""
    queue: asyncio.Queue[pb.AddBatch | None] = asyncio.Queue(maxsize=8)

    async def requests() -> AsyncIterator[pb.AddBatch]:
        while (batch := await queue.get()) is not None:
            yield batch

    call = stub.AddStream(requests())

    async def produce() -> None:
        eid = 0
        while not stop.is_set():
            await queue.put(pb.AddBatch(adds=[add(lid, e) for e in range(eid, eid + 64)]))
            eid += 64
        await queue.put(None)

    producer = asyncio.ensure_future(produce())
    try:
        async for resp in call:
            for r in resp.responses:
                if r.status == Status.OK:
                    acked[(r.ledger_id, r.entry_id)] = entry(r.ledger_id, r.entry_id)
    except grpc.aio.AioRpcError:
        pass  # the bookie died
    finally:
        producer.cancel()


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
async def test_sigkill_under_load_then_restart_keeps_every_acked_entry(bookie_cluster: BookieCluster, how: str) -> None:
    (bk,) = bookie_cluster.start_bookies(1, extra_args=FAST)
    acked: dict[tuple[int, int], bytes] = {}
    stop = asyncio.Event()
    async with channel(bk) as ch:
        stub = pb_grpc.BookieStub(ch)
        loads = [asyncio.ensure_future(_load(stub, lid, acked, stop)) for lid in (101, 102, 103)]
        deadline = time.monotonic() + 20
        while len(acked) < 20_000 and time.monotonic() < deadline:  # fault pacing: kill mid-load, whichever comes first
            await asyncio.sleep(0.05)
        if how == "sigkill":
            await asyncio.to_thread(bk.kill)  # in the middle of the load
        else:
            started = time.monotonic()
            await asyncio.to_thread(bk.stop)  # graceful: in-flight adds finish, storage closes
            assert bk.returncode == 0 and time.monotonic() - started < 10
        stop.set()
        await asyncio.wait_for(asyncio.gather(*loads), 30)
    assert len(acked) > 1000
    bk.start()
    async with channel(bk) as ch:
        stub = pb_grpc.BookieStub(ch)
        for lid in (101, 102, 103):
            ids = [e for (ledger, e) in acked if ledger == lid]
            got = await read_all(stub, lid, 0, max(ids))
            missing = [e for e in ids if got.get(e) != acked[(lid, e)]]
            assert not missing, f"ledger {lid}: {len(missing)} acked entries lost or changed, e.g. {missing[:5]}"


async def test_fence_survives_restart_and_master_key_is_checked(bookie_cluster: BookieCluster) -> None:
    (bk,) = bookie_cluster.start_bookies(1, extra_args=FAST)
    async with channel(bk) as ch:
        stub = pb_grpc.BookieStub(ch)
        assert [r.status for r in await send(stub, [[add(7, i) for i in range(5)]])] == [Status.OK] * 5
        assert [r.status for r in await send(stub, [[add(7, 5, key=master_key(b"wrong"))]])] == [Status.UNAUTHORIZED]
        bad = await stub.ReadLac(pb.ReadLacRequest(ledger_id=7, flags=pb.FENCE, master_key=b"wrong"))
        assert bad.status == Status.UNAUTHORIZED
        fenced = await stub.ReadLac(pb.ReadLacRequest(ledger_id=7, flags=pb.FENCE, master_key=KEY))
        assert (fenced.status, fenced.fenced, fenced.last_entry_id, fenced.last_entry) == (Status.OK, True, 4, entry(7, 4))
        out = await send(stub, [[add(7, 5), add(7, 5, recovery=True)]])
        assert [r.status for r in out] == [Status.FENCED, Status.OK]
    bk.kill()
    bk.start()
    async with channel(bk) as ch:
        stub = pb_grpc.BookieStub(ch)
        lac = await stub.ReadLac(pb.ReadLacRequest(master_key=KEY, ledger_id=7))
        assert lac.status == Status.OK and lac.fenced and lac.last_entry_id == 5
        out = await send(stub, [[add(7, 6), add(7, 6, recovery=True), add(7, 7, key=master_key(b"wrong"), recovery=True)]])
        assert [r.status for r in out] == [Status.FENCED, Status.OK, Status.UNAUTHORIZED]


async def test_malformed_and_oversized_requests_get_a_status_and_the_server_keeps_serving(bookie_cluster: BookieCluster) -> None:
    (bk,) = bookie_cluster.start_bookies(1, extra_args=FAST)
    async with channel(bk) as ch:
        stub = pb_grpc.BookieStub(ch)
        big = pack_entry(DIGEST, 3, 0, -1, 0, b"b" * (5 * 1024 * 1024 + 1))
        out = await send(stub, [[add(3, 0, data=big)], [add(3, 1, data=entry(3, 2))], [add(3, 2, key=b"")], [add(3, 3)]])
        assert [r.status for r in out] == [Status.BAD_REQUEST] * 3 + [Status.OK]
        assert "bytes" in out[0].message and out[1].message
        # bytes that are no protobuf at all: a transport error for that call only
        junk = ch.unary_unary("/scriba.v1.Bookie/ReadEntry", request_serializer=lambda b: b,
                              response_deserializer=pb.ReadEntryResponse.FromString)
        with pytest.raises(grpc.aio.AioRpcError):
            await junk(b"\xff\xff\xff\xff\x0f", timeout=5)
        junk_stream = ch.stream_stream("/scriba.v1.Bookie/AddStream", request_serializer=lambda b: b,
                                       response_deserializer=pb.AddResponseBatch.FromString)
        answers = []
        with contextlib.suppress(grpc.aio.AioRpcError):  # the broken stream may end either way
            async for resp in junk_stream(iter([b"\x0a\xff\xff\xff\xff\x0f"]), timeout=10):
                answers.append(resp)
        assert answers == []  # nothing acknowledged for bytes that are no AddBatch
        again = await stub.ReadEntry(pb.ReadEntryRequest(master_key=KEY, ledger_id=3, entry_id=3))
        assert again.status == Status.OK and again.entry == entry(3, 3)
        assert [r.status for r in await send(stub, [[add(3, 4)]])] == [Status.OK]
    assert bk.running


async def test_wiped_or_swapped_dirs_refuse_to_start_and_format_force_recovers(bookie_cluster: BookieCluster) -> None:
    a, b = bookie_cluster.start_bookies(2, extra_args=FAST)
    async with channel(a) as ch:
        assert [r.status for r in await send(pb_grpc.BookieStub(ch), [[add(9, 0)]])] == [Status.OK]
    a.stop()
    b.stop()
    # swapped: a's data dir now holds b's disk
    os.rename(a.data_dir, a.base_dir / "data-a")
    os.rename(b.data_dir, a.data_dir)
    code = a.start_expect_exit()
    assert code != 0 and str(a.data_dir) in a.log_tail() and "CookieMismatchError" in a.log_tail()
    os.rename(a.data_dir, b.data_dir)
    os.rename(a.base_dir / "data-a", a.data_dir)
    # journal dir missing
    journal_backup = a.base_dir / "journal-backup"
    os.rename(a.journal_dir, journal_backup)
    code = a.start_expect_exit()
    assert code != 0 and str(a.journal_dir) in a.log_tail()
    os.rename(journal_backup, a.journal_dir)
    a.start()  # everything back in place: starts
    a.stop()
    a.wipe()
    code = a.start_expect_exit()
    assert code != 0 and str(a.data_dir) in a.log_tail()
    proc = await asyncio.create_subprocess_exec(*a.format_argv(force=True), stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, out.decode()
    a.start()
    async with channel(a) as ch:
        missing = await pb_grpc.BookieStub(ch).ReadEntry(pb.ReadEntryRequest(master_key=KEY, ledger_id=9, entry_id=0))
        assert missing.status == Status.NO_SUCH_LEDGER  # a fresh, empty bookie
    b.start()  # b was never touched


async def test_registration_comes_back_after_the_session_was_lost(bookie_cluster: BookieCluster) -> None:
    (bk,) = bookie_cluster.start_bookies(1, extra_args=FAST)
    bk.pause()  # SIGSTOP longer than the session timeout: etcd drops the lease and the record

    async def gone() -> bool:
        return await registration(bookie_cluster.metadata_uri, bk.bookie_id) is None

    try:
        await eventually(gone, 15, what="registration expiry while paused", interval_s=0.05)
    finally:
        bk.resume()

    async def back() -> bool:
        return await registration(bookie_cluster.metadata_uri, bk.bookie_id) is not None

    await eventually(back, 15, what="re-registration after the session came back", interval_s=0.05)
    async with channel(bk) as ch:
        stub = pb_grpc.BookieStub(ch)

        async def accepting() -> bool:
            return [r.status for r in await send(stub, [[add(8, 0)]])] == [Status.OK]

        await eventually(accepting, 10, what="adds accepted again", interval_s=0.05)
    assert "metadata_session_lost" in bk.log_tail(200)


@pytest.mark.parametrize("metadata", ["zk", "etcd"])
async def test_local_cluster_serves_on_each_metadata_store(tmp_path, metadata: str) -> None:  # type: ignore[no-untyped-def]
    from scriba.testing.cluster import LocalCluster

    cluster = LocalCluster(tmp_path, metadata=metadata)
    await asyncio.to_thread(cluster.start)
    try:
        b0, b1 = await asyncio.to_thread(cluster.bookies.start_bookies, 2, zones=["za", "zb"], extra_args=FAST)
        regs = [await registration(cluster.uri, b.bookie_id) for b in (b0, b1)]
        assert [(r.zone if r else None) for r in regs] == ["za", "zb"]
        async with channel(b1) as ch:
            stub = pb_grpc.BookieStub(ch)
            assert [r.status for r in await send(stub, [[add(4, 0), add(4, 1)]])] == [Status.OK] * 2
            assert (await read_all(stub, 4, 0, 1)) == {0: entry(4, 0), 1: entry(4, 1)}
        await asyncio.to_thread(b0.stop)
        assert b0.returncode == 0 and await registration(cluster.uri, b0.bookie_id) is None
    finally:
        await asyncio.to_thread(cluster.stop)
    assert not b1.running and not b0.running


async def test_gc_reclaims_deleted_ledgers_and_keeps_live_ones(bookie_cluster: BookieCluster) -> None:
    from scriba.meta.records import ledger_key

    store = await connect(bookie_cluster.metadata_uri)
    try:
        for lid in (21, 22):
            await store.create(ledger_key(lid), b"{}")
        (bk,) = bookie_cluster.start_bookies(1, extra_args=[*FAST, "--gc-interval-s", "0.3"])
        async with channel(bk) as ch:
            stub = pb_grpc.BookieStub(ch)
            out = await send(stub, [[add(lid, i) for lid in (21, 22) for i in range(50)]])
            assert all(r.status == Status.OK for r in out)
            await store.delete(ledger_key(21))

            async def collected() -> bool:
                resp = await stub.ReadEntry(pb.ReadEntryRequest(master_key=KEY, ledger_id=21, entry_id=0))
                return resp.status == Status.NO_SUCH_LEDGER

            await eventually(collected, 15, what="GC of the deleted ledger", interval_s=0.05)
            assert (await read_all(stub, 22, 0, 49)) == {i: entry(22, i) for i in range(50)}
    finally:
        await store.close()


async def test_registration_comes_back_after_a_zookeeper_session_expired(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from scriba.testing.cluster import LocalCluster

    cluster = LocalCluster(tmp_path, metadata="zk")
    await asyncio.to_thread(cluster.start)
    try:
        (bk,) = await asyncio.to_thread(cluster.bookies.start_bookies, 1, extra_args=FAST)
        bk.pause()

        async def gone() -> bool:
            return await registration(cluster.uri, bk.bookie_id) is None

        try:
            await eventually(gone, 20, what="ephemeral znode removed while the bookie is paused", interval_s=0.05)
        finally:
            bk.resume()

        async def back() -> bool:
            return await registration(cluster.uri, bk.bookie_id) is not None

        await eventually(back, 20, what="re-registration after the ZooKeeper session expired", interval_s=0.05)
        async with channel(bk) as ch:
            stub = pb_grpc.BookieStub(ch)

            async def accepting() -> bool:
                return [r.status for r in await send(stub, [[add(8, 0)]])] == [Status.OK]

            await eventually(accepting, 10, what="adds accepted again", interval_s=0.05)
    finally:
        await asyncio.to_thread(cluster.stop)


async def test_repeated_sigkill_cycles_lose_no_acked_entry(bookie_cluster: BookieCluster) -> None:
    (bk,) = bookie_cluster.start_bookies(1, extra_args=FAST)
    acked: dict[tuple[int, int], bytes] = {}
    for cycle in range(3):
        stop = asyncio.Event()
        before = len(acked)
        async with channel(bk) as ch:
            stub = pb_grpc.BookieStub(ch)
            loads = [asyncio.ensure_future(_load(stub, 200 + 10 * cycle + k, acked, stop)) for k in range(2)]
            deadline = time.monotonic() + 20
            while len(acked) - before < 5000 and time.monotonic() < deadline:  # fault pacing: kill mid-load
                await asyncio.sleep(0.02)
            await asyncio.to_thread(bk.kill)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*loads), 30)
        assert len(acked) - before > 500, f"cycle {cycle}: too few adds acknowledged"
        bk.start()
    async with channel(bk) as ch:
        stub = pb_grpc.BookieStub(ch)
        for lid in sorted({ledger for ledger, _ in acked}):
            ids = [e for (ledger, e) in acked if ledger == lid]
            got = await read_all(stub, lid, 0, max(ids))
            missing = [e for e in ids if got.get(e) != acked[(lid, e)]]
            assert not missing, f"ledger {lid}: {len(missing)} acked entries lost after 3 kills, e.g. {missing[:5]}"
