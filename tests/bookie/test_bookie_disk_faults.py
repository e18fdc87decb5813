"""R10 (fsync EIO through the fault layer) and R11 (disk full on a size-capped tmpfs) on real processes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from scriba.embedded.bookie import BookieProcess
from scriba.entry import Crc32cDigest, master_key, pack_entry
from scriba.errors import NoSuchKeyError, Status
from scriba.meta.connect import connect
from scriba.meta.records import BookieMode, BookieRegistration, bookie_key
from scriba.proto import scriba_pb2 as pb
from scriba.proto import scriba_pb2_grpc as pb_grpc
from scriba.testing.cluster import BookieCluster
from scriba.testing.waiting import eventually

DIGEST = Crc32cDigest()
KEY = master_key(b"disk")


def entry(lid: int, eid: int, size: int) -> bytes:
    payload = (f"{lid}/{eid}/".encode() * (size // 6 + 1))[:size]
    return pack_entry(DIGEST, lid, eid, eid - 1, 0, payload)


def channel(bookie: BookieProcess) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(bookie.address, options=[
        ("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)])


async def registration(uri: str, bookie_id: str) -> BookieRegistration | None:
    store = await connect(uri)
    try:
        return BookieRegistration.from_bytes((await store.get(bookie_key(bookie_id))).value)
    except NoSuchKeyError:
        return None
    finally:
        await store.close()


async def stream_adds(
    stub: pb_grpc.BookieStub, lid: int, size: int, statuses: list[tuple[int, int]], stop: asyncio.Event,
    *, batch: int = 16, window: int = 4,
) -> None:
    """One pipelined stream; ``statuses`` gets (entry_id, status) in the order answers arrive."""
    slots = asyncio.Semaphore(window)

    async def requests() -> AsyncIterator[pb.AddBatch]:
        eid = 0
        while not stop.is_set():
            await slots.acquire()
            yield pb.AddBatch(adds=[pb.AddRequest(ledger_id=lid, entry_id=e, master_key=KEY, entry=entry(lid, e, size))
                                    for e in range(eid, eid + batch)])
            eid += batch

    try:
        async for resp in stub.AddStream(requests(), timeout=60):
            statuses.extend((r.entry_id, r.status) for r in resp.responses)
            slots.release()
    except grpc.aio.AioRpcError:
        pass


@pytest.mark.parametrize("fault", [{"fsync_eio": True}, {"eio_on_write": True}, {"fsync_eio": True, "faults_max": 1}],
                         ids=["fsync_eio", "eio_on_write", "fsync_eio_once"])
async def test_fsync_eio_stops_every_ack_and_turns_the_bookie_read_only(
    bookie_cluster: BookieCluster, tmp_path: Path, fault: dict[str, object]
) -> None:
    control = tmp_path / "faults.json"
    control.write_text("{}")
    (bk,) = bookie_cluster.start_bookies(1, env={"SCRIBA_DISK_FAULTS": f"@{control}"},
                                         extra_args=["--session-timeout-s", "2"])
    statuses: list[tuple[int, int]] = []
    stop = asyncio.Event()
    async with channel(bk) as ch:
        stub = pb_grpc.BookieStub(ch)
        load = asyncio.ensure_future(stream_adds(stub, 1, 512, statuses, stop))

        def acked_2000() -> bool:
            assert not load.done(), "load ended early"
            return sum(1 for _, s in statuses if s == Status.OK) >= 2000

        await eventually(acked_2000, 60, what="2000 adds acknowledged before the fault", interval_s=0.02)
        control.write_text(json.dumps({**fault, "path_contains": "journal"}))
        await eventually(lambda: any(s != Status.OK for _, s in statuses), 10,
                         what="an add failed after fsync started to fail")

        async def read_only_or_gone() -> bool:
            info = await stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=5) if bk.running else None
            return info is None or info.state == pb.BOOKIE_READ_ONLY

        # read-only (or gone) within 1 s of the first failed add
        await eventually(read_only_or_gone, 1.0, what="the bookie read-only (or gone) 1 s after the fsync error",
                         interval_s=0.02)
        # more answers after the switch, so that a late acknowledgement would show below
        answered = len(statuses)
        await eventually(lambda: len(statuses) >= answered + 32 or load.done(), 30,
                         what="more adds answered after the read-only switch (or the load ended)")
        stop.set()
        await asyncio.wait_for(load, 30)
        first_bad = next(i for i, (_, s) in enumerate(statuses) if s != Status.OK)
        late_oks = [e for e, s in statuses[first_bad:] if s == Status.OK]
        assert not late_oks, f"acknowledged after the failed fsync: {late_oks[:10]}"
        assert {s for _, s in statuses[first_bad:]} <= {Status.INTERNAL, Status.READ_ONLY}
        acked = [e for e, s in statuses if s == Status.OK]
        if bk.running:
            reg = await registration(bookie_cluster.metadata_uri, bk.bookie_id)
            assert reg is not None and reg.mode is BookieMode.READ_ONLY
            # reads keep working while read-only
            got = await stub.ReadEntry(pb.ReadEntryRequest(master_key=KEY, ledger_id=1, entry_id=acked[-1]), timeout=10)
            assert got.status == Status.OK and got.entry == entry(1, acked[-1], 512)
            # a fence cannot be made durable any more: it must not be acknowledged either
            fence = await stub.ReadLac(pb.ReadLacRequest(ledger_id=1, flags=pb.FENCE, master_key=KEY), timeout=10)
            assert fence.status != Status.OK and fence.message
    bk.kill()
    # the mode change kept the record ephemeral: it goes with the dead process's session

    async def deregistered() -> bool:
        return await registration(bookie_cluster.metadata_uri, bk.bookie_id) is None

    await eventually(deregistered, 10, what="the killed bookie's registration gone", interval_s=0.1)
    control.write_text("{}")
    bk.start()
    async with channel(bk) as ch:
        stub = pb_grpc.BookieStub(ch)
        stored: dict[int, bytes] = {}
        async for chunk in stub.ReadRange(pb.ReadRangeRequest(master_key=KEY, ledger_id=1, first_entry_id=0, last_entry_id=max(acked)), timeout=30):
            stored.update((chunk.first_entry_id + i, e) for i, e in enumerate(chunk.entries))
        lost = [e for e in acked if stored.get(e) != entry(1, e, 512)]
        assert not lost, f"{len(lost)} acked entries lost after restart, e.g. {lost[:5]}"


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    from scriba.testing.tmpfs import size_capped_tmpfs, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with size_capped_tmpfs(24 * 1024 * 1024, parent=tmp_path) as mnt:
        yield mnt


async def test_disk_full_makes_the_bookie_read_only_reads_work_nothing_lost(
    bookie_cluster: BookieCluster, tmpfs: Path
) -> None:
    bk = BookieProcess(tmpfs / "bookie", bookie_cluster.metadata_uri, bookie_id="full-0", extra_args=[
        "--session-timeout-s", "2",
        "--storage-option", "disk_check_interval_s=0.2",
        "--storage-option", "journal_file_bytes_max=4194304",
        "--storage-option", "entry_log_file_bytes_max=4194304",
        "--storage-option", "index_map_size_bytes=8388608",
        "--storage-option", "checkpoint_interval_s=0.5",
    ])
    bookie_cluster.bookies.append(bk)  # stopped by the fixture, and described on failure
    bk.start()
    statuses: list[tuple[int, int]] = []
    stop = asyncio.Event()
    async with channel(bk) as ch:
        stub = pb_grpc.BookieStub(ch)
        load = asyncio.ensure_future(stream_adds(stub, 2, 4096, statuses, stop, batch=8, window=2))

        def refused_read_only() -> bool:
            assert not load.done(), "load ended early"
            return any(s == Status.READ_ONLY for _, s in statuses)

        await eventually(refused_read_only, 60, what="an add refused READ_ONLY on the full disk", interval_s=0.05)
        stop.set()
        await asyncio.wait_for(load, 30)
        acked = [e for e, s in statuses if s == Status.OK]
        assert len(acked) > 100
        assert {s for _, s in statuses} <= {Status.OK, Status.READ_ONLY}, set(statuses)
        assert bk.running
        info = await stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=5)
        assert info.state == pb.BOOKIE_READ_ONLY

        async def registered_read_only() -> bool:
            reg = await registration(bookie_cluster.metadata_uri, bk.bookie_id)
            return reg is not None and reg.mode is BookieMode.READ_ONLY

        await eventually(registered_read_only, 10, what="the registration in READ_ONLY mode", interval_s=0.1)
        for e in acked:
            got = await stub.ReadEntry(pb.ReadEntryRequest(master_key=KEY, ledger_id=2, entry_id=e), timeout=10)
            assert got.status == Status.OK and got.entry == entry(2, e, 4096), f"acked entry {e}: {got.status}"
