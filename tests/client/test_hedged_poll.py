"""A tail's long poll built from callbacks (``client/hedged_poll.py``, ``long_poll_lac_soon``).

- ``HedgedPoll`` alone (a scripted ``start``, no transport; polls sent in the loop turn
  after it is made, none if it is cancelled before): the first answer carrying the
  entry wins and the other replica's poll is withdrawn; an answer without it is kept
  while the other goes on; an error falls through to the other replica (and is reported
  through ``on_failed``); the deadline resolves with the best answer kept (the old LAC)
  or None, reporting each silent bookie; a bug fails the poll; cancelling the poll, or
  the task awaiting it, withdraws every replica's poll; polls start in the given order.
- ``BinaryTransport.long_poll_lac_soon`` against a scripted binary bookie: the answer
  comes decoded to the callback; a withdrawn poll's answer never does; its deadline
  answers ``DeadlineExceededError``; a link that closes answers ``UnavailableError``.
- ``LedgerReader.tail`` over a transport with ``long_poll_lac_soon``: entries arrive, and
  a consumer cancelled while the tail waits leaves no poll behind.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from scriba.client import Client, ClientConfig
from scriba.client.binary_transport import BinaryTransport
from scriba.client.driver import DriverConfig
from scriba.client.grpc_reads import LONG_POLL_MARGIN_S
from scriba.client.hedged_poll import HedgedPoll
from scriba.client.transport import LacAnswer, LacResult, TransportConfig, Withdraw, poll_in_task
from scriba.errors import DeadlineExceededError, UnavailableError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.connect import connect
from scriba.proto import binary as wire
from scriba.testing.sim import StorageTransport, register_bookies
from scriba.testing.waiting import eventually

A, B = BookieId("a"), BookieId("b")
LONG_S = 60.0  # a deadline no test reaches


class Script:
    """A scripted ``start``: notes each poll started and withdrawn, answers on demand."""

    def __init__(self, refuse: set[BookieId] | None = None) -> None:
        self.started: list[BookieId] = []
        self.withdrawn: list[BookieId] = []
        self.answers: dict[BookieId, LacAnswer] = {}
        self.failed: list[tuple[BookieId, type[BaseException]]] = []
        self.refuse = refuse or set()

    def start(self, bookie_id: BookieId, on_answer: LacAnswer) -> Withdraw:
        self.started.append(bookie_id)
        if bookie_id in self.refuse:
            raise UnavailableError(f"{bookie_id} is down")
        self.answers[bookie_id] = on_answer
        return lambda: self.withdrawn.append(bookie_id)

    def on_failed(self, bookie_id: BookieId, exc: BaseException) -> None:
        self.failed.append((bookie_id, type(exc)))

    async def poll(self, bookies: list[BookieId], previous_lac: int = 4, deadline_s: float = LONG_S) -> HedgedPoll:
        """A poll, once its replicas' polls are sent (not in the caller's turn: the next one)."""
        poll = HedgedPoll(lambda: bookies, EntryId(previous_lac), self.start, self.on_failed, deadline_s)
        assert self.started == [], "sent in the turn that made the poll"
        await eventually(lambda: len(self.started) == len(bookies), what="the replicas' polls sent")
        return poll


def carrying(lac: int) -> LacResult:
    return LacResult(EntryId(lac), EntryId(lac), piggybacked_entries=(b"entry",))


def bare(lac: int) -> LacResult:
    return LacResult(EntryId(lac), EntryId(lac))


async def test_the_first_carrying_answer_wins_and_the_other_poll_is_withdrawn() -> None:
    s = Script()
    poll = await s.poll([A, B])
    assert s.started == [A, B] and poll.waiting == [A, B]  # sent at once, in order
    s.answers[B](carrying(5))
    assert poll.done() and poll.result() == carrying(5)
    assert s.withdrawn == [A] and poll.waiting == []
    s.answers[A](carrying(6))  # a late answer changes nothing
    assert await poll == carrying(5) and s.failed == []


async def test_an_answer_without_the_entry_is_kept_while_the_other_replica_goes_on() -> None:
    s = Script()
    poll = await s.poll([A, B])
    s.answers[A](bare(4))  # A's time was up: its LAC has not moved
    assert not poll.done() and poll.waiting == [B]
    s.answers[B](carrying(5))
    assert await poll == carrying(5)
    s2 = Script()
    poll2 = await s2.poll([A, B])
    s2.answers[A](bare(5))  # LAC past previous, the entry not stored there yet
    s2.answers[B](bare(4))
    assert await poll2 == bare(5), "the answer with the highest LAC"


async def test_an_error_falls_through_to_the_other_replica() -> None:
    s = Script()
    poll = await s.poll([A, B])
    s.answers[A](UnavailableError("a went away"))
    assert not poll.done() and s.failed == [(A, UnavailableError)]
    s.answers[B](carrying(5))
    assert await poll == carrying(5) and s.withdrawn == []


async def test_every_replica_failing_resolves_none() -> None:
    s = Script(refuse={A})
    poll = await s.poll([A, B])
    assert s.started == [A, B], "a bookie that refuses the poll does not stop the next one's"
    assert not poll.done()
    s.answers[B](DeadlineExceededError("b is silent"))
    assert await poll is None
    assert s.failed == [(A, UnavailableError), (B, DeadlineExceededError)]


async def test_the_deadline_resolves_with_the_old_lac_or_none_and_reports_the_silent_bookies() -> None:
    s = Script()
    poll = await s.poll([A, B], deadline_s=0.05)
    s.answers[A](bare(4))
    assert await asyncio.wait_for(poll, 10) == bare(4)  # the old LAC, as a poll whose time is up
    assert s.withdrawn == [B] and s.failed == [(B, TimeoutError)]
    s2 = Script()
    poll2 = await s2.poll([A, B], deadline_s=0.05)
    assert await asyncio.wait_for(poll2, 10) is None
    assert s2.withdrawn == [A, B] and s2.failed == [(A, TimeoutError), (B, TimeoutError)]


async def test_a_bug_fails_the_poll_with_it_and_withdraws_the_others() -> None:
    s = Script()
    poll = await s.poll([A, B])
    s.answers[A](RuntimeError("a bug in the transport"))
    with pytest.raises(RuntimeError, match="a bug"):
        await poll
    assert s.withdrawn == [B]


async def test_cancelling_the_poll_or_its_caller_withdraws_every_replica_poll() -> None:
    s = Script()
    poll = await s.poll([A, B])
    assert poll.cancel()
    assert sorted(s.withdrawn) == [A, B] and poll.cancelled()
    assert not poll.cancel(), "once"
    s.answers[A](carrying(5))  # an answer after that goes nowhere
    assert s.failed == []
    # the task awaiting the poll is cancelled: asyncio cancels the future it waits on
    s2 = Script()
    poll2 = await s2.poll([A, B])
    awaiting = asyncio.Event()
    waiter = asyncio.get_running_loop().create_task(_await(poll2, awaiting))
    await asyncio.wait_for(awaiting.wait(), 10)  # set in the step that then awaits the poll
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert sorted(s2.withdrawn) == [A, B] and poll2.cancelled()


async def _await(poll: HedgedPoll, awaiting: asyncio.Event) -> LacResult | None:
    awaiting.set()
    return await poll


async def test_a_poll_cancelled_before_its_turn_sends_nothing() -> None:
    s = Script()
    poll = HedgedPoll(lambda: [A, B], EntryId(4), s.start, s.on_failed, LONG_S)
    assert poll.cancel()
    other = await s.poll([A])  # made after it, so sent after the cancelled one's turn
    assert s.started == [A], "the cancelled poll sent nothing"
    other.cancel()


async def test_one_replica_resolves_with_its_answer_whatever_it_carries() -> None:
    s = Script()
    poll = await s.poll([A])
    s.answers[A](bare(4))
    assert await poll == bare(4)


# --- the binary transport's callback poll ---------------------------------------------------
class LacBookie:
    """A scripted binary bookie: notes each READ_LAC; answers one when told."""

    def __init__(self) -> None:
        self.polls: asyncio.Queue[int] = asyncio.Queue()  # request ids
        self.writer: asyncio.StreamWriter | None = None
        self.server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(wire.HEADER_SIZE + 2)  # HELLO
        writer.write(b"".join(bytes(p) for p in wire.encode_hello_ok(0, wire.VERSION)))
        self.writer = writer
        frames = wire.FrameReader()
        while chunk := await reader.read(65536):
            for header, _body in frames.feed(chunk):
                if header.type == wire.FrameType.READ_LAC:
                    self.polls.put_nowait(header.request_id)
        writer.close()

    def answer(self, rid: int, lac: int, entries: tuple[bytes, ...] = ()) -> None:
        assert self.writer is not None
        self.writer.write(b"".join(bytes(p) for p in wire.encode_lac_answer(
            rid, 0, lac, lac, False, "", b"", list(entries))))

    async def __aenter__(self) -> BinaryTransport:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        address = f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        self.transport = BinaryTransport(lambda _: "127.0.0.1:1", TransportConfig(read_timeout_s=5.0),
                                         resolve_binary=lambda _: address)
        await self.transport._link(A)  # dialled first: the polls then go over the open link
        return self.transport

    async def __aexit__(self, *exc: object) -> None:
        await self.transport.close()
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


def _collect() -> tuple[list[LacResult | BaseException], Callable[[LacResult | BaseException], None]]:
    got: list[LacResult | BaseException] = []
    return got, got.append


async def test_binary_long_poll_soon_answers_withdraws_and_fails_by_callback() -> None:
    bookie = LacBookie()
    async with bookie as t:
        got, on_answer = _collect()
        t.long_poll_lac_soon(A, LedgerId(7), EntryId(4), on_answer, wait_s=30.0, piggyback_entries_max=8)
        rid = await asyncio.wait_for(bookie.polls.get(), 10)
        bookie.answer(rid, 5, (b"five",))
        await eventually(lambda: bool(got), what="the answer")
        assert got == [LacResult(EntryId(5), EntryId(5), piggybacked_entries=(b"five",))]
        # withdrawn before its answer: the answer is dropped
        late, on_late = _collect()
        withdraw = t.long_poll_lac_soon(A, LedgerId(7), EntryId(5), on_late, wait_s=30.0)
        rid = await asyncio.wait_for(bookie.polls.get(), 10)
        withdraw()
        bookie.answer(rid, 6)
        got.clear()
        t.long_poll_lac_soon(A, LedgerId(7), EntryId(5), on_answer, wait_s=30.0)  # answered after it
        rid2 = await asyncio.wait_for(bookie.polls.get(), 10)
        bookie.answer(rid2, 6)
        await eventually(lambda: bool(got), what="the next poll's answer")
        assert late == [], "a withdrawn poll's answer reaches nobody"
        # a link that closes answers every waiting poll UNAVAILABLE
        t.long_poll_lac_soon(A, LedgerId(7), EntryId(6), on_answer, wait_s=30.0)
        await asyncio.wait_for(bookie.polls.get(), 10)
        got.clear()
        assert bookie.writer is not None
        bookie.writer.transport.abort()
        await eventually(lambda: bool(got), what="the poll failing with its link")
        assert len(got) == 1 and isinstance(got[0], UnavailableError)


async def test_binary_long_poll_soon_deadline_answers_deadline_exceeded() -> None:
    bookie = LacBookie()
    async with bookie as t:
        got, on_answer = _collect()
        t.long_poll_lac_soon(A, LedgerId(7), EntryId(4), on_answer, wait_s=0.01)
        await asyncio.wait_for(bookie.polls.get(), 10)  # never answered
        await eventually(lambda: bool(got), timeout_s=LONG_POLL_MARGIN_S + 20, what="the poll's deadline")
        assert len(got) == 1 and isinstance(got[0], DeadlineExceededError)


# --- the tail over a transport with long_poll_lac_soon ---------------------------------------
class SoonTransport(StorageTransport):
    """In-process bookies whose long polls go through ``long_poll_lac_soon`` (in a task
    each); notes the polls outstanding."""

    def __init__(self, bookie_ids: list[str]) -> None:
        super().__init__(bookie_ids)
        self.outstanding: set[int] = set()
        self.issued = 0

    def long_poll_lac_soon(self, bookie_id: BookieId, ledger_id: LedgerId, previous_lac: EntryId,
                           on_answer: LacAnswer, *, wait_s: float, piggyback_entries_max: int = 1,
                           master_key: bytes = b"") -> Withdraw:
        self.issued += 1
        n = self.issued
        self.outstanding.add(n)

        def answered(answer: LacResult | BaseException) -> None:
            self.outstanding.discard(n)
            on_answer(answer)

        cancel = poll_in_task(self.long_poll_lac(bookie_id, ledger_id, previous_lac, wait_s=wait_s,
                                                 piggyback_entries_max=piggyback_entries_max,
                                                 master_key=master_key), answered)

        def withdraw() -> None:
            self.outstanding.discard(n)
            cancel()

        return withdraw


@pytest.fixture
async def soon_client() -> AsyncIterator[tuple[Client, SoonTransport]]:
    bookies = ["bk0", "bk1", "bk2"]
    transport = SoonTransport(bookies)
    uri = f"memory://hedged-{uuid.uuid4().hex}"
    store = await connect(uri)
    await register_bookies(store, bookies)
    cfg = ClientConfig(add_timeout_s=2.0, bookie_wait_s=2.0,
                       driver=DriverConfig(read_timeout_s=2.0, metadata_timeout_s=5.0, long_poll_s=30.0))
    client = await Client.connect(uri, store=store, transport=transport, config=cfg)
    yield client, transport
    await client.close()
    await store.close()


async def test_a_tail_cancelled_while_waiting_leaves_no_poll_behind(soon_client: tuple[Client, SoonTransport]) -> None:
    client, transport = soon_client
    w = await client.create_ledger(3, 3, 2)
    r = await client.open_ledger(w.ledger_id, recovery=False)
    tail = r.tail(0)
    for i in range(3):
        await w.append(b"e%d" % i)
        entry = await asyncio.wait_for(anext(tail), 10)
        assert (entry.entry_id, entry.payload) == (i, b"e%d" % i)
    waiter = asyncio.get_running_loop().create_task(anext(tail))  # waits for entry 3: polls out
    await eventually(lambda: len(transport.outstanding) == 4, what="two polls at two bookies each")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await eventually(lambda: not transport.outstanding, what="every poll withdrawn")
    await tail.aclose()
    r2 = await client.open_ledger(w.ledger_id, recovery=False)  # and a new tail polls afresh
    tail2 = r2.tail(3)
    waiter = asyncio.get_running_loop().create_task(anext(tail2))
    await eventually(lambda: len(transport.outstanding) == 4, what="the new tail's polls")
    await w.append(b"e3")
    assert (await asyncio.wait_for(waiter, 10)).entry_id == 3
    await tail2.aclose()
    await eventually(lambda: not transport.outstanding, what="the closed tail's polls withdrawn")
    await w.close()
