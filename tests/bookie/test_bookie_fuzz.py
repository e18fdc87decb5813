"""Fuzz every RPC of the bookie with generated messages: no crash, every reply carries a status.

One in-process bookie (memory:// metadata, in-memory storage) on a private event loop;
Hypothesis drives ~300 cases in CI and many more with SCRIBA_SOAK=1.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scriba.bookie.config import BookieConfig
from scriba.bookie.memory_storage import InMemoryLedgerStorage
from scriba.bookie.server import Bookie
from scriba.bookie.storage_api import LedgerStorage, StorageConfig
from scriba.entry import Crc32cDigest, master_key, pack_entry
from scriba.proto import scriba_pb2 as pb
from scriba.proto import scriba_pb2_grpc as pb_grpc

SOAK = os.environ.get("SCRIBA_SOAK") == "1"
EXAMPLES = 5000 if SOAK else 300
WIRE_STATUSES = set(pb.Status.values())
KEYS = [master_key(b"a"), master_key(b"b"), b"", b"\x00"]

u64 = st.one_of(st.integers(0, 5), st.integers(0, (1 << 64) - 1))
i64 = st.one_of(st.integers(-3, 10), st.integers(-(1 << 63), (1 << 63) - 1))
u32 = st.one_of(st.integers(0, 3), st.integers(0, (1 << 32) - 1))
keys = st.one_of(st.sampled_from(KEYS), st.binary(max_size=40))


@st.composite
def packed(draw: st.DrawFn) -> bytes:
    lid = draw(st.integers(0, 5))
    eid = draw(st.integers(0, 10))
    if draw(st.booleans()):
        return pack_entry(Crc32cDigest(), lid, eid, draw(i64), draw(st.integers(0, 1 << 40)), draw(st.binary(max_size=200)))
    return draw(st.binary(max_size=300))


@st.composite
def add_request(draw: st.DrawFn) -> pb.AddRequest:
    data = draw(packed())
    if len(data) >= 16 and draw(st.booleans()):  # ids that match the header
        lid = int.from_bytes(data[:8], "big")
        eid = int.from_bytes(data[8:16], "big", signed=True)
    else:
        lid, eid = draw(u64), draw(i64)
    return pb.AddRequest(ledger_id=lid, entry_id=eid, master_key=draw(keys), flags=draw(u32), entry=data)


@st.composite
def add_run(draw: st.DrawFn) -> pb.AddRun:
    """A run: well-formed entries of one ledger most of the time, else any ids, sizes and bytes."""
    datas = draw(st.lists(packed(), max_size=6))
    lid = draw(u64)
    eids = [draw(i64) for _ in datas]
    if datas and draw(st.booleans()):  # ids from the headers
        lid = int.from_bytes(datas[0][:8].ljust(8, b"\0"), "big")
        eids = [int.from_bytes(d[8:16].ljust(8, b"\0"), "big", signed=True) for d in datas]
    sizes = [len(d) for d in datas]
    if draw(st.booleans()):
        sizes = draw(st.lists(u32, max_size=7))
    return pb.AddRun(ledger_id=lid, master_key=draw(keys), flags=draw(u32), entry_ids=eids, sizes=sizes,
                     entries=b"".join(datas))


requests = st.one_of(
    st.builds(lambda adds: ("add", pb.AddBatch(adds=adds)), st.lists(add_request(), max_size=8)),
    st.builds(lambda adds, runs: ("add", pb.AddBatch(adds=adds, runs=runs)),
              st.lists(add_request(), max_size=2), st.lists(add_run(), min_size=1, max_size=3)),
    st.builds(lambda lid, e, f, k: ("read", pb.ReadEntryRequest(ledger_id=lid, entry_id=e, flags=f, master_key=k)),
              u64, i64, u32, keys),
    st.builds(lambda lid, a, b, n, m, f, k, p: ("range", pb.ReadRangeRequest(
        ledger_id=lid, first_entry_id=a, last_entry_id=b, max_entries=n, max_bytes=m, flags=f, master_key=k,
        packed=p)),
        u64, i64, i64, u32, st.one_of(st.integers(0, 2000), u64), u32, keys, st.booleans()),
    st.builds(lambda lid, f, k, lp, p, t, pg: ("lac", pb.ReadLacRequest(
        ledger_id=lid, flags=f, master_key=k, long_poll=lp, previous_lac=p, timeout_ms=t, piggyback_entry=pg)),
        u64, u32, keys, st.booleans(), i64, u32, st.booleans()),
    st.builds(lambda lid, lac, k: ("write_lac", pb.WriteLacRequest(ledger_id=lid, lac=lac, master_key=k)), u64, i64, keys),
    st.just(("info", pb.BookieInfoRequest())),
)


async def _call(stub: pb_grpc.BookieStub, kind: str, msg: object) -> list[object]:
    if kind == "add":
        call = stub.AddStream(iter([msg, msg]), timeout=10)
        out: list[object] = []
        async for resp in call:
            out += resp.responses
            for answer in resp.runs:  # one reply per add it answers
                out += [answer] * len(answer.entry_ids)
        return out
    if kind == "range":
        return [c async for c in stub.ReadRange(msg, timeout=10)]
    method = {"read": stub.ReadEntry, "lac": stub.ReadLac, "write_lac": stub.WriteLac, "info": stub.GetBookieInfo}[kind]
    return [await method(msg, timeout=10)]


@pytest.mark.parametrize("storage_kind", ["memory", "disk"])
def test_every_rpc_answers_generated_requests_with_a_status(tmp_path: Path, storage_kind: str) -> None:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # grpc.aio looks the loop up through the policy

    async def factory(config: StorageConfig) -> LedgerStorage:
        if storage_kind == "disk":
            from scriba.bookie.storage import open_storage

            return await open_storage(config)
        return InMemoryLedgerStorage(entry_size_max=4096)

    config = BookieConfig(
        metadata_uri=f"memory://fuzz-{uuid.uuid4().hex[:8]}", data_dir=tmp_path / "data", listen_port=0,
        bookie_id="fuzz", entry_size_max=4096, long_poll_timeout_ms_max=20, read_range_bytes_max=8192,
        read_range_entries_max=16,
    )
    bookie = Bookie(config, storage_factory=factory)
    loop.run_until_complete(bookie.start())

    async def open_channel() -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(bookie.address)

    channel = loop.run_until_complete(open_channel())
    stub = pb_grpc.BookieStub(channel)
    seen: set[str] = set()

    @settings(max_examples=EXAMPLES if storage_kind == "memory" else EXAMPLES // 2, deadline=None, suppress_health_check=list(HealthCheck))
    @given(requests)
    def check(item: tuple[str, object]) -> None:
        kind, msg = item
        replies = loop.run_until_complete(_call(stub, kind, msg))
        seen.add(kind)
        if kind == "add":
            runs = msg.runs  # type: ignore[attr-defined]
            assert len(replies) == 2 * (len(msg.adds) + sum(len(r.entry_ids) for r in runs))  # type: ignore[attr-defined]
        else:
            assert replies, f"{kind}: no reply"
        if kind == "range":
            for chunk in replies:  # a packed chunk adds up, and carries no `entries`
                assert sum(chunk.sizes) == len(chunk.packed_entries)  # type: ignore[attr-defined]
                assert not (chunk.sizes and chunk.entries)  # type: ignore[attr-defined]
                assert msg.packed or not chunk.sizes  # type: ignore[attr-defined]
        for reply in replies:
            assert reply.status in WIRE_STATUSES, f"{kind}: status {reply.status}"  # type: ignore[attr-defined]
            if reply.status != pb.OK:  # type: ignore[attr-defined]
                assert reply.message, f"{kind}: status {reply.status} without a message"  # type: ignore[attr-defined]

    try:
        check()
        # still serving after the whole run
        info = loop.run_until_complete(stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=5))
        assert info.status == pb.OK and info.state == pb.BOOKIE_READ_WRITE
        assert len(seen) >= 4, f"the generator reached only {sorted(seen)}"
    finally:
        loop.run_until_complete(channel.close())
        loop.run_until_complete(bookie.stop())
        loop.close()
        asyncio.set_event_loop(None)


@st.composite
def range_chunk(draw: st.DrawFn) -> pb.ReadRangeResponse:
    """A ReadRange chunk as any bookie might send it: packed (adding up or not), in
    entries, both or neither, at the expected first entry or elsewhere."""
    datas = draw(st.lists(packed(), max_size=5))
    sizes = [len(d) for d in datas]
    if draw(st.integers(0, 3)) == 0:
        sizes = draw(st.lists(st.integers(0, 400), max_size=6))
    form = draw(st.sampled_from(["packed", "entries", "both", "none"]))
    return pb.ReadRangeResponse(
        status=draw(st.sampled_from([pb.OK, pb.OK, pb.NO_SUCH_ENTRY, pb.CORRUPT])),
        first_entry_id=draw(st.sampled_from([2, 2, 2, 0, 3])),
        sizes=sizes if form in ("packed", "both") else [],
        packed_entries=b"".join(datas) if form in ("packed", "both") else b"",
        entries=datas if form in ("entries", "both") else [],
    )


@settings(max_examples=EXAMPLES * 3, deadline=None, suppress_health_check=list(HealthCheck))
@given(range_chunk(), st.integers(1, 6))
def test_the_client_reads_any_range_chunk_or_refuses_it(chunk: pb.ReadRangeResponse, count_max: int) -> None:
    """The reader's side of the packed answer: a chunk becomes a run of at most
    ``count_max`` entries whose slices are exactly the entries sent, or InternalError;
    the read core then delivers only entries whose digest and header check out."""
    from scriba.client.grpc_reads import _chunk_run
    from scriba.client.read_core import ReadCore
    from scriba.errors import InternalError
    from scriba.ids import BookieId, EntryId, LedgerId
    from scriba.meta.records import LedgerMetadata, LedgerState

    wire = pb.ReadRangeResponse.FromString(chunk.SerializeToString())
    try:
        run = _chunk_run(wire, BookieId("b"), 3, 2, count_max)
    except InternalError:
        assert wire.first_entry_id != 2 or sum(wire.sizes) != len(wire.packed_entries)
        return
    if not (wire.sizes or wire.packed_entries or wire.entries):
        assert run is None
        return
    assert run is not None and run.first_entry_id == 2
    sent = list(wire.entries) if not (wire.sizes or wire.packed_entries) else [
        wire.packed_entries[sum(wire.sizes[:i]) : sum(wire.sizes[: i + 1])] for i in range(len(wire.sizes))
    ]
    assert run.entries() == sent[:count_max]
    a, b = BookieId("a"), BookieId("b")
    md = LedgerMetadata(
        ledger_id=LedgerId(3), ensemble_size=2, write_quorum_size=2, ack_quorum_size=1,
        ensembles=((EntryId(0), (a, b)),), state=LedgerState.CLOSED, last_entry_id=EntryId(9), length=0,
    )
    core = ReadCore(md, 2, 9, digest=Crc32cDigest(), read_order=lambda ws: list(ws))
    core.start()
    for effect in core.on_run(b, run):
        for e in getattr(effect, "entries", ()):
            assert pack_entry(Crc32cDigest(), 3, e.entry_id, e.last_add_confirmed, e.length, e.payload) == sent[
                e.entry_id - 2
            ]
