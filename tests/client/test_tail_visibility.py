"""Tailing a ledger: the long poll's answer carries the newly confirmed entries, and the
writer pushes a confirmed LAC that no later entry carries (in-process bookies, memory://).

- ``LedgerReader.tail`` delivers the entries a long poll brings without another read,
  and never one beyond the LAC of that answer, whatever a bookie sends (negative
  control: a transport that piggybacks stored but unconfirmed entries);
- ``piggybacked`` checks each entry (digest, ids) and stops at the first bad one;
- the writer pushes its LAC explicitly only when no entry packed since the confirmation
  carries it (``explicit_lac_delay_s``; ``None``: never), one push at a time per bookie:
  a bookie whose push hangs holds back no other bookie's; and a push never carries an
  entry that is sent but not yet confirmed (negative control: entries held on all but
  one bookie); a writer given its own delay (``set_explicit_lac_delay``) pushes only
  after that long without an entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeVar

import pytest

from scriba.bookie.storage_api import AddOp
from scriba.client import Client, ClientConfig, LedgerWriter
from scriba.client.driver import DriverConfig
from scriba.client.reader import piggybacked
from scriba.client.transport import LacResult
from scriba.entry import Entry, make_digest, pack_entry
from scriba.errors import ConfigError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.connect import connect
from scriba.testing.sim import StorageTransport, register_bookies
from scriba.testing.waiting import eventually

BOOKIES = ["bk0", "bk1", "bk2"]


def config(explicit_lac_delay_s: float | None = 0.0) -> ClientConfig:
    return ClientConfig(
        add_timeout_s=2.0, bookie_wait_s=2.0,
        driver=DriverConfig(read_timeout_s=2.0, metadata_timeout_s=5.0, long_poll_s=0.2,
                            explicit_lac_delay_s=explicit_lac_delay_s),
    )


def long_polls(long_poll_s: float) -> ClientConfig:
    """Long polls that do not time out during a test."""
    return ClientConfig(add_timeout_s=2.0, bookie_wait_s=2.0,
                        driver=DriverConfig(read_timeout_s=2.0, metadata_timeout_s=5.0, long_poll_s=long_poll_s))


T = TypeVar("T", bound=StorageTransport)


@contextlib.asynccontextmanager
async def tailing(transport: T, long_poll_s: float, **tail: Any
                  ) -> AsyncIterator[tuple[T, LedgerWriter, AsyncGenerator[Entry, None]]]:
    """A new ledger's writer and a tail of it from entry 0 (``tail``: its options), over ``transport``."""
    client = await open_client(transport, long_polls(long_poll_s))
    try:
        w = await client.create_ledger(3, 3, 2)
        r = await client.open_ledger(w.ledger_id, recovery=False)
        yield transport, w, r.tail(0, **tail)
    finally:
        await client.close()
        await client.store.close()


class CountingTransport(StorageTransport):
    """Counts explicit LAC pushes; with ``lie``, a long poll piggybacks every stored entry
    after ``previous_lac`` (as a broken bookie would), confirmed or not."""

    def __init__(self, bookie_ids: list[str], *, lie: bool = False, push_delay_s: float = 0.0) -> None:
        super().__init__(bookie_ids)
        self.lie = lie
        self.push_delay_s = push_delay_s  # a slow network for the LAC pushes
        self.lac_pushes: list[tuple[BookieId, int]] = []
        self.push_times: list[float] = []
        self.durable_lacs = 0  # write_lac calls without hint_only

    async def write_lac(
        self, bookie_id: BookieId, ledger_id: LedgerId, lac: EntryId, master_key: bytes, *, hint_only: bool = False,
    ) -> None:
        if hint_only:
            self.lac_pushes.append((bookie_id, lac))
            self.push_times.append(time.monotonic())
            await asyncio.sleep(self.push_delay_s)
        else:
            self.durable_lacs += 1
        await super().write_lac(bookie_id, ledger_id, lac, master_key, hint_only=hint_only)

    async def long_poll_lac(
        self, bookie_id: BookieId, ledger_id: LedgerId, previous_lac: EntryId, *,
        wait_s: float, piggyback_entries_max: int = 1, master_key: bytes = b"",
    ) -> LacResult:
        result = await super().long_poll_lac(
            bookie_id, ledger_id, previous_lac, wait_s=wait_s, piggyback_entries_max=piggyback_entries_max,
            master_key=master_key)
        if not self.lie:
            return result
        storage = self._storage(bookie_id)
        stored = storage.read_range(ledger_id, previous_lac + 1, result.last_entry_id, 1000, 1 << 20) \
            if result.last_entry_id > previous_lac else []
        return LacResult(result.lac, result.last_entry_id, fenced=result.fenced, piggybacked_entries=tuple(stored))


async def open_client(transport: StorageTransport, cfg: ClientConfig) -> Client:
    uri = f"memory://tail-{uuid.uuid4().hex}"
    store = await connect(uri)
    await register_bookies(store, BOOKIES)
    return await Client.connect(uri, store=store, transport=transport, config=cfg)


@pytest.fixture
async def counting() -> AsyncIterator[tuple[Client, CountingTransport]]:
    transport = CountingTransport(BOOKIES)
    client = await open_client(transport, config())
    yield client, transport
    await client.close()
    await client.store.close()


async def test_tail_takes_the_entries_from_the_long_poll_answer(counting: tuple[Client, CountingTransport]) -> None:
    client, transport = counting
    w = await client.create_ledger(3, 3, 2)
    r = await client.open_ledger(w.ledger_id, recovery=False)
    tail = r.tail(0)
    reads = transport.range_reads + transport.entry_reads
    for i in range(20):  # one at a time: each confirmed, pushed, then waited for by the tail
        await w.append(b"e%d" % i)
        entry = await asyncio.wait_for(anext(tail), 10)
        assert (entry.entry_id, entry.payload) == (i, b"e%d" % i)
    assert transport.range_reads + transport.entry_reads == reads, "the tail read what the long poll carried"
    await w.close()
    async with asyncio.timeout(10):
        assert [e async for e in tail] == []


async def test_the_tail_never_delivers_an_entry_beyond_the_lac_whatever_a_bookie_sends() -> None:
    """Negative control of the LAC rule: the bookies piggyback stored but unconfirmed
    entries (5 and 6 of a ledger confirmed up to 4); the tail delivers 0..4 and ends at
    the close, never 5 or 6."""
    transport = CountingTransport(BOOKIES, lie=True)
    client = await open_client(transport, config())
    try:
        w = await client.create_ledger(3, 3, 2)
        r = await client.open_ledger(w.ledger_id, recovery=False)
        tail = r.tail(0)
        got = []
        for i in range(5):
            await w.append(b"ok%d" % i)
            got.append((await asyncio.wait_for(anext(tail), 10)).entry_id)
        digest = make_digest("crc32c", b"")
        for eid in (5, 6):  # as if sent by the writer, never confirmed (no ack quorum seen)
            data = pack_entry(digest, w.ledger_id, eid, 4, 100, b"unconfirmed")
            for b in BOOKIES:
                await transport.storages[BookieId(b)].add_batch([AddOp(w.ledger_id, eid, w._master_key, data)])
        await w.close()  # closes at its LAC: 4
        async with asyncio.timeout(10):
            got += [e.entry_id async for e in tail]
        assert got == [0, 1, 2, 3, 4]
    finally:
        await client.close()
        await client.store.close()


def test_piggybacked_entries_are_checked_one_by_one() -> None:
    digest = make_digest("crc32c", b"")
    lid = LedgerId(7)

    def packed(eid: int, ledger: int = 7) -> bytes:
        return pack_entry(digest, ledger, eid, eid - 1, 10 * eid, b"p%d" % eid)

    def ids(lac: int, *entries: bytes, first: int = 3) -> list[int]:
        result = LacResult(EntryId(lac), EntryId(9), piggybacked_entries=entries)
        return [e.entry_id for e in piggybacked(result, lid, first, digest)]

    assert ids(5, packed(3), packed(4), packed(5)) == [3, 4, 5]
    assert ids(4, packed(3), packed(4), packed(5)) == [3, 4]  # 5 is beyond the answer's LAC
    assert ids(5, packed(4), packed(5)) == []  # not the entry asked for
    assert ids(5, packed(3), packed(4, ledger=8), packed(5)) == [3]  # another ledger's entry
    corrupt = bytearray(packed(4))
    corrupt[-1] ^= 1
    assert ids(5, packed(3), bytes(corrupt), packed(5)) == [3]  # a bad digest stops it
    assert ids(5) == []


async def test_the_writer_pushes_an_lac_no_later_entry_carries(counting: tuple[Client, CountingTransport]) -> None:
    client, transport = counting
    w = await client.create_ledger(3, 3, 2)
    await w.append(b"alone")
    await eventually(lambda: {lac for _, lac in transport.lac_pushes} == {0}, what="the LAC pushed")
    for b in BOOKIES:
        assert transport.storages[BookieId(b)].lac_state(w.ledger_id).lac == 0
    assert transport.durable_lacs == 0  # a hint: raised in the bookies' memory, not journaled
    await w.close()


async def test_no_push_while_each_confirmation_is_carried_by_the_next_entry(
    counting: tuple[Client, CountingTransport],
) -> None:
    """Appends chained from each confirmation: every new entry carries the LAC, so only
    the last confirmation (nothing after it) is pushed."""
    client, transport = counting
    w = await client.create_ledger(3, 3, 2)
    done = asyncio.get_running_loop().create_future()
    count = 200

    def next_append(future: asyncio.Future[Any]) -> None:
        if future.result() + 1 < count:
            w.append_async(b"x").add_done_callback(next_append)
        elif not done.done():
            done.set_result(None)

    w.append_async(b"x").add_done_callback(next_append)
    await asyncio.wait_for(done, 30)
    await eventually(lambda: bool(transport.lac_pushes), what="the last LAC pushed")
    assert {lac for _, lac in transport.lac_pushes} == {count - 1}
    await w.close()


async def test_no_push_when_disabled() -> None:
    transport = CountingTransport(BOOKIES)
    client = await open_client(transport, config(explicit_lac_delay_s=None))
    try:
        w = await client.create_ledger(3, 3, 2)
        for i in range(5):
            await w.append(b"%d" % i)
        await w.close()
        assert transport.lac_pushes == []
    finally:
        await client.close()
        await client.store.close()


async def test_a_writer_with_its_own_delay_pushes_only_once_idle_that_long(
    counting: tuple[Client, CountingTransport],
) -> None:
    """``set_explicit_lac_delay``: entries that follow each other within the delay (here an
    hour, with loop turns and a short pause between them, as a remote proposer's next
    command would) are not pushed, and the check due is re-timed when the delay changes;
    with a short delay an entry is pushed no sooner than the delay after its
    confirmation. Negative control: the client's delay of 0 pushes in the first pause (its
    check runs on the next loop turn, before the pause ends) and after the last entry."""
    client, transport = counting
    w = await client.create_ledger(3, 3, 2)
    assert w.explicit_lac_delay_s == 0.0  # the client's
    w.set_explicit_lac_delay(3600.0)
    assert w.explicit_lac_delay_s == 3600.0
    for i in range(10):
        await w.append(b"%d" % i)
        await asyncio.sleep(0.01)  # the writer's pacing: idle gaps the hour-long delay must not fill
    assert transport.lac_pushes == []
    w.set_explicit_lac_delay(0.05)  # the pending hour-long check, re-timed
    await eventually(lambda: {lac for _, lac in transport.lac_pushes} == {9}, what="the idle writer's LAC pushed")
    await w.close()
    transport.lac_pushes.clear()
    transport.push_times.clear()
    short = await client.create_ledger(3, 3, 2)
    short.set_explicit_lac_delay(0.2)
    await short.append(b"alone")
    confirmed = time.monotonic()
    await eventually(lambda: {lac for _, lac in transport.lac_pushes} == {0}, what="the LAC pushed after the delay")
    assert min(transport.push_times) >= confirmed + 0.19  # a timer never fires early (clock resolution aside)
    await short.close()
    transport.lac_pushes.clear()
    control = await client.create_ledger(3, 3, 2)
    for i in range(3):
        await control.append(b"%d" % i)
        await asyncio.sleep(0.01)  # the writer's pacing: idle gaps between appends
    await eventually(lambda: {lac for _, lac in transport.lac_pushes} >= {0, 2}, what="pauses pushed, the last too")
    await control.close()


async def test_a_writer_with_its_own_delay_counts_it_from_the_last_confirmation(
    counting: tuple[Client, CountingTransport],
) -> None:
    """The delay runs from the writer's last confirmation, not from the first one since the
    last check: entries confirmed 0.3 s apart under a 1 s delay (a steady proposer) are
    never pushed, although a check set at the first confirmation falls due, a second later,
    between a confirmation and the next entry; once the writer is idle, its last LAC is
    pushed, no sooner than the delay after that entry's confirmation. (A check that
    counted from the first confirmation pushes the LAC of the fourth entry: the mutant
    ``lac-delay-from-first-confirmation``.)"""
    client, transport = counting
    w = await client.create_ledger(3, 3, 2)
    w.set_explicit_lac_delay(1.0)
    for i in range(5):
        await w.append(b"%d" % i)
        if i < 4:
            await asyncio.sleep(0.3)  # the writer's pacing, well inside the delay
    confirmed = time.monotonic()
    assert transport.lac_pushes == [], "a writer whose entries keep coming inside the delay pushes nothing"
    await eventually(lambda: {lac for _, lac in transport.lac_pushes} == {4}, what="the idle writer's last LAC pushed")
    assert min(transport.push_times) >= confirmed + 0.99  # counted from the last confirmation
    await w.close()
    transport.lac_pushes.clear()
    closing = await client.create_ledger(3, 3, 2)
    closing.set_explicit_lac_delay(3600.0)
    await closing.append(b"last")
    await closing.close()  # a close pushes its last LAC at once, whatever the delay
    assert {lac for _, lac in transport.lac_pushes} == {0}


async def test_a_hurried_tail_does_not_pause() -> None:
    """``hurry``: a tail with a 1 s pause, caught up and pausing, takes the next entry as
    soon as ``hurry`` is set, and starts no pause while it stays set. Negative control,
    before it is set: the entry appended during the pause is not delivered (0.3 s on)."""
    hurry = asyncio.Event()
    got: asyncio.Queue[int] = asyncio.Queue()
    async with tailing(CountingTransport(BOOKIES), 30.0, poll_pause_s=1.0, hurry=hurry) as (_, w, tail):
        async def consume() -> None:
            async for entry in tail:
                await got.put(entry.entry_id)

        consumer = asyncio.create_task(consume())
        try:
            await w.append(b"0")
            assert await asyncio.wait_for(got.get(), 10) == 0
            pausing = time.monotonic()  # the tail now pauses 1 s: caught up with the LAC it knows
            await w.append(b"1")
            await asyncio.sleep(0.3)  # a negative check: nothing comes during the pause
            assert got.empty(), "an unhurried tail waits out its pause"
            hurry.set()
            assert await asyncio.wait_for(got.get(), 10) == 1
            assert time.monotonic() < pausing + 0.9, "the pause under way ended when hurry was set"
            delivered = time.monotonic()
            await w.append(b"2")
            assert await asyncio.wait_for(got.get(), 10) == 2
            assert time.monotonic() < delivered + 0.9, "no pause starts while hurry is set"
        finally:
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer


async def test_an_explicit_lac_delay_is_checked() -> None:
    transport = CountingTransport(BOOKIES)
    client = await open_client(transport, config())
    try:
        w = await client.create_ledger(3, 3, 2)
        with pytest.raises(ConfigError, match="explicit_lac_delay_s"):
            w.set_explicit_lac_delay(-1.0)
        assert w.explicit_lac_delay_s == 0.0
        await w.close()
    finally:
        await client.close()
        await client.store.close()


async def test_the_last_entry_before_a_close_reaches_a_tail_without_waiting_out_its_poll() -> None:
    """Appended, then closed at once: the push still goes out (closing), so the tail gets
    the entry long before its 30 s poll would time out and show the close."""
    async with tailing(CountingTransport(BOOKIES), 30.0) as (_, w, tail):
        first = asyncio.ensure_future(anext(tail))
        await w.append(b"last")
        await w.close()
        entry = await asyncio.wait_for(first, 10)
        assert (entry.entry_id, entry.payload) == (0, b"last")
        await tail.aclose()


async def test_close_returns_once_the_last_lac_reached_the_bookies() -> None:
    """A writer process may exit right after ``close``: its last push must have landed by
    then (here pushes take 0.2 s; close waits up to long_poll_s), or tailing readers wait
    out their long poll."""
    transport = CountingTransport(BOOKIES, push_delay_s=0.2)
    cfg = ClientConfig(add_timeout_s=2.0, bookie_wait_s=2.0,
                       driver=DriverConfig(read_timeout_s=5.0, metadata_timeout_s=5.0, long_poll_s=10.0))
    client = await open_client(transport, cfg)
    try:
        w = await client.create_ledger(3, 3, 2)
        for i in range(3):
            await w.append(b"%d" % i)
        await w.close()
        assert [transport.storages[BookieId(b)].lac_state(w.ledger_id).lac for b in BOOKIES] == [2, 2, 2]
    finally:
        await client.close()
        await client.store.close()


class WaitingPolls(CountingTransport):
    """Notes the long polls waiting right now: (bookie, previous_lac)."""

    def __init__(self, bookie_ids: list[str]) -> None:
        super().__init__(bookie_ids)
        self.waiting: list[tuple[BookieId, int]] = []
        self.polls = 0  # long polls sent

    async def long_poll_lac(
        self, bookie_id: BookieId, ledger_id: LedgerId, previous_lac: EntryId, *,
        wait_s: float, piggyback_entries_max: int = 1, master_key: bytes = b"",
    ) -> LacResult:
        key = (bookie_id, int(previous_lac))
        self.waiting.append(key)
        self.polls += 1
        try:
            return await super().long_poll_lac(
                bookie_id, ledger_id, previous_lac, wait_s=wait_s, piggyback_entries_max=piggyback_entries_max,
                master_key=master_key)
        finally:
            self.waiting.remove(key)


async def test_the_next_polls_wait_at_two_bookies_while_the_consumer_holds_an_entry() -> None:
    """Re-armed before delivering: while the consumer still holds entry i (it has not
    asked for the next), polls for entries i + 1 and i + 2 already wait, each at the
    same two bookies, so an LAC that moves meanwhile is answered at once by whichever
    learns it first; and everything still comes from the polls' answers (no read)."""
    async with tailing(WaitingPolls(BOOKIES), 20.0) as (transport, w, tail):
        reads = transport.range_reads + transport.entry_reads
        for i in range(5):
            await w.append(b"e%d" % i)
            entry = await asyncio.wait_for(anext(tail), 10)
            assert entry.entry_id == i
            ahead = [i, i, i + 1, i + 1]  # the previous_lac of the polls for entries i + 1 and i + 2, twice each
            await eventually(lambda: sorted(p for _, p in transport.waiting) == ahead,  # noqa: B023 (awaited here)
                             what=f"polls for entries {i + 1} and {i + 2} waiting while entry {i} is held")
            pair = {b for b, p in transport.waiting if p == i}
            assert len(pair) == 2 and {b for b, p in transport.waiting if p == i + 1} == pair, transport.waiting
        assert transport.range_reads + transport.entry_reads == reads, "the tail read what the long polls carried"
        await tail.aclose()
        await eventually(lambda: transport.waiting == [], what="the polls of a closed tail ended")
        await w.close()


async def test_a_tail_with_one_poll_replica_waits_at_one_bookie() -> None:
    """``poll_replicas=1`` (an RSM follower's tail: half the answers per entry): the polls
    for entries i + 1 and i + 2 wait at one bookie each, the same one, and still carry
    every entry (no read)."""
    async with tailing(WaitingPolls(BOOKIES), 20.0, poll_replicas=1) as (transport, w, tail):
        reads = transport.range_reads + transport.entry_reads
        for i in range(5):
            await w.append(b"e%d" % i)
            entry = await asyncio.wait_for(anext(tail), 10)
            assert entry.entry_id == i
            await eventually(lambda: sorted(p for _, p in transport.waiting) == [i, i + 1],  # noqa: B023 (awaited here)
                             what=f"one poll each for entries {i + 1} and {i + 2} while entry {i} is held")
            assert len({b for b, _ in transport.waiting}) == 1, transport.waiting
        assert transport.range_reads + transport.entry_reads == reads, "the tail read what the long polls carried"
        await tail.aclose()
        await w.close()


async def _polls_for_a_burst(**tail_options: Any) -> int:
    """Long polls a tail sends to deliver entries 1..10, appended together while it holds
    entry 0 (from none of them to a tail that polls once per entry)."""
    async with tailing(WaitingPolls(BOOKIES), 20.0, poll_replicas=1, **tail_options) as (transport, w, tail):
        await w.append(b"e0")
        assert (await asyncio.wait_for(anext(tail), 10)).entry_id == 0
        before = transport.polls
        taken = asyncio.ensure_future(anext(tail))  # the tail goes on (a pause starts, if any)
        for i in range(1, 11):
            await w.append(b"e%d" % i)
        entries = [await asyncio.wait_for(taken, 10)] + [await asyncio.wait_for(anext(tail), 10) for _ in range(9)]
        assert [e.entry_id for e in entries] == list(range(1, 11))
        polls = transport.polls - before
        await tail.aclose()
        await w.close()
        return polls


async def test_a_tail_with_a_poll_pause_takes_a_burst_in_one_answer() -> None:
    """``poll_pause_s`` (an RSM follower's CPU lever): entries appended during the pause
    come back in the answer to the one poll sent after it; the negative control, no pause,
    polls again for entries of the same burst."""
    assert await _polls_for_a_burst(poll_pause_s=1.0) == 1
    assert await _polls_for_a_burst() > 1


async def test_a_tail_refuses_a_poll_pause_outside_zero_to_one_second() -> None:
    for bad in (-0.001, 1.5):
        async with tailing(WaitingPolls(BOOKIES), 20.0, poll_pause_s=bad) as (transport, w, tail):
            with pytest.raises(ConfigError, match="poll_pause_s"):
                await anext(tail)
            assert transport.waiting == [], "nothing polled"
            await w.close()


async def test_a_tail_refuses_a_poll_replica_count_other_than_one_or_two() -> None:
    for bad in (0, 3):
        async with tailing(WaitingPolls(BOOKIES), 20.0, poll_replicas=bad) as (transport, w, tail):
            with pytest.raises(ConfigError, match="poll_replicas"):
                await anext(tail)
            assert transport.waiting == [], "nothing polled"
            await w.close()


class HeldTransport(CountingTransport):
    """Pushes to ``push_held`` bookies wait for ``release``; adds of entry ``add_held_entry``
    to ``add_held`` bookies are not answered until ``release`` either."""

    def __init__(self, bookie_ids: list[str], *, push_held: frozenset[str] = frozenset(),
                 add_held: frozenset[str] = frozenset(), add_held_entry: int = -1) -> None:
        super().__init__(bookie_ids)
        self.push_held = push_held
        self.add_held = add_held
        self.add_held_entry = add_held_entry
        self.release = asyncio.Event()
        self._held: set[asyncio.Task[None]] = set()

    async def write_lac(
        self, bookie_id: BookieId, ledger_id: LedgerId, lac: EntryId, master_key: bytes, *, hint_only: bool = False,
    ) -> None:
        if bookie_id in self.push_held:
            self.lac_pushes.append((bookie_id, lac))
            await self.release.wait()
            await StorageTransport.write_lac(self, bookie_id, ledger_id, lac, master_key, hint_only=hint_only)
            return
        await super().write_lac(bookie_id, ledger_id, lac, master_key, hint_only=hint_only)

    def add(self, bookie_id: BookieId, ledger_id: LedgerId, entry_id: EntryId, master_key: bytes,
            entry: bytes, on_response: Any, *, recovery: bool = False) -> None:
        if bookie_id in self.add_held and entry_id == self.add_held_entry and not self.release.is_set():
            async def later() -> None:
                await self.release.wait()
                StorageTransport.add(self, bookie_id, ledger_id, entry_id, master_key, entry, on_response,
                                     recovery=recovery)
            task = asyncio.get_running_loop().create_task(later())
            self._held.add(task)
            task.add_done_callback(self._held.discard)
            return
        super().add(bookie_id, ledger_id, entry_id, master_key, entry, on_response, recovery=recovery)


async def test_a_bookie_whose_push_hangs_holds_back_no_other_bookies_pushes() -> None:
    """bk2 never answers a push until released: bk0 and bk1 still learn each new LAC
    (one push at a time per bookie, not one round of the whole ensemble at a time), and
    bk2 gets the newest LAC once its push returns."""
    transport = HeldTransport(BOOKIES, push_held=frozenset({"bk2"}))
    client = await open_client(transport, config())
    try:
        w = await client.create_ledger(3, 3, 2)
        storages = transport.storages
        for i in range(4):
            await w.append(b"%d" % i)
            await eventually(
                lambda: [storages[BookieId(b)].lac_state(w.ledger_id).lac for b in ("bk0", "bk1")] == [i, i],  # noqa: B023
                what=f"LAC {i} pushed to bk0 and bk1 while bk2's push hangs")
        assert [lac for b, lac in transport.lac_pushes if b == "bk2"] == [0], "one push in flight at bk2"
        transport.release.set()
        await eventually(lambda: storages[BookieId("bk2")].lac_state(w.ledger_id).lac == 3,
                         what="bk2 pushed the newest LAC once its push returned")
        await w.close()
    finally:
        transport.release.set()
        await client.close()
        await client.store.close()


async def test_a_push_never_carries_an_entry_sent_but_not_confirmed() -> None:
    """Entries 0 and 1 sent together; entry 1 is held at bk1 and bk2 (only bk0 holds it,
    short of the ack quorum of 2): the push after entry 0's confirmation carries 0, never
    1, to every bookie; once released, 1 is confirmed and pushed."""
    transport = HeldTransport(BOOKIES, add_held=frozenset({"bk1", "bk2"}), add_held_entry=1)
    client = await open_client(transport, config())
    try:
        w = await client.create_ledger(3, 3, 2)
        first, second = w.append_async(b"0"), w.append_async(b"1")
        assert await asyncio.wait_for(first, 10) == 0
        await eventually(lambda: {b for b, _ in transport.lac_pushes} == set(BOOKIES),
                         what="the LAC pushed to every bookie")
        assert {lac for _, lac in transport.lac_pushes} == {0}, transport.lac_pushes
        assert [transport.storages[BookieId(b)].lac_state(w.ledger_id).lac for b in BOOKIES] == [0, 0, 0]
        assert not second.done()
        transport.release.set()
        assert await asyncio.wait_for(second, 10) == 1
        await eventually(lambda: (BookieId("bk0"), 1) in transport.lac_pushes, what="LAC 1 pushed")
        await w.close()
    finally:
        transport.release.set()
        await client.close()
        await client.store.close()


class HungPolls(WaitingPolls):
    """The first bookie a long poll goes to never answers one (until ``release``)."""

    def __init__(self, bookie_ids: list[str]) -> None:
        super().__init__(bookie_ids)
        self.hung: BookieId | None = None
        self.release = asyncio.Event()

    async def long_poll_lac(
        self, bookie_id: BookieId, ledger_id: LedgerId, previous_lac: EntryId, *,
        wait_s: float, piggyback_entries_max: int = 1, master_key: bytes = b"",
    ) -> LacResult:
        if self.hung is None:
            self.hung = bookie_id
        if bookie_id == self.hung:
            await self.release.wait()
        return await super().long_poll_lac(
            bookie_id, ledger_id, previous_lac, wait_s=wait_s, piggyback_entries_max=piggyback_entries_max,
            master_key=master_key)


async def test_a_bookie_that_never_answers_a_long_poll_holds_back_no_tail() -> None:
    """The first bookie polled hangs (a poll of 30 s that never ends): each entry still
    reaches the tail from the other replica its polls wait at, long before the hung poll
    would time out, and without reads."""
    transport = HungPolls(BOOKIES)
    try:
        async with tailing(transport, 30.0) as (_, w, tail):
            reads = transport.range_reads + transport.entry_reads
            for i in range(5):
                await w.append(b"e%d" % i)
                entry = await asyncio.wait_for(anext(tail), 10)
                assert (entry.entry_id, entry.payload) == (i, b"e%d" % i)
            assert transport.hung is not None
            assert transport.range_reads + transport.entry_reads == reads, "delivered from the other replica's answers"
            await tail.aclose()
            transport.release.set()
            await w.close()
    finally:
        transport.release.set()



class CountedPolls(CountingTransport):
    """Counts long polls per bookie."""

    def __init__(self, bookie_ids: list[str]) -> None:
        super().__init__(bookie_ids)
        self.polls: dict[BookieId, int] = {}

    async def long_poll_lac(
        self, bookie_id: BookieId, ledger_id: LedgerId, previous_lac: EntryId, *,
        wait_s: float, piggyback_entries_max: int = 1, master_key: bytes = b"",
    ) -> LacResult:
        self.polls[bookie_id] = self.polls.get(bookie_id, 0) + 1
        return await super().long_poll_lac(
            bookie_id, ledger_id, previous_lac, wait_s=wait_s, piggyback_entries_max=piggyback_entries_max,
            master_key=master_key)


async def test_a_tail_stops_polling_a_bookie_that_failed() -> None:
    """The bookie polled first goes down: entries keep coming from the other replicas'
    answers, and the tail's polls leave it (a few polls that were already waiting or
    picked fail there; 20 entries later it still has no more than those)."""
    transport = CountedPolls(BOOKIES)
    async with tailing(transport, 30.0) as (_, w, tail):
        await w.append(b"first")
        assert (await asyncio.wait_for(anext(tail), 10)).entry_id == 0
        first = max(transport.polls, key=lambda b: transport.polls[b])
        transport.down.add(first)  # its waiting polls end with an error; new ones fail at once
        before = transport.polls[first]
        for i in range(1, 21):
            await w.append(b"e%d" % i)
            entry = await asyncio.wait_for(anext(tail), 10)
            assert (entry.entry_id, entry.payload) == (i, b"e%d" % i)
        assert transport.polls[first] - before <= 2, (first, transport.polls)
        await tail.aclose()
        transport.down.discard(first)
        await w.close()
