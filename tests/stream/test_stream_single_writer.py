"""The single writer on the public client API (``stream_site.py``): the writer lock, fencing
through the ledgers and the stream record's CAS when the old writer does not notice, racing
openers, an open cancelled after its claim landed, staged ledgers adopted once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from stream_site import FAST_LOCK, Env, open_ns, read_all

from scriba.errors import StreamWriterClosedError, WriterFencedError, WriterLockedError
from scriba.stream import WriterOptions
from scriba.stream.segments import SegmentState


async def test_second_writer_waits_for_the_lock_then_fences_after_session_loss(env: Env) -> None:
    ns_a = await open_ns(env)
    ns_b = await open_ns(env)
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
    ns_a = await open_ns(env, segment_records_max=1000)
    ns_b = await open_ns(env)
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
    ns_a = await open_ns(env)
    ns = await open_ns(env)
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
    ns_a = await open_ns(env)
    ns_b = await open_ns(env)
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
    ns_list = [await open_ns(env) for _ in range(3)]
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

    ns = await open_ns(env)
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
    other = await (await open_ns(env)).open_writer("claimed", options=FAST_LOCK)  # free at once
    await other.append(b"x")
    await other.close()
