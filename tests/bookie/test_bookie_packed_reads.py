"""ReadRange answered as packed runs (``ReadRangeRequest.packed``), in-process bookie.

Old clients (no ``packed``) keep getting ``entries``; a bookie that predates ``packed``
(``BookieService.packed_reads = False``) answers in entries, which the client reads too.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from test_bookie_service import InProcBookie, make_bookie  # noqa: F401  (the fixture)
from test_storage_range_reads import config, flip_in_entry_log

from scriba.bookie import entry_log as el
from scriba.bookie.storage import open_storage
from scriba.bookie.storage_api import AddOp
from scriba.client.grpc_transport import GrpcBookieTransport
from scriba.entry import Crc32cDigest, master_key, pack_entry
from scriba.errors import CorruptEntryError, NoSuchEntryError, Status
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.proto import scriba_pb2 as pb

DIGEST = Crc32cDigest()
KEY = master_key(b"pw")


def entry(lid: int, eid: int) -> bytes:
    payload = random.Random(lid * 7919 + eid).randbytes(eid % 250)
    return pack_entry(DIGEST, lid, eid, eid - 1, 0, payload)


async def store(bk: InProcBookie, lid: int, eids: Sequence[int]) -> None:
    run = pb.AddRun(ledger_id=lid, master_key=KEY, entry_ids=list(eids), sizes=[len(entry(lid, e)) for e in eids],
                    entries=b"".join(entry(lid, e) for e in eids))
    got = [a async for resp in bk.stub.AddStream(iter([pb.AddBatch(runs=[run])])) for a in resp.runs]
    assert [a.status for a in got] == [Status.OK] and sorted(got[0].entry_ids) == list(eids)


async def chunks(bk: InProcBookie, **request: Any) -> list[pb.ReadRangeResponse]:
    return [c async for c in bk.stub.ReadRange(pb.ReadRangeRequest(master_key=KEY, **request))]


def unpack(chunk: pb.ReadRangeResponse) -> list[bytes]:
    assert not chunk.entries, "a packed chunk carries no entries"
    assert sum(chunk.sizes) == len(chunk.packed_entries)
    out, start = [], 0
    for size in chunk.sizes:
        out.append(chunk.packed_entries[start : start + size])
        start += size
    return out


async def test_packed_range_reads_round_trip_within_the_bounds(make_bookie) -> None:  # noqa: F811
    bk = await make_bookie(read_range_entries_max=64, entry_size_max=4096, read_range_bytes_max=1 << 20)
    await store(bk, 1, range(300))
    got = await chunks(bk, ledger_id=1, first_entry_id=0, last_entry_id=310, packed=True)
    assert [c.status for c in got[:-1]] == [Status.OK] * (len(got) - 1)
    assert [c.first_entry_id for c in got[:-1]] == list(range(0, 300, 64))  # capped by the bookie
    assert [e for c in got[:-1] for e in unpack(c)] == [entry(1, e) for e in range(300)]
    assert got[-1].status == Status.NO_SUCH_ENTRY and got[-1].first_entry_id == 300 and got[-1].message
    small = await chunks(bk, ledger_id=1, first_entry_id=10, last_entry_id=200, max_entries=7, max_bytes=600,
                         packed=True)
    assert all(len(c.sizes) <= 7 and (len(c.sizes) == 1 or len(c.packed_entries) <= 600) for c in small)
    assert [e for c in small for e in unpack(c)] == [entry(1, e) for e in range(10, 201)]
    one = await chunks(bk, ledger_id=1, first_entry_id=0, last_entry_id=0, packed=True)
    assert [unpack(c) for c in one] == [[entry(1, 0)]]  # entry 0 has an empty payload


async def test_old_clients_get_entries_and_errors_are_the_same_either_way(make_bookie) -> None:  # noqa: F811
    bk = await make_bookie()
    await store(bk, 2, range(20))
    old = await chunks(bk, ledger_id=2, first_entry_id=0, last_entry_id=19)
    assert [c.status for c in old] == [Status.OK] and list(old[0].entries) == [entry(2, e) for e in range(20)]
    assert not old[0].sizes and not old[0].packed_entries
    for packed in (False, True):
        missing = await chunks(bk, ledger_id=3, first_entry_id=0, last_entry_id=5, packed=packed)
        assert [c.status for c in missing] == [Status.NO_SUCH_LEDGER]
        bad = await chunks(bk, ledger_id=2, first_entry_id=5, last_entry_id=1, packed=packed)
        assert [c.status for c in bad] == [Status.BAD_REQUEST]
        gap = await chunks(bk, ledger_id=2, first_entry_id=30, last_entry_id=40, packed=packed)
        assert [c.status for c in gap] == [Status.NO_SUCH_ENTRY]


async def test_a_bookie_without_packed_reads_still_serves_new_clients(make_bookie) -> None:  # noqa: F811
    bk = await make_bookie()
    await store(bk, 4, range(50))
    bk.bookie.service.packed_reads = False  # answers as a bookie that predates the field
    got = await chunks(bk, ledger_id=4, first_entry_id=0, last_entry_id=49, packed=True)
    assert list(got[0].entries) == [entry(4, e) for e in range(50)] and not got[0].sizes
    t = GrpcBookieTransport(lambda b: bk.bookie.address)
    try:
        assert t.packed_reads
        assert await t.read_range(BookieId("b0"), LedgerId(4), EntryId(0), EntryId(49), master_key=KEY) == [
            entry(4, e) for e in range(50)
        ]
        bk.bookie.service.packed_reads = True
        runs = [r async for r in t.read_runs(BookieId("b0"), LedgerId(4), EntryId(3), EntryId(60), master_key=KEY)]
        assert [e for r in runs for e in r.entries()] == [entry(4, e) for e in range(3, 50)]
        assert runs[0].first_entry_id == 3
        with pytest.raises(NoSuchEntryError):
            await t.read_range(BookieId("b0"), LedgerId(4), EntryId(50), EntryId(60), master_key=KEY)
    finally:
        await t.close()


async def test_a_corrupt_entry_ends_a_packed_range_and_is_answered_corrupt(
    make_bookie, tmp_path: Path  # noqa: F811
) -> None:
    """Disk storage: the good entries before a corrupt record are served, then CORRUPT."""
    root = tmp_path / "disk"
    s = await open_storage(config(root))
    await s.add_batch([AddOp(6, e, KEY, entry(6, e)) for e in range(100)])
    await s.close()
    await flip_in_entry_log(root, 6, 40, el.REC_HEADER_SIZE + 20, 1)  # inside entry 40's header
    bk = await make_bookie(storage=await open_storage(config(root)))
    got = await chunks(bk, ledger_id=6, first_entry_id=0, last_entry_id=99, packed=True)
    assert [c.status for c in got] == [Status.OK, Status.CORRUPT]
    assert unpack(got[0]) == [entry(6, e) for e in range(40)] and got[1].first_entry_id == 40
    t = GrpcBookieTransport(lambda b: bk.bookie.address)
    try:
        assert len(await t.read_range(BookieId("b0"), LedgerId(6), EntryId(0), EntryId(99), master_key=KEY)) == 40
        with pytest.raises(CorruptEntryError):
            await t.read_range(BookieId("b0"), LedgerId(6), EntryId(40), EntryId(99), master_key=KEY)
        rest = await t.read_range(BookieId("b0"), LedgerId(6), EntryId(41), EntryId(99), master_key=KEY)
        assert rest == [entry(6, e) for e in range(41, 100)]
    finally:
        await t.close()
