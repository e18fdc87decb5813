"""The bookie's gRPC service in-process (memory:// metadata, in-memory storage twin)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from scriba.bookie.config import BookieConfig
from scriba.bookie.memory_storage import InMemoryLedgerStorage
from scriba.bookie.server import Bookie
from scriba.bookie.storage_api import LedgerStorage, StorageConfig
from scriba.entry import Crc32cDigest, master_key, pack_entry
from scriba.errors import Status
from scriba.meta.records import BookieMode, BookieRegistration, bookie_key
from scriba.proto import scriba_pb2 as pb
from scriba.proto import scriba_pb2_grpc as pb_grpc
from scriba.testing.waiting import eventually


class InProcBookie:
    def __init__(self, bookie: Bookie, channel: grpc.aio.Channel) -> None:
        self.bookie = bookie
        self.channel = channel
        self.stub = pb_grpc.BookieStub(channel)

    @property
    def storage(self) -> Any:
        return self.bookie.storage


MakeBookie = Callable[..., Awaitable[InProcBookie]]


@pytest.fixture
async def make_bookie(tmp_path: Path) -> AsyncIterator[MakeBookie]:
    started: list[InProcBookie] = []
    space = f"bk-{uuid.uuid4().hex[:8]}"

    async def make(
        *,
        storage: LedgerStorage | None = None,
        name: str = "b0",
        uri: str | None = None,
        **overrides: Any,
    ) -> InProcBookie:
        twin = storage if storage is not None else InMemoryLedgerStorage()

        async def factory(config: StorageConfig) -> LedgerStorage:
            return twin

        config = BookieConfig(
            metadata_uri=uri or f"memory://{space}",
            data_dir=tmp_path / name / "data",
            listen_host="127.0.0.1",
            listen_port=0,
            bookie_id=overrides.pop("bookie_id", name),
            http_host=overrides.pop("http_host", "127.0.0.1"),
            **overrides,
        )
        bookie = Bookie(config, storage_factory=factory)
        await bookie.start()
        channel = grpc.aio.insecure_channel(
            bookie.address,
            options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)],
        )
        handle = InProcBookie(bookie, channel)
        started.append(handle)
        return handle

    yield make
    for handle in started:
        await handle.channel.close()
        await handle.bookie.stop()


DIGEST = Crc32cDigest()
KEY = master_key(b"pw")


def entry(lid: int, eid: int, payload: bytes = b"x" * 100, lac: int = -1) -> bytes:
    return pack_entry(DIGEST, lid, eid, lac if lac >= 0 else eid - 1, 100 * (eid + 1), payload)


def add(lid: int, eid: int, *, key: bytes = KEY, data: bytes | None = None, recovery: bool = False) -> pb.AddRequest:
    return pb.AddRequest(
        ledger_id=lid,
        entry_id=eid,
        master_key=key,
        flags=pb.RECOVERY_ADD if recovery else 0,
        entry=entry(lid, eid) if data is None else data,
    )


async def send(stub: object, batches: Sequence[Sequence[pb.AddRequest]]) -> list[pb.AddResponse]:
    call = stub.AddStream(iter([pb.AddBatch(adds=list(b)) for b in batches]))  # type: ignore[attr-defined]
    out: list[pb.AddResponse] = []
    async for resp in call:
        out.extend(resp.responses)
    return out


async def test_adds_are_read_back_entry_range_and_lac(make_bookie) -> None:
    bk = await make_bookie()
    responses = await send(bk.stub, [[add(1, i) for i in range(64)], [add(1, i) for i in range(64, 100)]])
    assert len(responses) == 100 and all(r.status == Status.OK for r in responses)
    one = await bk.stub.ReadEntry(pb.ReadEntryRequest(master_key=KEY, ledger_id=1, entry_id=7))
    assert one.status == Status.OK and one.entry == entry(1, 7)
    last = await bk.stub.ReadEntry(pb.ReadEntryRequest(master_key=KEY, ledger_id=1, entry_id=-1))
    assert last.status == Status.OK and last.entry_id == 99 and last.entry == entry(1, 99)
    chunks = [c async for c in bk.stub.ReadRange(pb.ReadRangeRequest(master_key=KEY, ledger_id=1, first_entry_id=0, last_entry_id=120, max_entries=30))]
    got = [e for c in chunks if c.status == Status.OK for e in c.entries]
    assert got == [entry(1, i) for i in range(100)]
    assert all(len(c.entries) <= 30 for c in chunks)
    assert chunks[-1].status == Status.NO_SUCH_ENTRY and chunks[-1].first_entry_id == 100
    full = [c async for c in bk.stub.ReadRange(pb.ReadRangeRequest(master_key=KEY, ledger_id=1, first_entry_id=10, last_entry_id=19))]
    assert [c.status for c in full] == [Status.OK] and list(full[0].entries) == [entry(1, i) for i in range(10, 20)]
    lac = await bk.stub.ReadLac(pb.ReadLacRequest(master_key=KEY, ledger_id=1))
    assert (lac.status, lac.lac, lac.last_entry_id, lac.fenced) == (Status.OK, 98, 99, False)
    missing = await bk.stub.ReadEntry(pb.ReadEntryRequest(master_key=KEY, ledger_id=2, entry_id=0))
    assert missing.status == Status.NO_SUCH_LEDGER and missing.message
    gap = await bk.stub.ReadEntry(pb.ReadEntryRequest(master_key=KEY, ledger_id=1, entry_id=500))
    assert gap.status == Status.NO_SUCH_ENTRY


async def test_fence_blocks_normal_adds_accepts_recovery_and_checks_the_key(make_bookie) -> None:
    bk = await make_bookie()
    assert all(r.status == Status.OK for r in await send(bk.stub, [[add(5, i) for i in range(3)]]))
    wrong = await bk.stub.ReadLac(pb.ReadLacRequest(ledger_id=5, flags=pb.FENCE, master_key=b"nope"))
    assert wrong.status == Status.UNAUTHORIZED
    fenced = await bk.stub.ReadLac(pb.ReadLacRequest(ledger_id=5, flags=pb.FENCE, master_key=KEY))
    assert fenced.status == Status.OK and fenced.fenced and fenced.last_entry_id == 2
    assert fenced.last_entry == entry(5, 2)
    after = await send(bk.stub, [[add(5, 3), add(5, 4, recovery=True)]])
    assert [r.status for r in after] == [Status.FENCED, Status.OK]
    # a bookie that never saw the ledger can still be fenced
    empty = await bk.stub.ReadLac(pb.ReadLacRequest(ledger_id=6, flags=pb.FENCE, master_key=KEY))
    assert empty.status == Status.OK and empty.fenced and empty.last_entry_id == -1
    assert [r.status for r in await send(bk.stub, [[add(6, 0)]])] == [Status.FENCED]
    no_key = await bk.stub.ReadLac(pb.ReadLacRequest(ledger_id=7, flags=pb.FENCE))
    assert no_key.status == Status.BAD_REQUEST


async def test_entry_and_range_reads_with_the_fence_flag_fence(make_bookie) -> None:
    """Recovery reads carry the fence flag: the read itself must fence the ledger."""
    bk = await make_bookie()
    assert all(r.status == Status.OK for r in await send(bk.stub, [[add(11, i) for i in range(2)]]))
    assert all(r.status == Status.OK for r in await send(bk.stub, [[add(12, i) for i in range(2)]]))
    one = await bk.stub.ReadEntry(pb.ReadEntryRequest(ledger_id=11, entry_id=1, flags=pb.FENCE,
                                                      master_key=KEY))
    assert one.status == Status.OK and one.entry == entry(11, 1)
    assert [r.status for r in await send(bk.stub, [[add(11, 2)]])] == [Status.FENCED]
    answers = [r async for r in bk.stub.ReadRange(pb.ReadRangeRequest(
        ledger_id=12, first_entry_id=0, last_entry_id=1, flags=pb.FENCE, master_key=KEY))]
    assert answers and all(a.status == Status.OK for a in answers)
    assert [r.status for r in await send(bk.stub, [[add(12, 2)]])] == [Status.FENCED]


async def test_master_key_mismatch_is_unauthorized(make_bookie) -> None:
    bk = await make_bookie()
    out = await send(bk.stub, [[add(9, 0)], [add(9, 1, key=master_key(b"other"))]])
    assert sorted(r.status for r in out) == [Status.OK, Status.UNAUTHORIZED]
    wl = await bk.stub.WriteLac(pb.WriteLacRequest(ledger_id=9, lac=0, master_key=b"bad"))
    assert wl.status == Status.UNAUTHORIZED


async def test_malformed_and_oversized_adds_get_bad_request_and_the_server_keeps_serving(make_bookie) -> None:
    bk = await make_bookie(entry_size_max=4096, read_range_bytes_max=8192)
    big = pack_entry(DIGEST, 3, 1, 0, 0, b"y" * 5000)
    batch = [
        add(3, 0),
        add(3, 1, data=big),  # too large
        add(3, 2, data=entry(3, 99)),  # header names another entry
        add(3, 3, data=b"short"),
        add(3, 4, key=b""),  # no master key
        add(4, 0, data=entry(5, 0)),  # header names another ledger
        add(3, 5),
    ]
    out = await send(bk.stub, [batch])
    assert [r.status for r in out] == [
        Status.OK, Status.BAD_REQUEST, Status.BAD_REQUEST, Status.BAD_REQUEST,
        Status.BAD_REQUEST, Status.BAD_REQUEST, Status.OK,
    ]
    assert [(r.ledger_id, r.entry_id) for r in out] == [(a.ledger_id, a.entry_id) for a in batch]
    assert all(r.message for r in out if r.status != Status.OK)
    bad_range = [c async for c in bk.stub.ReadRange(pb.ReadRangeRequest(master_key=KEY, ledger_id=3, first_entry_id=5, last_entry_id=1))]
    assert [c.status for c in bad_range] == [Status.BAD_REQUEST]
    bad_read = await bk.stub.ReadEntry(pb.ReadEntryRequest(master_key=KEY, ledger_id=3, entry_id=-7))
    assert bad_read.status == Status.BAD_REQUEST
    huge_id = await bk.stub.ReadEntry(pb.ReadEntryRequest(master_key=KEY, ledger_id=(1 << 64) - 1, entry_id=0))
    assert huge_id.status == Status.BAD_REQUEST
    still = await bk.stub.ReadEntry(pb.ReadEntryRequest(master_key=KEY, ledger_id=3, entry_id=5))
    assert still.status == Status.OK and still.entry == entry(3, 5)


class SlowStorage(InMemoryLedgerStorage):
    """Holds every add batch until released (to fill the in-flight window)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.batches = 0

    async def add_columns(self, adds):  # type: ignore[no-untyped-def]
        self.batches += 1
        await self.gate.wait()
        return await super().add_columns(adds)


async def test_in_flight_bytes_beyond_the_bound_get_too_many_requests(make_bookie) -> None:
    storage = SlowStorage()
    bk = await make_bookie(storage=storage, inflight_bytes_per_connection_max=5 * 1024 * 1024,
                           entry_size_max=1024 * 1024, read_range_bytes_max=8 << 20)
    payload = b"z" * (1024 * 1024 - 100)
    queue: asyncio.Queue[pb.AddBatch | None] = asyncio.Queue()

    async def requests():  # type: ignore[no-untyped-def]
        while (item := await queue.get()) is not None:
            yield item

    call = bk.stub.AddStream(requests())
    for i in range(8):
        queue.put_nowait(pb.AddBatch(adds=[add(11, i, data=pack_entry(DIGEST, 11, i, -1, 0, payload))]))
    first = await asyncio.wait_for(call.read(), 10)
    # rejected batches are answered at once, the accepted ones wait for storage
    assert [r.status for r in first.responses] == [Status.TOO_MANY_REQUESTS]
    storage.gate.set()
    queue.put_nowait(None)
    statuses = [r.status for r in first.responses]
    while (resp := await asyncio.wait_for(call.read(), 10)) is not grpc.aio.EOF:
        statuses.extend(r.status for r in resp.responses)
    ok, rejected = statuses.count(Status.OK), statuses.count(Status.TOO_MANY_REQUESTS)
    assert ok + rejected == 8 and 4 <= ok < 8 and rejected >= 1
    assert storage.batches == ok  # a rejected batch never reaches storage


async def test_pipelined_batches_are_handed_to_storage_before_earlier_ones_finish(make_bookie) -> None:
    storage = SlowStorage()
    bk = await make_bookie(storage=storage)
    call = bk.stub.AddStream(iter([pb.AddBatch(adds=[add(12, i)]) for i in range(5)]))
    await eventually(lambda: storage.batches >= 5, 5, what="five batches reached storage while none finished")
    storage.gate.set()
    got = [r.status async for resp in call for r in resp.responses]
    assert got == [Status.OK] * 5


async def test_long_poll_returns_when_lac_advances_with_the_piggybacked_entry(make_bookie) -> None:
    bk = await make_bookie()
    await send(bk.stub, [[add(20, 0), add(20, 1)]])  # lac 0
    poll = asyncio.ensure_future(bk.stub.ReadLac(pb.ReadLacRequest(master_key=KEY,
        ledger_id=20, long_poll=True, previous_lac=0, timeout_ms=5000, piggyback_entry=True)))
    await asyncio.sleep(0.05)  # negative check: the long poll does not answer while the LAC stays
    assert not poll.done()
    await send(bk.stub, [[add(20, 2)]])  # carries lac 1
    resp = await asyncio.wait_for(poll, 5)
    assert resp.status == Status.OK and resp.lac == 1 and resp.piggybacked_entry == entry(20, 1)
    timed = await bk.stub.ReadLac(pb.ReadLacRequest(master_key=KEY, ledger_id=20, long_poll=True, previous_lac=5, timeout_ms=50))
    assert timed.status == Status.OK and timed.lac == 1


async def test_long_poll_carries_the_newly_confirmed_entries_and_none_beyond_the_lac(make_bookie) -> None:
    """``piggyback_entries_max``: the answer brings previous_lac + 1 .. LAC (at most the
    max); entries stored but not confirmed stay out, whatever the max allows."""
    bk = await make_bookie()
    await send(bk.stub, [[add(22, i) for i in range(6)]])  # stored 0..5; entry 5 carries lac 4

    def poll(previous: int, entries_max: int) -> Any:
        return bk.stub.ReadLac(pb.ReadLacRequest(master_key=KEY,
            ledger_id=22, long_poll=True, previous_lac=previous, timeout_ms=5000, piggyback_entry=True,
            piggyback_entries_max=entries_max))

    resp = await asyncio.wait_for(poll(0, 64), 5)
    assert resp.status == Status.OK and resp.lac == 4 and resp.last_entry_id == 5
    assert list(resp.piggybacked_entries) == [entry(22, i) for i in (1, 2, 3, 4)]  # not 5: unconfirmed
    assert resp.piggybacked_entry == b""
    capped = await asyncio.wait_for(poll(1, 2), 5)
    assert list(capped.piggybacked_entries) == [entry(22, 2), entry(22, 3)]
    one = await asyncio.wait_for(poll(3, 0), 5)  # an older client: one entry, the old field
    assert one.piggybacked_entry == entry(22, 4) and not one.piggybacked_entries
    # The writer's explicit LAC confirms 5: the waiting poll answers with it.
    waiting = asyncio.ensure_future(poll(4, 64))
    await asyncio.sleep(0.05)  # negative check: the poll does not answer before the explicit LAC
    assert not waiting.done()
    assert (await bk.stub.WriteLac(pb.WriteLacRequest(ledger_id=22, lac=5, master_key=KEY))).status == Status.OK
    resp = await asyncio.wait_for(waiting, 5)
    assert resp.lac == 5 and list(resp.piggybacked_entries) == [entry(22, 5)]


async def test_a_hint_only_lac_wakes_long_polls_and_checks_the_key(make_bookie) -> None:
    bk = await make_bookie()
    await send(bk.stub, [[add(23, 0), add(23, 1)]])  # lac 0
    waiting = asyncio.ensure_future(bk.stub.ReadLac(pb.ReadLacRequest(master_key=KEY,
        ledger_id=23, long_poll=True, previous_lac=0, timeout_ms=5000, piggyback_entries_max=8)))
    hint = pb.WriteLacRequest(ledger_id=23, lac=1, master_key=KEY, hint_only=True)
    assert (await bk.stub.WriteLac(hint)).status == Status.OK
    resp = await asyncio.wait_for(waiting, 5)
    assert resp.lac == 1 and list(resp.piggybacked_entries) == [entry(23, 1)]
    wrong = pb.WriteLacRequest(ledger_id=23, lac=1, master_key=master_key(b"other"), hint_only=True)
    assert (await bk.stub.WriteLac(wrong)).status == Status.UNAUTHORIZED
    unknown = pb.WriteLacRequest(ledger_id=24, lac=3, master_key=KEY, hint_only=True)
    assert (await bk.stub.WriteLac(unknown)).status == Status.NO_SUCH_LEDGER  # a hint creates nothing
    assert (await bk.stub.ReadLac(pb.ReadLacRequest(master_key=KEY, ledger_id=24))).status == Status.NO_SUCH_LEDGER


async def test_write_lac_and_bookie_info(make_bookie) -> None:
    bk = await make_bookie()
    await send(bk.stub, [[add(21, 0)]])
    assert (await bk.stub.WriteLac(pb.WriteLacRequest(ledger_id=21, lac=0, master_key=KEY))).status == Status.OK
    assert (await bk.stub.ReadLac(pb.ReadLacRequest(master_key=KEY, ledger_id=21))).lac == 0
    info = await bk.stub.GetBookieInfo(pb.BookieInfoRequest())
    assert info.status == Status.OK and info.bookie_id == "b0" and info.state == pb.BOOKIE_READ_WRITE
    assert info.total_bytes > 0


async def test_registration_carries_location_and_follows_read_only_and_shutdown(make_bookie) -> None:
    bk = await make_bookie(region="r1", zone="z1", rack="k1")
    store = bk.bookie.store
    rec = BookieRegistration.from_bytes((await store.get(bookie_key("b0"))).value)
    assert (rec.address, rec.region, rec.zone, rec.rack, rec.mode) == (bk.bookie.address, "r1", "z1", "k1", BookieMode.READ_WRITE)
    assert rec.http_address == bk.bookie.http_address and rec.total_bytes > 0

    async def registered(mode: BookieMode) -> bool:
        return BookieRegistration.from_bytes((await store.get(bookie_key("b0"))).value).mode is mode

    bk.storage.set_disk_usage(10, 1 << 40, full=True)
    await eventually(lambda: registered(BookieMode.READ_ONLY), 10, what="the registration READ_ONLY on a full disk")
    info = await bk.stub.GetBookieInfo(pb.BookieInfoRequest())
    assert info.state == pb.BOOKIE_READ_ONLY and info.message
    assert [r.status for r in await send(bk.stub, [[add(30, 0)]])] == [Status.READ_ONLY]
    bk.storage.set_disk_usage(1 << 39, 1 << 40, full=False)
    await eventually(lambda: registered(BookieMode.READ_WRITE), 10, what="the registration READ_WRITE with room again")
    assert [r.status for r in await send(bk.stub, [[add(30, 0)]])] == [Status.OK]


async def test_session_lost_stops_adds_until_registered_again(make_bookie) -> None:
    from scriba.meta.connect import connect

    bk = await make_bookie()
    observer = await connect(bk.bookie.config.metadata_uri)
    try:
        seen: list[bool] = []
        bk.bookie.registration._on_change = lambda registered: (seen.append(registered), bk.bookie._on_registered(registered))  # type: ignore[method-assign]
        await bk.bookie.store.expire_session_for_test()  # type: ignore[attr-defined]
        assert not bk.bookie.state.accepting_adds  # LOST: adds refused at once
        assert [r.status for r in await send(bk.stub, [[add(40, 0)]])] in ([Status.READ_ONLY], [Status.OK])
        await eventually(lambda: bk.bookie.registration.registered, 10, what="the bookie registered again")
        assert seen[:2] == [False, True]
        assert (await observer.get(bookie_key("b0"))).value
        assert [r.status for r in await send(bk.stub, [[add(40, 1)]])] == [Status.OK]
    finally:
        await observer.close()


async def test_clean_stop_deregisters_and_answers_in_flight_adds(make_bookie) -> None:
    storage = SlowStorage()
    bk = await make_bookie(storage=storage)
    store_uri = bk.bookie.config.metadata_uri
    from scriba.meta.connect import connect

    observer = await connect(store_uri)
    try:
        call = bk.stub.AddStream(iter([pb.AddBatch(adds=[add(50, 0)])]))
        await eventually(lambda: storage.batches >= 1, 5, what="the add reached storage")
        stopping = asyncio.ensure_future(bk.bookie.stop())
        # deregistration comes first, while the in-flight add still holds the stop

        async def deregistered() -> bool:
            try:
                await observer.get(bookie_key("b0"))
            except KeyError:  # NoSuchKeyError
                return True
            return False

        await eventually(deregistered, 5, what="the registration removed while the add is in flight")
        assert not stopping.done(), "stop finished before the in-flight add was answered"
        storage.gate.set()
        got = [r.status async for resp in call for r in resp.responses]
        await asyncio.wait_for(stopping, 10)
        assert got == [Status.OK]
    finally:
        await observer.close()


async def test_http_health_and_metrics(make_bookie) -> None:
    bk = await make_bookie()
    await send(bk.stub, [[add(60, i) for i in range(10)]])

    async def get(path: str) -> tuple[int, bytes]:
        host, port = bk.bookie.http_address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), body

    code, body = await get("/health")
    assert code == 200 and b'"registered": true' in body
    code, body = await get("/metrics")
    assert code == 200 and b'scriba_bookie_adds_total{status="OK"} 10.0' in body
    assert (await get("/nope"))[0] == 404
    bk.bookie.state.shutting_down = True
    assert (await get("/health"))[0] == 503
    bk.bookie.state.shutting_down = False


async def test_registration_refreshes_disk_figures(make_bookie) -> None:
    bk = await make_bookie(registration_refresh_s=0.05)
    store = bk.bookie.store
    bk.storage.set_disk_usage(123 << 30, 1 << 40)

    async def refreshed() -> bool:
        return BookieRegistration.from_bytes((await store.get(bookie_key("b0"))).value).free_bytes == 123 << 30

    await eventually(refreshed, 10, what="the registration's free bytes refreshed")
    rec = BookieRegistration.from_bytes((await store.get(bookie_key("b0"))).value)
    assert (rec.free_bytes, rec.total_bytes, rec.mode) == (123 << 30, 1 << 40, BookieMode.READ_WRITE)
