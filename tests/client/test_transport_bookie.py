"""GrpcBookieTransport and BinaryTransport against real ``scriba bookie run`` processes
(each test runs over both wires)."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

import pytest

from scriba.client.binary_transport import BinaryTransport
from scriba.client.grpc_transport import GrpcBookieTransport
from scriba.client.transport import TransportConfig
from scriba.entry import Crc32cDigest, master_key, pack_entry, unpack_entry
from scriba.errors import NoSuchEntryError, NoSuchLedgerError, Status, UnavailableError
from scriba.ids import BookieId, EntryId, LedgerId

KEY = master_key(b"pw")
DIGEST = Crc32cDigest()


class Answers:
    def __init__(self) -> None:
        self.by_key: dict[tuple[str, int, int], list[Status]] = collections.defaultdict(list)
        self.count = 0
        self.event = asyncio.Event()

    def __call__(self, bookie_id: BookieId, ledger_id: LedgerId, entry_id: EntryId, status: Status) -> None:
        self.by_key[(bookie_id, ledger_id, entry_id)].append(status)
        self.count += 1
        self.event.set()

    async def wait(self, n: int, timeout_s: float = 20.0) -> None:
        async with asyncio.timeout(timeout_s):
            while self.count < n:
                self.event.clear()
                await self.event.wait()


@pytest.fixture(params=["grpc", "binary"])
def wire(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def transport(wire: str, cluster: Any, config: TransportConfig | None = None) -> GrpcBookieTransport:
    """The transport of ``wire`` to the bookies of ``cluster`` (addresses read at each dial)."""
    by_id = {b.bookie_id: b for b in cluster.bookies}
    if wire == "grpc":
        return GrpcBookieTransport(lambda b: by_id[b].address, config)
    return BinaryTransport(lambda b: by_id[b].address, config, resolve_binary=lambda b: by_id[b].binary_address)


def entry(ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    return pack_entry(DIGEST, ledger_id, entry_id, entry_id - 1, 0, payload)


async def test_adds_and_reads_on_real_bookies(bookie_cluster: Any, wire: str) -> None:
    bookie_cluster.start_bookies(3)
    addresses = bookie_cluster.addresses()
    t = transport(wire, bookie_cluster)
    answers = Answers()
    n = 3000
    for e in range(n):
        data = entry(11, e, f"payload-{e}".encode())
        for b in addresses:
            t.add(BookieId(b), LedgerId(11), EntryId(e), KEY, data, answers)
    await answers.wait(3 * n)
    assert all(v == [Status.OK] for v in answers.by_key.values())
    assert len(answers.by_key) == 3 * n
    assert t.entries_sent == 3 * n and t.batches_sent < 3 * n / 8  # batched
    if wire == "binary":  # the adds went over the binary links, one per bookie
        assert isinstance(t, BinaryTransport) and t.links_opened == 3
    b0 = BookieId(next(iter(addresses)))
    got = unpack_entry(DIGEST, await t.read_entry(b0, LedgerId(11), EntryId(42), master_key=KEY))
    assert got.payload == b"payload-42"
    chunk = await t.read_range(b0, LedgerId(11), EntryId(0), EntryId(n + 10), max_entries=5000, master_key=KEY)
    assert [unpack_entry(DIGEST, c).entry_id for c in chunk] == list(range(n))
    with pytest.raises(NoSuchEntryError):
        await t.read_entry(b0, LedgerId(11), EntryId(n + 5), master_key=KEY)
    with pytest.raises(NoSuchLedgerError):
        await t.read_entry(b0, LedgerId(12345), EntryId(0), master_key=KEY)
    info = await t.bookie_info(b0)
    assert info.bookie_id == b0 and not info.read_only
    # wrong master key on an existing ledger: UNAUTHORIZED through the callback
    bad = Answers()
    t.add(b0, LedgerId(11), EntryId(n), master_key(b"wrong"), entry(11, n, b"x"), bad)
    await bad.wait(1)
    assert bad.by_key[(b0, 11, n)] == [Status.UNAUTHORIZED]
    # a plain LAC read (no key, nothing written: the RSM leader's fence probe) tells fenced or not
    assert not (await t.read_lac(b0, LedgerId(11), master_key=KEY)).fenced
    # fencing LAC read, then a normal add is FENCED and a recovery add is accepted
    lac = await t.read_lac(b0, LedgerId(11), fence=True, master_key=KEY)
    assert lac.fenced and lac.last_entry_id == n - 1
    assert (await t.read_lac(b0, LedgerId(11), master_key=KEY)).fenced
    fenced = Answers()
    t.add(b0, LedgerId(11), EntryId(n), KEY, entry(11, n, b"late"), fenced)
    t.add(b0, LedgerId(11), EntryId(n + 1), KEY, entry(11, n + 1, b"rec"), fenced, recovery=True)
    await fenced.wait(2)
    assert fenced.by_key[(b0, 11, n)] == [Status.FENCED]
    assert fenced.by_key[(b0, 11, n + 1)] == [Status.OK]
    await t.close()


async def test_killed_bookie_fails_adds_fast_and_restart_resumes(bookie_cluster: Any, wire: str) -> None:
    (bookie,) = bookie_cluster.start_bookies(1)
    b = BookieId(bookie.bookie_id)
    t = transport(wire, bookie_cluster, TransportConfig(add_timeout_s=10))
    first = Answers()
    for e in range(100):
        t.add(b, LedgerId(3), EntryId(e), KEY, entry(3, e, b"a"), first)
    await first.wait(100)
    bookie.kill()
    down = Answers()
    t0 = time.monotonic()
    for e in range(100, 110):
        t.add(b, LedgerId(3), EntryId(e), KEY, entry(3, e, b"b"), down)
    await down.wait(10, timeout_s=5)
    assert time.monotonic() - t0 < 5  # UNAVAILABLE, not after the 10 s add timeout
    assert {s for v in down.by_key.values() for s in v} == {Status.UNAVAILABLE}
    with pytest.raises(UnavailableError):
        await t.read_entry(b, LedgerId(3), EntryId(0), timeout_s=2, master_key=KEY)
    bookie.start()
    resumed = Answers()
    async with asyncio.timeout(15):
        e = 200
        while True:
            t.add(b, LedgerId(3), EntryId(e), KEY, entry(3, e, b"c"), resumed)
            await resumed.wait(e - 199)
            if resumed.by_key[(b, 3, e)] == [Status.OK]:
                break
            e += 1
            await asyncio.sleep(0.05)  # retry pacing, not synchronisation
    got = unpack_entry(DIGEST, await t.read_entry(b, LedgerId(3), EntryId(50), master_key=KEY))
    assert got.payload == b"a"  # what was acknowledged before the kill survived it
    await t.close()
