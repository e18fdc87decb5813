"""GrpcBookieTransport against an in-process fake bookie servicer."""

from __future__ import annotations

import asyncio
import collections
import time

import pytest
from transport_fake_bookie import FakeBookie, FakeBookieServer

from scriba.client.grpc_transport import GrpcBookieTransport
from scriba.client.transport import TransportConfig
from scriba.embedded.process import free_port
from scriba.errors import (
    DeadlineExceededError,
    NoSuchEntryError,
    NoSuchLedgerError,
    Status,
    UnauthorizedError,
    UnavailableError,
)
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.testing.waiting import eventually

KEY = b"k" * 32
B = BookieId("b1")


class Recorder:
    """Collects add callbacks; ``wait(n)`` waits for n answers with a deadline."""

    def __init__(self) -> None:
        self.answers: collections.Counter[tuple[int, int]] = collections.Counter()
        self.statuses: dict[tuple[int, int], Status] = {}
        self.times: dict[tuple[int, int], float] = {}
        self._event = asyncio.Event()

    def __call__(self, bookie_id: BookieId, ledger_id: LedgerId, entry_id: EntryId, status: Status) -> None:
        assert isinstance(status, Status)
        self.answers[(ledger_id, entry_id)] += 1
        self.statuses[(ledger_id, entry_id)] = status
        self.times[(ledger_id, entry_id)] = time.monotonic()
        self._event.set()

    async def wait(self, n: int, timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            while sum(self.answers.values()) < n:
                self._event.clear()
                await self._event.wait()


def transport_for(server: FakeBookieServer, **kw: object) -> GrpcBookieTransport:
    return GrpcBookieTransport(lambda b: server.address, TransportConfig(**kw))  # type: ignore[arg-type]


async def test_adds_are_batched_and_each_answered_once() -> None:
    async with FakeBookieServer() as server:
        t = transport_for(server)
        rec = Recorder()
        n = 2000
        for e in range(n):
            t.add(B, LedgerId(1), EntryId(e), KEY, b"x" * 100, rec)
        await rec.wait(n)
        await asyncio.sleep(0.05)  # a duplicate answer would show up here
        assert all(c == 1 for c in rec.answers.values())
        assert len(rec.answers) == n
        assert set(rec.statuses.values()) == {Status.OK}
        assert len(server.servicer.entries) == n
        assert max(server.servicer.batch_sizes) == t.config.batch_entries_max
        assert server.servicer.batches_received <= n // 32
        assert server.servicer.streams_opened == 1
        assert t.inflight_bytes(B) == 0 and t.pending_adds() == 0
        await t.close()


async def test_batch_bytes_limit_splits_batches() -> None:
    async with FakeBookieServer() as server:
        t = transport_for(server, batch_bytes_max=1000)
        rec = Recorder()
        for e in range(40):
            t.add(B, LedgerId(1), EntryId(e), KEY, b"y" * 300, rec)
        await rec.wait(40)
        assert max(server.servicer.batch_sizes) <= 4
        await t.close()


async def test_bookie_statuses_reach_the_callback() -> None:
    async with FakeBookieServer() as server:
        server.servicer.status_for = lambda lid, eid: 3 if eid % 2 else 0  # FENCED on odd entries
        t = transport_for(server)
        rec = Recorder()
        for e in range(10):
            t.add(B, LedgerId(7), EntryId(e), KEY, b"z", rec)
        t.add(B, LedgerId(7), EntryId(98), b"other-key", b"z", rec)
        await rec.wait(11)
        assert rec.statuses[(7, 1)] is Status.FENCED
        assert rec.statuses[(7, 2)] is Status.OK
        assert rec.statuses[(7, 98)] is Status.UNAUTHORIZED
        await t.close()


async def test_silent_bookie_times_out_each_add_once_then_recovers() -> None:
    async with FakeBookieServer() as server:
        server.servicer.silent = True
        t = transport_for(server, add_timeout_s=0.3)
        rec = Recorder()
        start = time.monotonic()
        for e in range(50):
            t.add(B, LedgerId(1), EntryId(e), KEY, b"a", rec)
        await rec.wait(50, timeout_s=3)
        assert set(rec.statuses.values()) == {Status.TIMEOUT}
        assert max(rec.times.values()) - start < 0.3 + 0.2  # no add hangs past its deadline (+ sweep)
        await asyncio.sleep(0.1)  # negative check: a second answer for an add would show up here
        assert all(c == 1 for c in rec.answers.values())
        # healed: the next adds go through on a fresh stream (after a short backoff)
        server.servicer.silent = False
        rec2 = Recorder()
        async with asyncio.timeout(5):
            e = 100
            while rec2.statuses.get((1, e - 1)) is not Status.OK:
                t.add(B, LedgerId(1), EntryId(e), KEY, b"b", rec2)
                await rec2.wait(e - 99)
                e += 1
        assert server.servicer.streams_opened >= 2
        await t.close()


async def test_server_down_answers_unavailable_and_reconnects() -> None:
    port = free_port()
    server = FakeBookieServer(port=port)
    await server.start()
    t = transport_for(server, add_timeout_s=5)
    rec = Recorder()
    server.servicer.add_delay_s = 0.5
    for e in range(20):
        t.add(B, LedgerId(1), EntryId(e), KEY, b"a", rec)
    await eventually(lambda: server.servicer.batches_received >= 1, what="the adds reached the (slow) bookie")
    await server.stop()
    await rec.wait(20, timeout_s=3)
    assert set(rec.statuses.values()) == {Status.UNAVAILABLE}
    # while down, adds fail fast (not after the add timeout)
    rec2 = Recorder()
    t0 = time.monotonic()
    t.add(B, LedgerId(1), EntryId(50), KEY, b"a", rec2)
    await rec2.wait(1, timeout_s=3)
    assert rec2.statuses[(1, 50)] is Status.UNAVAILABLE
    assert time.monotonic() - t0 < 2.5
    # back up on the same port: adds resume
    server2 = FakeBookieServer(port=port)
    await server2.start()
    rec3 = Recorder()
    async with asyncio.timeout(8):
        e = 100
        while rec3.statuses.get((1, e - 1)) is not Status.OK:
            t.add(B, LedgerId(1), EntryId(e), KEY, b"c", rec3)
            await rec3.wait(e - 99)
            e += 1
    await t.close()
    await server2.stop()


async def test_unresolvable_bookie_answers_unavailable() -> None:
    def resolve(b: BookieId) -> str:
        raise NoSuchLedgerError("no such bookie")  # any ScribaError from the registry

    t = GrpcBookieTransport(resolve)
    rec = Recorder()
    t.add(B, LedgerId(1), EntryId(0), KEY, b"a", rec)
    assert not rec.answers  # never answered inside add()
    await rec.wait(1)
    assert rec.statuses[(1, 0)] is Status.UNAVAILABLE
    await t.close()


async def test_back_pressure_wait_writable_and_hard_cap() -> None:
    async with FakeBookieServer() as server:
        server.servicer.add_delay_s = 0.3
        t = transport_for(server, inflight_bytes_max=10_000, inflight_bytes_hard_max=20_000)
        rec = Recorder()
        for e in range(10):
            t.add(B, LedgerId(1), EntryId(e), KEY, b"p" * 1000, rec)
        assert not t.writable(B)
        t0 = time.monotonic()
        assert await t.wait_writable(B, timeout_s=5)
        assert time.monotonic() - t0 >= 0.2
        assert t.writable(B)
        # beyond the hard cap: TOO_MANY_REQUESTS, never an unbounded queue
        for e in range(10, 40):
            t.add(B, LedgerId(1), EntryId(e), KEY, b"p" * 1000, rec)
        await rec.wait(40)
        assert Status.TOO_MANY_REQUESTS in rec.statuses.values()
        assert t.inflight_bytes(B) == 0
        await t.close()


async def test_close_answers_pending_adds_unavailable() -> None:
    async with FakeBookieServer() as server:
        server.servicer.silent = True
        t = transport_for(server)
        rec = Recorder()
        for e in range(5):
            t.add(B, LedgerId(1), EntryId(e), KEY, b"a", rec)
        await eventually(lambda: sum(server.servicer.batch_sizes) == 5, what="the 5 adds reached the bookie")
        await t.close()
        assert len(rec.answers) == 5
        assert set(rec.statuses.values()) == {Status.UNAVAILABLE}
        rec2 = Recorder()
        t.add(B, LedgerId(1), EntryId(9), KEY, b"a", rec2)
        await rec2.wait(1)
        assert rec2.statuses[(1, 9)] is Status.UNAVAILABLE


async def test_reads_map_statuses_to_errors() -> None:
    async with FakeBookieServer() as server:
        t = transport_for(server)
        rec = Recorder()
        for e in range(10):
            t.add(B, LedgerId(5), EntryId(e), KEY, f"e{e}".encode(), rec)
        await rec.wait(10)
        assert await t.read_entry(B, LedgerId(5), EntryId(3)) == b"e3"
        with pytest.raises(NoSuchEntryError):
            await t.read_entry(B, LedgerId(5), EntryId(30))
        with pytest.raises(NoSuchLedgerError):
            await t.read_entry(B, LedgerId(6), EntryId(0))
        got = await t.read_range(B, LedgerId(5), EntryId(2), EntryId(20))
        assert got == [f"e{e}".encode() for e in range(2, 10)]
        got = await t.read_range(B, LedgerId(5), EntryId(0), EntryId(9), max_entries=4)
        assert got == [f"e{e}".encode() for e in range(4)]
        with pytest.raises(NoSuchEntryError):
            await t.read_range(B, LedgerId(5), EntryId(10), EntryId(12))
        lac = await t.read_lac(B, LedgerId(5), fence=True, master_key=KEY)
        assert lac.fenced and lac.last_entry_id == 9 and lac.last_entry == b"e9"
        await t.write_lac(B, LedgerId(5), EntryId(8), KEY)
        with pytest.raises(UnauthorizedError):
            await t.write_lac(B, LedgerId(5), EntryId(8), b"bad")
        assert (await t.read_lac(B, LedgerId(5))).lac == 8
        t0 = time.monotonic()
        polled = await t.long_poll_lac(B, LedgerId(5), EntryId(8), wait_s=0.3)
        assert polled.lac == 8 and 0.25 <= time.monotonic() - t0 < 2
        info = await t.bookie_info(B)
        assert info.bookie_id == "fake" and not info.read_only and info.total_bytes == 20
        await t.close()


async def test_read_deadline_and_unreachable_bookie() -> None:
    async with FakeBookieServer() as server:
        server.servicer.silent = True
        t = transport_for(server)
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceededError) as info:
            await t.read_entry(B, LedgerId(1), EntryId(0), timeout_s=0.3)
        assert time.monotonic() - t0 < 1.5
        assert info.value.retriable
        await t.close()
    t = GrpcBookieTransport(lambda b: f"127.0.0.1:{free_port()}")
    t0 = time.monotonic()
    with pytest.raises(UnavailableError):
        await t.read_entry(B, LedgerId(1), EntryId(0), timeout_s=3)
    assert time.monotonic() - t0 < 3
    await t.close()


async def test_many_bookies_share_one_transport() -> None:
    servers = [FakeBookieServer(FakeBookie(f"b{i}")) for i in range(3)]
    for s in servers:
        await s.start()
    by_id = {BookieId(f"b{i}"): s.address for i, s in enumerate(servers)}
    t = GrpcBookieTransport(by_id.__getitem__)
    rec = Recorder()
    for e in range(300):
        for b in by_id:
            t.add(b, LedgerId(2), EntryId(e), KEY, b"q", rec)
    await rec.wait(900)
    assert all(len(s.servicer.entries) == 300 for s in servers)
    await t.close()
    for s in servers:
        await s.stop()


async def test_send_window_fills_batches_while_answers_are_pending() -> None:
    async with FakeBookieServer() as server:
        server.servicer.add_delay_s = 0.02
        t = transport_for(server, batch_entries_max=8, batches_inflight_max=1)
        rec = Recorder()
        for e in range(200):  # one add per loop turn: without the window each would go alone
            t.add(B, LedgerId(1), EntryId(e), KEY, b"w", rec)
            await asyncio.sleep(0)
        await rec.wait(200)
        sizes = server.servicer.batch_sizes
        assert sum(sizes) == 200
        assert len(sizes) <= 200 / 4, sizes
        assert set(rec.statuses.values()) == {Status.OK}
        await t.close()


async def test_duplicate_adds_of_one_entry_are_each_answered_once() -> None:
    async with FakeBookieServer() as server:
        t = transport_for(server)
        calls: list[Status] = []

        def cb(b: BookieId, lid: LedgerId, eid: EntryId, status: Status) -> None:
            calls.append(status)

        for _ in range(3):  # e.g. a recovery re-send while the first add is still in flight
            t.add(B, LedgerId(4), EntryId(0), KEY, b"same", cb)
        assert t.pending_adds(B) == 3
        await eventually(lambda: len(calls) >= 3, 5, what="the three adds answered")
        await asyncio.sleep(0.05)  # negative check: no further callback
        assert calls == [Status.OK] * 3
        assert t.pending_adds() == 0 and t.inflight_bytes(B) == 0
        await t.close()


async def test_duplicate_adds_time_out_once_each() -> None:
    async with FakeBookieServer() as server:
        server.servicer.silent = True
        t = transport_for(server, add_timeout_s=0.2)
        calls: list[Status] = []
        for _ in range(2):
            t.add(B, LedgerId(4), EntryId(0), KEY, b"same", lambda b, lid, eid, s: calls.append(s))
        await eventually(lambda: len(calls) >= 2, 3, what="both adds timed out")
        await asyncio.sleep(0.3)  # negative check: no late answer after the timeout
        assert calls == [Status.TIMEOUT] * 2
        await t.close()


async def test_long_poll_through_a_silent_bookie_ends_by_its_deadline() -> None:
    class Mute(FakeBookie):
        async def ReadLac(self, request: object, context: object) -> None:
            await asyncio.sleep(3600)  # the stand-in never answers

    async with FakeBookieServer(Mute()) as server:
        t = transport_for(server)
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceededError):
            await t.long_poll_lac(B, LedgerId(1), EntryId(5), wait_s=0.2)
        assert time.monotonic() - t0 < 0.2 + 2.0 + 1.0  # wait + margin, never indefinitely
        await t.close()


async def test_one_entry_to_several_bookies_keeps_each_adds_flags() -> None:
    async with FakeBookieServer() as server:
        server.servicer.keys[9] = KEY
        server.servicer.fenced.add(9)
        t = transport_for(server)
        rec = Recorder()
        entry = b"shared" * 10
        # The same entry object to two bookies in a row, then as a recovery add: the
        # recovery add must travel in its own run (flags are per run).
        t.add(BookieId("b1"), LedgerId(9), EntryId(0), KEY, entry, rec)
        t.add(BookieId("b2"), LedgerId(9), EntryId(0), KEY, entry, rec)
        t.add(BookieId("b3"), LedgerId(9), EntryId(0), KEY, entry, rec, recovery=True)
        await rec.wait(3)
        assert rec.answers[(9, 0)] == 3
        assert server.servicer.entries[(9, 0)] == entry  # only the recovery add got in
        assert server.servicer.batches_received == 3
        await t.close()
