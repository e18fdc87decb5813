"""GrpcBookieTransport's batched write path (``add_entry``, AddRun messages, run answers)."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from transport_fake_bookie import FakeBookieServer

from scriba.client.grpc_transport import GrpcBookieTransport
from scriba.client.transport import TransportConfig
from scriba.errors import Status, UnavailableError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.testing.waiting import eventually

KEY = b"k" * 32
BOOKIES = (BookieId("b1"), BookieId("b2"), BookieId("b3"))


class RunRecorder:
    """Collects batched answers: per (bookie, ledger, entry) the statuses it got."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, int, int], list[Status]] = collections.defaultdict(list)
        self.calls = 0
        self._event = asyncio.Event()

    def __call__(self, bookie_id: BookieId, ledger_id: int, entry_ids: list[int], status: Status) -> None:
        assert isinstance(status, Status) and entry_ids
        self.calls += 1
        for e in entry_ids:
            self.answers[(bookie_id, ledger_id, e)].append(status)
        self._event.set()

    def count(self) -> int:
        return sum(len(v) for v in self.answers.values())

    async def wait(self, n: int, timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            while self.count() < n:
                self._event.clear()
                await self._event.wait()


def transport_for(server: FakeBookieServer, **kw: object) -> GrpcBookieTransport:
    return GrpcBookieTransport(lambda b: server.address, TransportConfig(**kw))  # type: ignore[arg-type]


async def test_add_entry_sends_runs_and_answers_each_add_once() -> None:
    async with FakeBookieServer() as server:
        t = transport_for(server, batch_entries_max=64)
        rec = RunRecorder()
        n = 1000
        for e in range(n):
            t.add_entry(BOOKIES, LedgerId(5), EntryId(e), KEY, b"e%05d" % e, rec)
        await rec.wait(3 * n)
        assert all(v == [Status.OK] for v in rec.answers.values()) and len(rec.answers) == 3 * n
        assert rec.calls < 3 * n / 8  # answers arrive per run, not per add
        assert server.servicer.batches_received < 3 * n / 8
        assert max(server.servicer.batch_sizes) <= 64
        assert all(server.servicer.entries[(5, e)] == b"e%05d" % e for e in range(n))
        assert t.pending_adds() == 0 and all(t.inflight_bytes(b) == 0 for b in BOOKIES)
        await t.close()


async def test_split_and_reordered_run_answers_each_reach_their_add() -> None:
    async with FakeBookieServer() as server:
        server.servicer.split_answers = True
        server.servicer.status_for = lambda lid, e: 5 if e % 7 == 3 else 0  # some adds fail
        t = transport_for(server, batch_entries_max=16)
        rec = RunRecorder()
        for e in range(200):
            for lid in (1, 2):  # two ledgers interleaved: many small runs per message
                t.add_entry(BOOKIES[:1], LedgerId(lid), EntryId(e), KEY, b"x" * (e % 5), rec)
        await rec.wait(400)
        for (b, lid, e), statuses in rec.answers.items():
            assert b == "b1" and lid in (1, 2)
            assert statuses == [Status(5) if e % 7 == 3 else Status.OK]
        assert len(rec.answers) == 400
        assert t.pending_adds() == 0 and t.inflight_bytes(BOOKIES[0]) == 0
        await t.close()


async def test_resent_adds_and_single_adds_mix_with_runs() -> None:
    async with FakeBookieServer() as server:
        server.servicer.add_delay_s = 0.05  # the first sends are still pending when resent
        t = transport_for(server, batch_entries_max=8)
        rec = RunRecorder()
        single: collections.Counter[int] = collections.Counter()

        def one(b: BookieId, lid: LedgerId, e: EntryId, status: Status) -> None:
            assert status is Status.OK
            single[e] += 1

        for e in range(20):
            t.add_entry(BOOKIES[:2], LedgerId(3), EntryId(e), KEY, b"a", rec)
        await asyncio.sleep(0)  # let the first runs go out
        for e in range(20):
            t.add_entry(BOOKIES[:2], LedgerId(3), EntryId(e), KEY, b"a", rec)  # again, while pending
            t.add_entry(BOOKIES[:2], LedgerId(3), EntryId(e), KEY, b"a", rec)  # and again, same run
            t.add(BOOKIES[0], LedgerId(3), EntryId(e), KEY, b"a", one)
        await rec.wait(2 * 3 * 20)
        await eventually(lambda: sum(single.values()) >= 20, 10, what="the 20 single adds answered")
        assert all(v == [Status.OK] * 3 for v in rec.answers.values()) and len(rec.answers) == 40
        assert single == collections.Counter(range(20))
        assert t.pending_adds() == 0 and t.inflight_bytes(BOOKIES[0]) == 0
        await t.close()


async def test_silent_bookie_times_out_queued_and_sent_runs_once() -> None:
    async with FakeBookieServer() as server:
        server.servicer.silent = True
        t = transport_for(server, add_timeout_s=0.3, batch_entries_max=4, batches_inflight_max=1)
        rec = RunRecorder()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for e in range(30):  # some sent, some held back by the send window
            t.add_entry(BOOKIES[:1], LedgerId(9), EntryId(e), KEY, b"z", rec)
        await rec.wait(30)
        assert loop.time() - t0 < 0.3 + 2.0
        assert all(len(v) == 1 and v[0] in (Status.TIMEOUT, Status.UNAVAILABLE) for v in rec.answers.values())
        assert rec.answers[("b1", 9, 0)] == [Status.TIMEOUT]
        assert t.pending_adds() == 0 and t.inflight_bytes(BOOKIES[0]) == 0
        server.servicer.silent = False  # the next adds go through a fresh stream
        rec2 = RunRecorder()
        async with asyncio.timeout(10):
            while not rec2.answers or rec2.answers[("b1", 9, 100)] != [Status.OK]:
                rec2.answers.clear()
                t.add_entry(BOOKIES[:1], LedgerId(9), EntryId(100), KEY, b"z", rec2)
                await rec2.wait(1)
        await t.close()


async def test_close_answers_queued_and_sent_runs_unavailable() -> None:
    async with FakeBookieServer() as server:
        server.servicer.silent = True
        t = transport_for(server, batch_entries_max=4, batches_inflight_max=1)
        rec = RunRecorder()
        for e in range(25):
            t.add_entry(BOOKIES, LedgerId(4), EntryId(e), KEY, b"q", rec)
        # one run sent to each bookie (and unanswered), the rest queued behind it
        await eventually(lambda: server.servicer.batches_received >= len(BOOKIES), what="a run sent to each bookie")
        await t.close()
        await rec.wait(75)
        assert all(v == [Status.UNAVAILABLE] for v in rec.answers.values()) and len(rec.answers) == 75
        rec3 = RunRecorder()
        t.add_entry(BOOKIES[:1], LedgerId(4), EntryId(99), KEY, b"q", rec3)  # after close: soon, not inline
        assert rec3.count() == 0
        await rec3.wait(1)
        assert rec3.answers[("b1", 4, 99)] == [Status.UNAVAILABLE]


async def test_hard_cap_answers_too_many_requests_per_bookie() -> None:
    async with FakeBookieServer() as server:
        server.servicer.silent = True
        t = transport_for(server, inflight_bytes_max=100, inflight_bytes_hard_max=250, add_timeout_s=5)
        rec = RunRecorder()
        for e in range(5):
            t.add_entry(BOOKIES[:2], LedgerId(6), EntryId(e), KEY, b"y" * 100, rec)
        await rec.wait(2 * 3)  # adds 2, 3, 4 of each bookie pass the hard cap
        assert {k: v for k, v in rec.answers.items()} == {
            (b, 6, e): [Status.TOO_MANY_REQUESTS] for b in ("b1", "b2") for e in (2, 3, 4)
        }
        assert not t.writable(BOOKIES[0]) and t.inflight_bytes(BOOKIES[0]) == 200
        await t.close()


async def test_unresolvable_bookie_answers_each_add_unavailable_soon() -> None:
    async with FakeBookieServer() as server:

        def resolve(b: BookieId) -> str:
            if b == "gone":
                raise UnavailableError("not registered")
            return server.address

        t = GrpcBookieTransport(resolve)
        rec = RunRecorder()
        t.add_entry((BookieId("gone"), BOOKIES[0]), LedgerId(2), EntryId(0), KEY, b"w", rec)
        assert rec.count() == 0  # never inline
        await rec.wait(2)
        assert rec.answers[("gone", 2, 0)] == [Status.UNAVAILABLE]
        assert rec.answers[("b1", 2, 0)] == [Status.OK]
        await t.close()


async def test_bytes_limit_closes_runs_and_splits_messages() -> None:
    async with FakeBookieServer() as server:
        t = transport_for(server, batch_bytes_max=1000)
        rec = RunRecorder()
        for e in range(30):
            t.add_entry(BOOKIES[:1], LedgerId(8), EntryId(e), KEY, b"m" * 300, rec)
        await rec.wait(30)
        runs = server.servicer.run_entry_ids
        assert sorted(e for r in runs for e in r) == list(range(30))
        assert all(len(r) <= 4 for r in runs)  # a run closes once it holds >= 1000 bytes
        assert all(n <= 4 for n in server.servicer.batch_sizes)
        await t.close()


async def test_runs_survive_one_bookie_of_the_write_set_failing() -> None:
    from scriba.embedded.process import free_port

    async with FakeBookieServer() as server:
        dead = f"127.0.0.1:{free_port()}"  # nothing listens there
        t = GrpcBookieTransport(lambda b: dead if b == "b3" else server.address, TransportConfig(add_timeout_s=5))
        rec = RunRecorder()
        n = 300
        for e in range(n):
            t.add_entry(BOOKIES, LedgerId(12), EntryId(e), KEY, b"s%d" % e, rec)
            if e % 50 == 0:
                await asyncio.sleep(0.01)  # let streams fail and reopen in between
        await rec.wait(3 * n)
        await asyncio.sleep(0.05)  # a second answer would show up here
        assert len(rec.answers) == 3 * n
        for (b, _lid, _e), statuses in rec.answers.items():
            assert statuses == ([Status.UNAVAILABLE] if b == "b3" else [Status.OK])
        # every add reached each live bookie once, in runs
        runs = collections.Counter(tuple(r) for r in server.servicer.run_entry_ids)
        assert sum(len(r) * c for r, c in runs.items()) == 2 * n
        assert t.pending_adds() == 0 and all(t.inflight_bytes(b) == 0 for b in BOOKIES)
        await t.close()


async def test_a_raising_add_callback_is_reported_to_the_loop_and_others_still_answered(
    loop_exceptions: Any,
) -> None:
    """A bug in an answer callback is not swallowed: it reaches the event loop's exception
    handler (which fails a test, ``tests/conftest.py``); the transport goes on."""

    def broken(bookie_id: BookieId, ledger_id: int, entry_ids: list[int], status: Status) -> None:
        raise RuntimeError("bug in a callback")

    async with FakeBookieServer() as server:
        t = transport_for(server)
        rec = RunRecorder()
        t.add_entry(BOOKIES[:1], LedgerId(3), EntryId(0), KEY, b"a", broken)
        t.add_entry(BOOKIES[:1], LedgerId(4), EntryId(0), KEY, b"b", rec)
        await rec.wait(1)
        await eventually(lambda: not t.pending_adds(), 10, what="no add pending")
        await t.close()
    (context,) = loop_exceptions.take()
    assert context["message"] == "add callback failed: bookie b1 ledger 3 entry 0"
    assert isinstance(context["exception"], RuntimeError)
    assert rec.answers == {("b1", 4, 0): [Status.OK]}
