"""Range reads through GrpcBookieTransport and the read driver, against in-process fake
bookies that answer in ``entries`` (as bookies that predate ``packed`` do) or with canned
chunks: runs from old bookies, malformed packed answers, short answers, and a bad copy
inside a run (R9: the reader takes that entry from another replica)."""

from __future__ import annotations

import uuid

import pytest
from transport_fake_bookie import FakeBookie, FakeBookieServer

from scriba.client.grpc_transport import GrpcBookieTransport
from scriba.client.reader import LedgerReader
from scriba.client.transport import TransportConfig
from scriba.entry import Crc32cDigest, pack_entry
from scriba.errors import CorruptEntryError, InternalError, NoSuchEntryError, NoSuchLedgerError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.connect import connect
from scriba.meta.records import LedgerMetadata, LedgerState
from scriba.proto import scriba_pb2 as pb
from scriba.proto.packed import encode_packed_chunk

KEY = b"k" * 32
DIGEST = Crc32cDigest()
B = BookieId("b1")
L = LedgerId(7)


def entry(entry_id: int, ledger_id: int = 7) -> bytes:
    return pack_entry(DIGEST, ledger_id, entry_id, entry_id - 1, 0, b"payload-%d" % entry_id)


def with_entries(fake: FakeBookie, count: int) -> FakeBookie:
    fake.keys[7] = KEY
    fake.entries.update({(7, e): entry(e) for e in range(count)})
    return fake


def transport_for(server: FakeBookieServer, **kw: object) -> GrpcBookieTransport:
    return GrpcBookieTransport(lambda b: server.address, TransportConfig(**kw))  # type: ignore[arg-type]


async def test_an_old_bookie_answers_in_entries_and_the_transport_reads_them_as_runs() -> None:
    async with FakeBookieServer(with_entries(FakeBookie(), 10)) as server:
        for packed in (True, False):
            t = transport_for(server, packed_reads=packed)
            try:
                runs = [r async for r in t.read_runs(B, L, EntryId(0), EntryId(20))]
                assert [r.first_entry_id for r in runs] == [0, 3, 6, 9]  # its chunks of 3, then the gap
                assert [e for r in runs for e in r.entries()] == [entry(e) for e in range(10)]
                assert server.servicer.range_requests[-1].packed is packed
                assert await t.read_range(B, L, EntryId(2), EntryId(8), max_entries=4) == [
                    entry(e) for e in range(2, 6)
                ]
                with pytest.raises(NoSuchEntryError):
                    await t.read_range(B, L, EntryId(10), EntryId(20))
                with pytest.raises(NoSuchLedgerError):
                    await t.read_range(B, LedgerId(8), EntryId(0), EntryId(20))
            finally:
                await t.close()


async def test_packed_chunks_short_answers_and_errors() -> None:
    async with FakeBookieServer() as server:
        fake = server.servicer
        t = transport_for(server)
        try:
            # two packed chunks, then an error: a short answer (the caller reads on)
            fake.range_chunks = [
                pb.ReadRangeResponse.FromString(encode_packed_chunk(0, [entry(0), entry(1)])),
                pb.ReadRangeResponse.FromString(encode_packed_chunk(2, [entry(2)])),
                pb.ReadRangeResponse(status=pb.CORRUPT, first_entry_id=3, message="bad"),
            ]
            runs = [r async for r in t.read_runs(B, L, EntryId(0), EntryId(9))]
            assert [(r.first_entry_id, r.entries()) for r in runs] == [(0, [entry(0), entry(1)]), (2, [entry(2)])]
            # the error alone is raised as its type
            fake.range_chunks = fake.range_chunks[2:]
            with pytest.raises(CorruptEntryError, match="bad"):
                await t.read_range(B, L, EntryId(3), EntryId(9))
            # more entries than asked are cut to what was asked
            fake.range_chunks = [pb.ReadRangeResponse.FromString(encode_packed_chunk(0, [entry(e) for e in range(6)]))]
            assert await t.read_range(B, L, EntryId(0), EntryId(9), max_entries=4) == [entry(e) for e in range(4)]
        finally:
            await t.close()


@pytest.mark.parametrize(
    "chunk",
    [
        pb.ReadRangeResponse(first_entry_id=0, sizes=[40, 40], packed_entries=b"x" * 79),  # sizes too large
        pb.ReadRangeResponse(first_entry_id=0, sizes=[40], packed_entries=b"x" * 41),  # bytes left over
        pb.ReadRangeResponse(first_entry_id=0, packed_entries=b"x" * 41),  # no sizes
        pb.ReadRangeResponse(first_entry_id=1, sizes=[41], packed_entries=b"x" * 41),  # starts elsewhere
        pb.ReadRangeResponse(first_entry_id=5, entries=[entry(5)]),  # in entries, starts elsewhere
    ],
)
async def test_a_malformed_range_answer_is_an_internal_error(chunk: pb.ReadRangeResponse) -> None:
    async with FakeBookieServer() as server:
        server.servicer.range_chunks = [chunk]
        t = transport_for(server)
        try:
            with pytest.raises(InternalError, match="malformed range answer"):
                await t.read_range(B, L, EntryId(0), EntryId(9))
        finally:
            await t.close()


async def test_the_reader_takes_bad_copies_inside_a_run_from_another_replica() -> None:
    """R9 through the driver: bookie a's run holds corrupt entries 7 and 8 and, as entry
    12, a valid entry that is another one; later bookie b answers a malformed chunk.
    Every entry is read with the bytes written, the bad ones from b or c (7..8 as one
    range read, 12 alone)."""
    names = [BookieId(n) for n in "abc"]
    servers = [FakeBookieServer(with_entries(FakeBookie(n), 20)) for n in names]
    a, b, c = (s.servicer for s in servers)
    for e in (7, 8):
        good = a.entries[(7, e)]
        a.entries[(7, e)] = good[:-1] + bytes([good[-1] ^ 0x10])
    a.entries[(7, 12)] = entry(13)
    for s in servers:
        await s.start()
    addresses = {n: s.address for n, s in zip(names, servers, strict=True)}
    t = GrpcBookieTransport(lambda bookie: addresses[bookie])
    store = await connect(f"memory://reads-{uuid.uuid4().hex[:8]}")
    try:
        md = LedgerMetadata(
            ledger_id=L, ensemble_size=3, write_quorum_size=3, ack_quorum_size=2,
            ensembles=((EntryId(0), tuple(names)),), state=LedgerState.CLOSED,  # type: ignore[arg-type]
            last_entry_id=EntryId(19), length=0,
        )
        reader = LedgerReader(md, store=store, transport=t, digest=DIGEST, master_key=KEY,
                              read_order=lambda ws: list(ws))
        got = [e async for e in reader.read(0, 19)]
        assert [e.payload for e in got] == [b"payload-%d" % e for e in range(20)]
        assert [(r.first_entry_id, r.last_entry_id) for r in a.range_requests] == [(0, 19)]
        assert [(r.first_entry_id, r.last_entry_id) for r in b.range_requests] == [(7, 8)]
        assert all(r.packed for r in a.range_requests + b.range_requests)
        # b now answers malformed chunks: its entries are taken from c
        b.range_chunks = [pb.ReadRangeResponse(first_entry_id=7, sizes=[3, 4], packed_entries=b"xy")]
        got = [e async for e in reader.read(0, 19)]
        assert [e.payload for e in got] == [b"payload-%d" % e for e in range(20)]
        assert [(r.first_entry_id, r.last_entry_id) for r in c.range_requests] == [(7, 8)]
    finally:
        await t.close()
        await store.close()
        for s in servers:
            await s.stop()
