"""The stream layer on the public client API, against in-process bookies and ``memory://``.

Fast stand-ins for real processes (those run in ``test_stream_processes.py``):
``scriba.testing.sim.StorageTransport`` (in-memory bookie storage per bookie) and a ``memory://``
store; each "process" is its own Client on its own store session.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from stream_checks import check_stream

from scriba.client import ClientConfig
from scriba.client.driver import DriverConfig
from scriba.errors import (
    ConfigError,
    CursorRegressionError,
    InvalidPositionError,
    NamespaceNotEmptyError,
    NamespaceNotFoundError,
    NoSuchLedgerError,
    PositionOutOfRangeError,
    PositionTruncatedError,
    RecordSetCorruptError,
    RecordTooLargeError,
    StreamNotFoundError,
    StreamWriterClosedError,
    TooManyRequestsError,
    WriterFencedError,
    WriterLockedError,
)
from scriba.stream import (
    Namespace,
    Position,
    ReaderOptions,
    Record,
    StreamReader,
    WriterOptions,
    list_namespaces,
    open_namespace,
)
from scriba.stream import writer as writer_module
from scriba.stream import writer_steps as writer_steps_module
from scriba.stream.segments import SegmentState
from scriba.testing.sim import InProcessSite

BOOKIES = [f"bk{i}" for i in range(4)]
CONFIG = ClientConfig(
    add_timeout_s=2.0, bookie_wait_s=2.0,
    driver=DriverConfig(read_timeout_s=2.0, metadata_timeout_s=5.0, long_poll_s=0.2),
)
FAST_LOCK = WriterOptions(lock_timeout_s=0.5)


Env = InProcessSite  # each client() is a "process"; crash() ends its session uncleanly


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    uri = f"memory://stream-{uuid.uuid4().hex[:10]}"
    e = Env(uri, BOOKIES, CONFIG)
    await e.start()
    try:
        yield e
    finally:
        await e.close()


async def _ns(env: Env, **settings: Any) -> Namespace:
    client = await env.client()
    return await open_namespace(client, "prod/payments", create=True, ensemble_size=3,
                                write_quorum_size=3, ack_quorum_size=2, **settings)


async def read_all(ns: Namespace, name: str, start: Any = "earliest") -> list[Record]:
    """Every record from ``start`` to the end of a stream whose last segment is closed."""
    info = await ns.info(name)
    last = info.record.last_segment
    assert last is not None and last.state is SegmentState.CLOSED, "read_all needs a closed stream"
    ends = [s.last_position for s in info.record.segments if s.last_position is not None]
    final = ends[-1] if ends else None
    out: list[Record] = []
    reader = await ns.open_reader(name, start)
    try:
        while final is not None and (not out or out[-1].position < final):
            rec = await reader.read_next(timeout_s=5.0)
            if rec is None:
                break
            out.append(rec)
        assert await reader.read_next(timeout_s=0.02) is None
    finally:
        await reader.close()
    assert all(r.position < last.end for r in out)
    return out


def _current_ledger(writer: Any) -> Any:
    """The ledger of the segment a writer writes (to make it die mid-stream, as a crash does)."""
    return writer._ledgers[writer.segment_seq]


def pairs(records: Sequence[Record]) -> list[tuple[Position, bytes]]:
    return [(r.position, r.payload) for r in records]


# --- basics --------------------------------------------------------------------------------
async def test_append_read_positions_headers_and_record_sets(env: Env) -> None:
    ns = await _ns(env)
    w = await ns.open_writer("orders", create=True)
    p0 = await w.append(b"first", headers={"origin": b"eu"})
    many = await w.append_many([b"a", b"b", (b"c", {"k": b"v"})])
    futures = [w.append_async(b"x%d" % i) for i in range(100)]
    later = await asyncio.gather(*futures)
    await w.close()
    assert p0 == Position(w.segment_seq, 0, 0)
    # append_many packs one record set: one entry, slots 0..2
    assert [(p.entry_id, p.slot) for p in many] == [(1, 0), (1, 1), (1, 2)]
    # appends queued in one loop turn share a record set
    assert len({p.entry_id for p in later}) < len(later)
    assert list(later) == sorted(later)
    records = await read_all(ns, "orders")
    assert [r.payload for r in records] == [b"first", b"a", b"b", b"c"] + [b"x%d" % i for i in range(100)]
    assert dict(records[0].headers) == {"origin": b"eu"} and dict(records[3].headers) == {"k": b"v"}
    assert [r.position for r in records] == [p0, *many, *later]
    assert all(r.publish_time_ms > 0 for r in records)
    assert records == sorted(records, key=lambda r: r.position)
    # positions resume: start at a slot in the middle of a set
    tail = await read_all(ns, "orders", start=many[1])
    assert [r.payload for r in tail][:2] == [b"b", b"c"]
    assert next(r.payload for r in await read_all(ns, "orders", start=str(many[2].successor()))) == b"x0"


async def test_append_many_larger_than_the_waiting_bound_queues_as_room_frees(env: Env) -> None:
    ns = await _ns(env)
    w = await ns.open_writer("big", create=True, options=WriterOptions(records_waiting_max=10, sets_inflight_max=2),
                             record_set_bytes_max=1024)
    payloads = [b"b%03d" % i for i in range(100)]
    positions = await w.append_many(payloads)
    assert positions == sorted(positions) and len(set(positions)) == 100
    single = await w.append(b"after")
    assert single > positions[-1]
    await w.close()
    assert [r.payload for r in await read_all(ns, "big")] == [*payloads, b"after"]


async def test_rolls_with_tiny_limits_reader_crosses_every_boundary(env: Env) -> None:
    ns = await _ns(env)
    w = await ns.open_writer("rolls", create=True, segment_records_max=3, record_set_bytes_max=1024)
    tailer = await ns.open_reader("rolls", "earliest")
    confirmed: dict[Position, bytes] = {}
    payloads = [b"r%04d" % i + b"." * (i % 50) for i in range(1000)]
    for start in range(0, len(payloads), 3):  # 3 records per set, 3 per segment
        chunk = payloads[start:start + 3]
        positions = await asyncio.gather(*[w.append_async(p) for p in chunk])
        confirmed.update(zip(positions, chunk, strict=True))
    await w.close()
    info = await ns.info("rolls")
    segments = info.record.segments
    assert len(segments) >= 300
    assert all(s.state is SegmentState.CLOSED for s in segments)
    assert sum(s.summary.record_count for s in segments) == len(payloads)
    seen = []
    while len(seen) < len(payloads):
        rec = await tailer.read_next(timeout_s=5.0)
        assert rec is not None, f"tailing reader stopped after {len(seen)} records"
        seen.append(rec)
    await tailer.close()
    catch_up = await read_all(ns, "rolls")
    result = check_stream({"tailer": pairs(seen), "catch-up": pairs(catch_up)}, confirmed, attempted=payloads)
    assert result.ok, result.explain()
    assert [r.payload for r in catch_up] == payloads
    assert len({r.position.segment_seq for r in catch_up}) >= 300


async def test_the_writers_lac_push_delay_holds_for_every_segment(env: Env) -> None:
    """``WriterOptions.lac_push_delay_s`` is the delay of every segment's ledger writer,
    the first and each rolled one; without it, the client's (0 here)."""
    ns = await _ns(env)
    w = await ns.open_writer("lacdelay", create=True, segment_records_max=2,
                             options=WriterOptions(lac_push_delay_s=0.25))
    seen = set()
    for i in range(7):
        await w.append(b"%d" % i)
        assert w.current_ledger is not None
        seen.add((w.current_ledger.ledger_id, w.current_ledger.explicit_lac_delay_s))
    await w.close()
    assert len(seen) >= 3 and {delay for _, delay in seen} == {0.25}, seen
    plain = await ns.open_writer("lacdelay")
    assert plain.current_ledger is not None and plain.current_ledger.explicit_lac_delay_s == 0.0
    await plain.close()


async def test_append_many_nowait_sends_at_once_and_queues_all_or_nothing(env: Env) -> None:
    """``append_many_nowait`` (an RSM leader's group commit) hands its record set to the
    ledger before it returns (no loop turn), and resolves to the positions in order; a
    batch that does not fit now is refused whole (TooManyRequestsError, nothing queued),
    as is a bad record (typed error)."""
    ns = await _ns(env)
    w = await ns.open_writer("nowait", create=True, options=WriterOptions(records_waiting_max=4))
    assert w.current_ledger is not None
    before = w.current_ledger.pending
    future = w.append_many_nowait([b"a", b"b", b"c"])
    assert w.current_ledger.pending == before + 1, "the set was appended to the ledger before the call returned"
    positions = await asyncio.wait_for(future, 10)
    assert [(p.entry_id, p.slot) for p in positions] == [(positions[0].entry_id, s) for s in range(3)]
    with pytest.raises(TooManyRequestsError):
        w.append_many_nowait([b"x"] * 5)
    with pytest.raises(RecordTooLargeError):
        w.append_many_nowait([b"y", b"z" * (w.settings.record_bytes_max + 1)])
    assert w.pending == 0, "nothing queued by the refused calls"
    assert await asyncio.wait_for(w.append_many_nowait([]), 1) == []
    await w.close()
    assert [r.payload for r in await read_all(ns, "nowait")] == [b"a", b"b", b"c"]


async def test_reader_options_are_checked(env: Env) -> None:
    """A bad ``ReaderOptions`` is a ConfigError naming the field, before anything is read;
    ``tail_poll_replicas`` 1 tails like 2 (one bookie per long poll instead of two)."""
    ns = await _ns(env)
    w = await ns.open_writer("opts", create=True)
    for bad, field in ((ReaderOptions(tail_poll_replicas=3), "tail_poll_replicas"),
                       (ReaderOptions(read_ahead_entries=0), "read_ahead_entries")):
        with pytest.raises(ConfigError, match=field):
            await ns.open_reader("opts", "earliest", options=bad)
    reader = await ns.open_reader("opts", "earliest", options=ReaderOptions(tail_poll_replicas=1))
    positions = [await w.append(b"%d" % i) for i in range(3)]
    assert [(await reader.read_next(10.0)).position for _ in range(3)] == positions  # type: ignore[union-attr]
    await reader.close()
    await w.close()


async def test_roll_by_bytes_and_record_set_split(env: Env) -> None:
    ns = await _ns(env)
    w = await ns.open_writer("bytes", create=True, segment_bytes_max=4096, record_set_bytes_max=1024)
    payloads = [bytes([65 + i % 26]) * 300 for i in range(60)]
    positions = await w.append_many(payloads)
    await w.close()
    # 60 x 306 bytes cannot share one 1 KiB set: at most 3 per set
    per_entry: dict[tuple[int, int], int] = {}
    for p in positions:
        per_entry[(p.segment_seq, p.entry_id)] = per_entry.get((p.segment_seq, p.entry_id), 0) + 1
    assert max(per_entry.values()) == 3
    assert len({p.segment_seq for p in positions}) > 1
    assert [r.payload for r in await read_all(ns, "bytes")] == payloads


# --- single writer ------------------------------------------------------------------------
async def test_second_writer_waits_for_the_lock_then_fences_after_session_loss(env: Env) -> None:
    ns_a = await _ns(env)
    ns_b = await _ns(env)
    a = await ns_a.open_writer("one", create=True)
    first = await a.append(b"a0")
    with pytest.raises(WriterLockedError):
        await ns_b.open_writer("one", options=FAST_LOCK)
    await env.crash(ns_a.client)  # A's session ends: its lock is gone
    b = await ns_b.open_writer("one", options=FAST_LOCK)
    assert b.token > a.token
    with pytest.raises((WriterFencedError, StreamWriterClosedError)):
        await a.append(b"a-late")
    await b.append(b"b0")
    await b.close()
    got = [r.payload for r in await read_all(ns_b, "one")]
    assert got == [b"a0", b"b0"] and first.segment_seq == 0


async def test_old_writer_fenced_through_ledger_and_cas_when_it_does_not_notice(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A paused writer (its lock loss not yet seen) is fenced by recovery and by the token CAS."""
    ns_a = await _ns(env, segment_records_max=1000)
    ns_b = await _ns(env)
    a = await ns_a.open_writer("pause", create=True)
    await a.append_many([b"a%d" % i for i in range(5)])
    # Simulate the pause: A never hears about its lost lock.
    a._leadership.lost = asyncio.Event()
    await env.crash(ns_a.client)
    b = await ns_b.open_writer("pause", options=FAST_LOCK)
    with pytest.raises(WriterFencedError):
        await a.append(b"a-after")
    with pytest.raises(WriterFencedError):
        await a.append(b"a-after-2")
    await b.append(b"b0")
    await b.close()
    assert [r.payload for r in await read_all(ns_b, "pause")] == [b"a0", b"a1", b"a2", b"a3", b"a4", b"b0"]


async def test_staged_ledgers_adopted_once_in_one_change(env: Env) -> None:
    """Exactly-once batch writes' stream step: staged ledgers become segments in order by one
    CAS; a repeated adopt changes nothing; a crashed writer's open segment is closed first at
    its recovered end; a staged ledger never adopted (an aborted task's) stays out of the stream."""
    ns_a = await _ns(env)
    ns = await _ns(env)
    a = await ns_a.open_writer("eo", create=True)
    await a.append_many([b"w0", b"w1"])
    await env.crash(ns_a.client)  # its segment is still OPEN
    staged = [await ns.stage("eo", [(b"t%d-%d" % (t, i), {"t": b"%d" % t}) for i in range(n)])
              for t, n in ((0, 2500), (1, 3))]
    aborted = await ns.stage("eo", [(b"never", {})])
    record = await ns.adopt("eo", staged, options=FAST_LOCK)
    assert [s.ledger_id for s in record.segments[-2:]] == staged
    assert [s.summary.record_count for s in record.segments] == [2, 2500, 3]
    assert all(s.state is SegmentState.CLOSED for s in record.segments)
    again = await ns.adopt("eo", staged, options=FAST_LOCK)  # a duplicate commit message
    assert again.segments == record.segments and again.next_seq == record.next_seq
    got = await read_all(ns, "eo")
    want = [b"w0", b"w1", *[b"t0-%d" % i for i in range(2500)], *[b"t1-%d" % i for i in range(3)]]
    assert [r.payload for r in got] == want and got[2].headers == {"t": b"0"}
    assert aborted not in {s.ledger_id for s in again.segments}
    b = await ns.open_writer("eo", options=FAST_LOCK)  # writing goes on after the adopted segments
    after = await b.append(b"after")
    await b.close()
    assert after.segment_seq == record.next_seq and (await read_all(ns, "eo"))[-1].payload == b"after"


async def test_old_writer_roll_is_fenced_by_token(env: Env) -> None:
    ns_a = await _ns(env)
    ns_b = await _ns(env)
    a = await ns_a.open_writer("rollfence", create=True, segment_records_max=2)
    await a.append(b"a0")
    a._leadership.lost = asyncio.Event()
    await env.crash(ns_a.client)
    b = await ns_b.open_writer("rollfence", options=FAST_LOCK)
    futures = [a.append_async(b"late%d" % i) for i in range(3)]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(r, WriterFencedError | StreamWriterClosedError) for r in results), results
    await b.close()
    assert [r.payload for r in await read_all(ns_b, "rollfence")] == [b"a0"]


async def test_writers_racing_to_open_exactly_one_holds_tokens_increase(env: Env) -> None:
    ns_list = [await _ns(env) for _ in range(3)]
    await ns_list[0].create_stream("race")
    tokens: list[int] = []
    for _trial in range(50):
        opened = await asyncio.gather(
            *[ns.open_writer("race", options=WriterOptions(lock_timeout_s=0.1)) for ns in ns_list],
            return_exceptions=True,
        )
        winners = [w for w in opened if not isinstance(w, BaseException)]
        assert len(winners) == 1, opened
        assert all(isinstance(w, WriterLockedError) for w in opened if isinstance(w, BaseException))
        tokens.append(winners[0].token)
        await winners[0].append(b"t%d" % _trial)
        await winners[0].close()
    assert tokens == sorted(tokens) and len(set(tokens)) == 50


async def test_an_open_cancelled_after_its_lock_claim_landed_leaves_the_lock_free(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller gives up (a deadline, a cancelled task) just after the claim was created:
    the claim must not hold the stream for nobody until the session ends."""
    from scriba.meta.election import Election

    ns = await _ns(env)
    await ns.create_stream("claimed")
    landed = asyncio.Event()
    real_campaign = Election.campaign

    async def campaign_then_stall(self: Election, candidate: str, value: bytes = b"") -> Any:
        await real_campaign(self, candidate, value)  # the claim is in the store now
        landed.set()
        await asyncio.Event().wait()  # the answer never reaches the caller

    monkeypatch.setattr(Election, "campaign", campaign_then_stall)
    opening = asyncio.ensure_future(ns.open_writer("claimed"))
    await landed.wait()
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    monkeypatch.undo()
    other = await (await _ns(env)).open_writer("claimed", options=FAST_LOCK)  # free at once
    await other.append(b"x")
    await other.close()


# --- crash at each step of a roll and of a truncation ---------------------------------------
class Crash(Exception):
    """The process dies here (what follows in that process never happens)."""


ROLL_STEPS = ["after_create_ledger", "after_add_segment", "after_switch", "after_old_ledger_close"]


@pytest.mark.parametrize("step", ROLL_STEPS)
async def test_crash_at_each_roll_step_next_writer_and_readers_agree(
    env: Env, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    from scriba.stream.catalog import Catalog
    from scriba.stream.segments import open_segments

    ns_a = await _ns(env)
    a = await ns_a.open_writer("crashy", create=True, segment_records_max=4)
    real_create = writer_steps_module.create_segment_ledger
    real_update = Catalog.update_stream
    real_close_segment = writer_module.StreamWriter._close_segment
    real_close = writer_module.close_segment

    async def create(*args: Any, **kwargs: Any) -> Any:
        ledger = await real_create(*args, **kwargs)
        if step == "after_create_ledger":
            raise Crash()
        return ledger

    async def update(self: Any, *args: Any) -> Any:
        record = await real_update(self, *args)
        if step == "after_add_segment" and len(open_segments(record)) == 2:
            raise Crash()  # the CAS landed; nothing after it happens
        return record

    async def close_segment_method(self: Any, segment: Any) -> None:
        if step == "after_switch":
            raise Crash()
        await real_close_segment(self, segment)

    def close_seg(*args: Any, **kwargs: Any) -> Any:
        if step == "after_old_ledger_close":
            raise Crash()
        return real_close(*args, **kwargs)

    monkeypatch.setattr(writer_steps_module, "create_segment_ledger", create)
    monkeypatch.setattr(Catalog, "update_stream", update)
    monkeypatch.setattr(writer_module.StreamWriter, "_close_segment", close_segment_method)
    monkeypatch.setattr(writer_module, "close_segment", close_seg)

    confirmed: dict[Position, bytes] = {}
    attempted = [b"c%d" % i for i in range(8)]
    results = await asyncio.gather(*[a.append_async(p) for p in attempted], return_exceptions=True)
    for p, r in zip(attempted, results, strict=True):
        if isinstance(r, Position):
            confirmed[r] = p
    # let the roll reach the crash point
    async with asyncio.timeout(5.0):  # the roll reaches the crash point
        while a.error is None:
            await asyncio.sleep(0.01)
    assert "Crash" in str(a.error)
    await _current_ledger(a).abort()
    for task in list(a._tasks):  # the process dies: its tasks (the failed writer's resign) end with it
        task.cancel()
    await env.crash(ns_a.client)
    monkeypatch.undo()
    ns_b = await _ns(env)
    b = await ns_b.open_writer("crashy", options=WriterOptions(lock_timeout_s=2.0))
    after = await b.append(b"after")
    await b.close()
    assert len(confirmed) >= 4, results
    got = await read_all(ns_b, "crashy")
    again = await read_all(ns_b, "crashy")
    result = check_stream({"r1": pairs(got), "r2": pairs(again)}, {**confirmed, after: b"after"},
                          attempted=[*attempted, b"after"])
    assert result.ok, result.explain()
    assert got[-1].payload == b"after"
    info = await ns_b.info("crashy")
    assert all(s.state is SegmentState.CLOSED for s in info.record.segments)


@pytest.mark.parametrize("step", ["after_cas", "after_deletes"])
async def test_crash_in_truncation_is_finished_later(env: Env, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    from scriba.stream import retention as retention_module

    ns = await _ns(env)
    w = await ns.open_writer("trunc", create=True, segment_records_max=2)
    positions = await w.append_many([b"t%d" % i for i in range(4)])
    for i in range(4, 10):
        positions.append(await w.append(b"t%d" % i))
    await w.close()
    before = (await ns.info("trunc")).record
    real_delete = retention_module.delete_ledgers
    real_finish = retention_module.finish_deletes

    async def delete(client: Any, ids: Any) -> Any:
        if step == "after_cas":
            raise Crash()
        return await real_delete(client, ids)

    def finish(*args: Any) -> Any:
        if step == "after_deletes":
            raise Crash()
        return real_finish(*args)

    monkeypatch.setattr(retention_module, "delete_ledgers", delete)
    monkeypatch.setattr(retention_module, "finish_deletes", finish)
    cut = positions[6]
    with pytest.raises(Crash):
        await ns.truncate("trunc", before=cut)
    monkeypatch.undo()
    mid = (await ns.info("trunc")).record
    assert mid.truncated_before == cut and mid.deleting
    with pytest.raises(PositionTruncatedError):
        await ns.open_reader("trunc", positions[0])
    assert next(r.payload for r in await read_all(ns, "trunc")) == b"t6"
    await ns.truncate("trunc", before=cut)  # the next truncation finishes the work
    done = (await ns.info("trunc")).record
    assert done.deleting == ()
    dropped = {s.ledger_id for s in before.segments} - {s.ledger_id for s in done.segments}
    assert dropped
    for ledger_id in dropped:
        with pytest.raises(NoSuchLedgerError):
            await ns.client.ledger_metadata(ledger_id)


# --- readers ------------------------------------------------------------------------------
async def test_reader_tails_open_segment_and_latest_and_timestamp(env: Env) -> None:
    ns = await _ns(env)
    w = await ns.open_writer("tail", create=True, segment_records_max=50)
    olds = await w.append_many([b"old%d" % i for i in range(10)])
    # "latest" starts after the last add confirmed as the bookies know it (an idle
    # writer sends it explicitly after explicit_lac_delay_s): wait for that
    async with asyncio.timeout(5.0):
        while await ns._end((await ns.info("tail")).record) <= olds[-1]:
            await asyncio.sleep(0.02)
    latest = await ns.open_reader("tail", "latest")
    earliest = await ns.open_reader("tail")
    assert (await earliest.read_next(2.0)).payload == b"old0"  # type: ignore[union-attr]
    assert await latest.read_next(0.3) is None
    p = await w.append(b"new")
    rec = await latest.read_next(5.0)
    assert rec is not None and rec.payload == b"new" and rec.position == p
    await asyncio.sleep(0.01)
    cut_ms = (await w.append(b"stamp")).segment_seq  # noqa: F841 - publish time below
    await w.close()
    records = await read_all(ns, "tail")
    stamp = next(r for r in records if r.payload == b"stamp")
    by_time = await read_all(ns, "tail", start=stamp.publish_time_ms)
    assert by_time[0].publish_time_ms >= stamp.publish_time_ms
    assert b"stamp" in [r.payload for r in by_time] and b"old0" not in [r.payload for r in by_time]
    assert await read_all(ns, "tail", start=10**15) == []
    await latest.close()
    await earliest.close()


async def test_closing_a_reader_while_it_stops_its_tail_does_not_lose_the_close(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() lands while the reader is stopping its tail of a segment that just closed:
    the reader must stop, not swallow the cancellation and wait for the next segment forever."""
    ns = await _ns(env)
    w = await ns.open_writer("closing", create=True)
    first = await w.append(b"a")
    stopping = asyncio.Event()

    async def slow_to_stop(self: StreamReader, reader: Any, segment: Any) -> None:
        try:
            await asyncio.Event().wait()  # tails without delivering
        except asyncio.CancelledError:
            stopping.set()  # the segment closed: the reader is stopping this tail now
            await asyncio.sleep(0.05)  # a tail that takes a moment to stop
            raise

    monkeypatch.setattr(StreamReader, "_tail_entries", slow_to_stop)
    reader = await ns.open_reader("closing", first)
    await w.close()  # closes the segment the reader tails
    async with asyncio.timeout(5.0):
        await stopping.wait()
    closing = asyncio.ensure_future(reader.close())  # waited on from outside: a timeout here
    done, _ = await asyncio.wait({closing}, timeout=5.0)  # must not be swallowed by close()
    assert closing in done, "reader.close() hangs: the reader lost its cancellation and reads on"


async def test_reader_after_failover_sees_exactly_what_recovery_kept(env: Env) -> None:
    ns_a = await _ns(env)
    a = await ns_a.open_writer("fo", create=True, segment_records_max=7)
    reader = await (await _ns(env)).open_reader("fo")  # in a third process
    confirmed: dict[Position, bytes] = {}
    attempted = []
    for i in range(30):
        attempted.append(b"a%d" % i)
        confirmed[await a.append(b"a%d" % i)] = b"a%d" % i
    in_flight = [a.append_async(b"u%d" % i) for i in range(5)]
    attempted += [b"u%d" % i for i in range(5)]
    await asyncio.sleep(0)
    await _current_ledger(a).abort()
    await env.crash(ns_a.client)
    for f in in_flight:
        f.cancel()
    ns_b = await _ns(env)
    b = await ns_b.open_writer("fo", options=WriterOptions(lock_timeout_s=2.0))
    for i in range(10):
        attempted.append(b"b%d" % i)
        confirmed[await b.append(b"b%d" % i)] = b"b%d" % i
    await b.close()
    seen: list[Record] = []
    while True:
        rec = await reader.read_next(timeout_s=2.0)
        if rec is None:
            break
        seen.append(rec)
    await reader.close()
    fresh = await read_all(ns_b, "fo")
    result = check_stream({"tailer": pairs(seen), "fresh": pairs(fresh)}, confirmed, attempted=attempted)
    assert result.ok, result.explain()


async def test_log_checker_negative_controls() -> None:
    confirmed = {Position(0, 0, 0): b"a", Position(0, 1, 0): b"b", Position(1, 0, 0): b"c"}
    full = list(confirmed.items())
    assert check_stream({"r": full}, confirmed).ok
    assert not check_stream({"r": [full[0], full[2]]}, confirmed).ok  # a confirmed record skipped
    assert not check_stream({"r": [*full, (Position(1, 1, 0), b"a")]}, confirmed).ok  # duplicate
    assert not check_stream({"r": [full[1], full[0], full[2]]}, confirmed).ok  # reordered
    assert not check_stream({"r": full, "s": full[:2]}, confirmed).ok  # reader stopped short
    assert not check_stream({"r": [*full, (Position(2, 0, 0), b"z")]}, confirmed, attempted=[b"a", b"b", b"c"]).ok


# --- cursors, truncation, retention, deletion -------------------------------------------------
async def test_cursors_truncate_and_retention(env: Env) -> None:
    ns = await _ns(env)
    w = await ns.open_writer("ret", create=True, segment_records_max=2, retention_bytes_max=1,
                             retain_unconsumed=True)
    positions = [await w.append(b"r%d" % i) for i in range(10)]
    await ns.commit_cursor("ret", "eu", positions[3])
    with pytest.raises(CursorRegressionError):
        await ns.commit_cursor("ret", "eu", positions[1])
    assert await ns.cursor("ret", "eu") == positions[3]
    await ns.commit_cursor("ret", "eu", positions[1], force=True)
    await ns.commit_cursor("ret", "eu", positions[4])
    assert await ns.cursors("ret") == {"eu": positions[4]}
    before = {s.seq: s.ledger_id for s in (await ns.info("ret")).record.segments}
    point = await ns.apply_retention("ret")
    # held back by the cursor: only segments the cursor passed are gone
    assert point == Position(positions[4].segment_seq, 0, 0)
    after = (await ns.info("ret")).record
    assert after.segments[0].seq == positions[4].segment_seq
    for seq, ledger_id in before.items():
        if seq < positions[4].segment_seq:
            with pytest.raises(NoSuchLedgerError):
                await ns.client.ledger_metadata(ledger_id)
    with pytest.raises(PositionTruncatedError):
        await ns.open_reader("ret", positions[0])
    await ns.delete_cursor("ret", "eu")
    assert await ns.apply_retention("ret") is not None  # no cursor holds it now
    await w.close()
    remaining = (await ns.info("ret")).record.segments
    assert len(remaining) <= 2
    assert (await read_all(ns, "ret"))[-1].payload == b"r9"


async def test_writer_applies_retention_every_interval_in_its_own_process(env: Env) -> None:
    ns = await _ns(env)
    with pytest.raises(ConfigError, match="retention_interval_s"):
        await ns.open_writer("bad-interval", create=True, retention_interval_s=0)
    periodic = await ns.open_writer("periodic", create=True, segment_records_max=2, retention_bytes_max=1,
                                    retention_interval_s=0.05)
    manual = await ns.open_writer("manual", create=True, segment_records_max=2, retention_bytes_max=1)
    made: list[int] = []  # each segment's ledger (retention may drop some while we append)
    for i in range(10):
        await periodic.append(b"p%d" % i)
        await manual.append(b"m%d" % i)
        current = periodic.current_ledger
        assert current is not None
        if current.ledger_id not in made:
            made.append(current.ledger_id)
    assert len(made) >= 5
    async with asyncio.timeout(10.0):  # the writer's own retention drops every CLOSED segment
        while True:
            record = (await ns.info("periodic")).record
            if [s.seq for s in record.segments] == [periodic.segment_seq] and not record.deleting:
                break
            await asyncio.sleep(0.02)
    assert record.truncated_before == Position(periodic.segment_seq, 0, 0)
    assert periodic.retention_passes >= 1
    last = periodic.current_ledger
    assert last is not None and record.segments[0].ledger_id == last.ledger_id
    for ledger_id in (m for m in made if m != last.ledger_id):
        with pytest.raises(NoSuchLedgerError):
            await ns.client.ledger_metadata(ledger_id)
    # the same stream without an interval: nothing dropped until someone applies retention
    assert manual.retention_passes == 0
    assert len((await ns.info("manual")).record.segments) >= 5
    assert (await periodic.append(b"after")).segment_seq == periodic.segment_seq
    await periodic.close()
    await manual.close()
    got = [r.payload for r in await read_all(ns, "periodic")]  # what the current segment held
    assert got[-1] == b"after" and got[:-1] == [b"p%d" % i for i in range(10)][10 - (len(got) - 1):]
    assert len(got) <= 3


async def test_delete_stream_and_namespace(env: Env) -> None:
    ns = await _ns(env)
    w = await ns.open_writer("gone", create=True, segment_records_max=2)
    await w.append_many([b"a", b"b", b"c"])
    await w.append(b"d")
    reader = await ns.open_reader("gone")
    ledgers = [s.ledger_id for s in (await ns.info("gone")).record.segments]
    with pytest.raises(NamespaceNotEmptyError):
        await ns.delete()
    await ns.delete_stream("gone")
    with pytest.raises((WriterFencedError, StreamWriterClosedError, StreamNotFoundError)):
        await w.append(b"e")
    await w.abort()
    for ledger_id in ledgers:
        with pytest.raises(NoSuchLedgerError):
            await ns.client.ledger_metadata(ledger_id)
    with pytest.raises(StreamNotFoundError):
        await ns.open_reader("gone")
    with pytest.raises(StreamNotFoundError):
        for _ in range(100):
            await reader.read_next(timeout_s=2.0)
    await reader.close()
    assert "prod/payments" in await list_namespaces(ns.client)
    await ns.delete()
    with pytest.raises(NamespaceNotFoundError):
        await open_namespace(ns.client, "prod/payments")


async def test_recursive_namespace_delete_and_settings_inheritance(env: Env) -> None:
    ns = await _ns(env, segment_records_max=5)
    await ns.create_stream("inherit")
    await ns.create_stream("override", segment_records_max=9)
    assert (await ns.stream_settings("inherit")).segment_records_max == 5
    assert (await ns.stream_settings("override")).segment_records_max == 9
    assert sorted(await ns.list_streams()) == ["inherit", "override"]
    await ns.delete(recursive=True)
    assert "prod/payments" not in await list_namespaces(ns.client)


# --- bad input -----------------------------------------------------------------------------
async def test_bad_input_is_typed_and_writes_nothing(env: Env) -> None:
    client = await env.client()
    with pytest.raises(NamespaceNotFoundError):
        await open_namespace(client, "no/such")
    with pytest.raises(ConfigError, match="namespace name"):
        await open_namespace(client, "bad name", create=True)
    with pytest.raises(ConfigError, match="unknown stream setting"):
        await open_namespace(client, "ok", create=True, segment_recs=3)
    with pytest.raises(ConfigError, match="quorums"):
        await open_namespace(client, "ok", create=True, ack_quorum_size=5)
    assert await list_namespaces(client) == []
    ns = await _ns(env, record_bytes_max=100)
    with pytest.raises(StreamNotFoundError):
        await ns.open_writer("missing")
    with pytest.raises(StreamNotFoundError):
        await ns.open_reader("missing")
    with pytest.raises(ConfigError, match="stream name"):
        await ns.open_writer("bad/name", create=True)
    w = await ns.open_writer("s", create=True)
    with pytest.raises(RecordTooLargeError):
        w.append_async(b"x" * 200)
    with pytest.raises(RecordTooLargeError):
        await w.append_many([b"ok", b"x" * 200])
    with pytest.raises(ConfigError):
        w.append_async("text")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        w.append_async(b"x", headers={"k": "not bytes"})  # type: ignore[dict-item]
    p = await w.append(b"only")
    with pytest.raises(InvalidPositionError):
        await ns.open_reader("s", "1:2")
    with pytest.raises(InvalidPositionError):
        await ns.open_reader("s", "nonsense")
    with pytest.raises(PositionOutOfRangeError):
        await ns.open_reader("s", Position(p.segment_seq, p.entry_id + 5, 0))
    with pytest.raises(PositionOutOfRangeError):
        await ns.open_reader("s", Position(p.segment_seq + 3, 0, 0))
    with pytest.raises(InvalidPositionError):
        await ns.commit_cursor("s", "c", "x:y:z")
    with pytest.raises(ConfigError, match="cursor name"):
        await ns.commit_cursor("s", "bad cursor", p)
    await w.close()
    with pytest.raises(StreamWriterClosedError):
        w.append_async(b"after close")
    assert [r.payload for r in await read_all(ns, "s")] == [b"only"]


async def test_reader_of_corrupt_record_set_gets_typed_error(env: Env) -> None:
    """A segment whose ledger holds something that is not a record set (a foreign or buggy writer)."""
    import dataclasses

    from scriba.stream import record_set
    from scriba.stream.segments import Segment, SegmentSummary

    ns = await _ns(env)
    await ns.create_stream("raw")
    ledger = await ns.client.create_ledger(3, 3, 2)
    good = record_set.encode([(b"good", record_set.NO_HEADERS)], records_before=0, bytes_before=0,
                             publish_time_ms=1)
    await ledger.append(good)
    await ledger.append(b"not a record set")
    await ledger.close()
    segment = Segment(0, ledger.ledger_id, SegmentState.CLOSED, 0, 0, 1, SegmentSummary(1, 0, 2, 10, 1))
    await ns.catalog.update_stream("raw", lambda r: True,
                                   lambda r: dataclasses.replace(r, next_seq=1, segments=(segment,)))
    reader: StreamReader = await ns.open_reader("raw")
    assert (await reader.read_next(2.0)).payload == b"good"  # type: ignore[union-attr]
    with pytest.raises(RecordSetCorruptError):
        await reader.read_next(2.0)
    await reader.close()
    batched: StreamReader = await ns.open_reader("raw")
    async with asyncio.timeout(5.0):  # both chunks read ahead: the good record, then the error
        while batched._queue.qsize() < 2:
            await asyncio.sleep(0.01)
    assert [r.payload for r in await batched.read_batch(10, 2.0)] == [b"good"]  # the error waits
    with pytest.raises(RecordSetCorruptError):
        await batched.read_batch(10, 2.0)
    await batched.close()
