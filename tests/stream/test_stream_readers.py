"""Stream readers on the public client API (``stream_site.py``): tailing the OPEN segment,
starting at latest or at a timestamp, closing while a tail stops, reading after a
failover exactly what recovery kept; and the log checker's negative controls.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from stream_checks import check_stream
from stream_site import Env, current_ledger, open_ns, pairs, read_all

from scriba.stream import Position, Record, StreamReader, WriterOptions
from scriba.testing.waiting import eventually


async def test_reader_tails_open_segment_and_latest_and_timestamp(env: Env) -> None:
    ns = await open_ns(env)
    w = await ns.open_writer("tail", create=True, segment_records_max=50)
    olds = await w.append_many([b"old%d" % i for i in range(10)])
    # "latest" starts after the last add confirmed as the bookies know it (an idle
    # writer sends it explicitly after explicit_lac_delay_s): wait for that

    async def lac_known() -> bool:
        return await ns._end((await ns.info("tail")).record) > olds[-1]

    await eventually(lac_known, 5.0, what="the bookies know the last add confirmed", interval_s=0.02)
    latest = await ns.open_reader("tail", "latest")
    earliest = await ns.open_reader("tail")
    assert (await earliest.read_next(2.0)).payload == b"old0"  # type: ignore[union-attr]
    assert await latest.read_next(0.3) is None
    p = await w.append(b"new")
    rec = await latest.read_next(5.0)
    assert rec is not None and rec.payload == b"new" and rec.position == p
    await asyncio.sleep(0.01)  # clock separation, not synchronisation: "stamp" publishes in a later millisecond
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
    ns = await open_ns(env)
    w = await ns.open_writer("closing", create=True)
    first = await w.append(b"a")
    stopping = asyncio.Event()

    async def slow_to_stop(self: StreamReader, reader: Any, segment: Any) -> None:
        try:
            await asyncio.Event().wait()  # tails without delivering
        except asyncio.CancelledError:
            stopping.set()  # the segment closed: the reader is stopping this tail now
            await asyncio.sleep(0.05)  # a tail that takes a moment to stop (the stand-in's behaviour)
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
    ns_a = await open_ns(env)
    a = await ns_a.open_writer("fo", create=True, segment_records_max=7)
    reader = await (await open_ns(env)).open_reader("fo")  # in a third process
    confirmed: dict[Position, bytes] = {}
    attempted = []
    for i in range(30):
        attempted.append(b"a%d" % i)
        confirmed[await a.append(b"a%d" % i)] = b"a%d" % i
    in_flight = [a.append_async(b"u%d" % i) for i in range(5)]
    attempted += [b"u%d" % i for i in range(5)]
    await asyncio.sleep(0)
    await current_ledger(a).abort()
    await env.crash(ns_a.client)
    for f in in_flight:
        f.cancel()
    ns_b = await open_ns(env)
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
