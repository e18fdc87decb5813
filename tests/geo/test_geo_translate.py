"""Position translation (``geo.translate``): exact target positions and cursor resume points.

Unit cases over the pure rule, then two clusters in one process: every source position
translates to the target record with the same payload, cursors are translated in bulk and
a consumer resuming from a translated cursor reads exactly the rest, and positions the
target has not caught up with say so.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from geo_env import FAST_LOCK, STREAM, Site, make_site, read_all

from scriba.errors import ConfigError
from scriba.geo import Mark, Replicator, ReplicatorOptions
from scriba.geo.translate import translate, translate_cursors, translate_marked
from scriba.stream import Position
from scriba.testing.waiting import eventually

P = Position
OPTIONS = ReplicatorOptions(writer=FAST_LOCK, retry_delay_s=0.05, retry_delay_max_s=0.2, inflight_max=64)


def marked(target: Position, source: str, source_position: Position) -> tuple[Position, dict[str, bytes]]:
    return target, Mark(source, source, source_position, 0).to_headers()


def local(target: Position) -> tuple[Position, dict[str, bytes]]:
    return target, {}


def test_translate_marked_exact_resume_and_behind() -> None:
    records = [
        marked(P(0, 0), "us", P(0, 0)),
        local(P(0, 1)),                      # a target-local record between
        marked(P(0, 2), "us", P(0, 1)),
        marked(P(0, 3), "ap", P(5, 5)),      # another link's record
        marked(P(1, 0), "us", P(0, 3)),      # source 0:2 was not shipped (say, it came from here)
    ]
    end = P(1, 1)
    t = translate_marked(records, end, "us", [P(0, 0), P(0, 1), P(0, 2), P(0, 3), P(0, 4)])
    assert t[P(0, 0)].target_position == P(0, 0) and t[P(0, 0)].resume_position == P(0, 0)
    assert t[P(0, 1)].target_position == P(0, 2)
    assert t[P(0, 1)].resume_position == P(0, 1)  # right after 0:0: the local record is not skipped
    assert t[P(0, 2)].target_position is None and t[P(0, 2)].replicated
    assert t[P(0, 2)].resume_position == P(0, 3)
    assert t[P(0, 3)].target_position == P(1, 0)
    behind = t[P(0, 4)]
    assert behind.target_position is None and not behind.replicated and behind.resume_position == end
    assert translate_marked([], P(0, 0), "us", [P(3, 3)])[P(3, 3)].resume_position == P(0, 0)


def test_translate_marked_refuses_marks_out_of_source_order() -> None:
    records = [marked(P(0, 0), "us", P(0, 5)), marked(P(0, 1), "us", P(0, 4))]
    with pytest.raises(Exception, match="not in source order"):
        translate_marked(records, P(0, 2), "us", [P(0, 4)])


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Site, Site]]:
    us, eu = await make_site("us"), await make_site("eu")
    try:
        yield us, eu
    finally:
        await us.close()
        await eu.close()


async def test_every_source_position_translates_to_its_replica(pair: tuple[Site, Site]) -> None:
    us, eu = pair
    source = await us.namespace()
    async with await source.open_writer(STREAM, create=True, options=FAST_LOCK) as w:
        for i in range(0, 150, 10):
            await w.append_many([f"us-{j}".encode() for j in range(i, i + 10)])
    rep = Replicator(await eu.cluster(), STREAM, [await us.cluster()], OPTIONS)
    task = asyncio.create_task(rep.run())
    try:
        target = await eu.namespace()

        async def caught_up() -> bool:
            return len(await read_all(target, settle_s=0.05)) >= 150

        await eventually(caught_up, 20.0, what="the target to hold 150 records", interval_s=0.02)
        await rep.append_local(b"eu-local")  # a target-local record after them
        src_records = await read_all(source)
        dst_records = {r.position: r for r in await read_all(target)}
        found = await translate(target, STREAM, "us", [r.position for r in src_records])
        for record in src_records:
            t = found[record.position]
            assert t.replicated and t.target_position is not None
            assert dst_records[t.target_position].payload == record.payload
        # A consumer of the source at record 100 fails over: its cursor moves to eu.
        await source.commit_cursor(STREAM, "billing", src_records[100].position)
        moved = await translate_cursors(source, target, STREAM, "us")
        assert set(moved) == {"billing"}
        resume = await target.cursor(STREAM, "billing")
        assert resume == moved["billing"].resume_position
        rest = [r.payload for r in await read_all(target) if r.position >= resume]
        assert rest == [f"us-{j}".encode() for j in range(100, 150)] + [b"eu-local"]
        # A position the target does not have yet: not replicated, resume at the end.
        ahead = Position(src_records[-1].position.segment_seq + 1, 0, 0)
        late = (await translate(target, STREAM, "us", [ahead]))[ahead]
        assert not late.replicated and late.target_position is None
        with pytest.raises(ConfigError, match="no position"):
            await translate(target, STREAM, "us", [])
    finally:
        await rep.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_failover_drill_measures_the_unreplicated_window(pair: tuple[Site, Site]) -> None:
    from scriba.geo.drill import PROMOTED_FROM, failover_drill

    us, eu = pair
    source = await us.namespace()
    async with await source.open_writer(STREAM, create=True, options=FAST_LOCK) as w:
        await w.append_many([f"us-{j}".encode() for j in range(60)])
    rep = Replicator(await eu.cluster(), STREAM, [await us.cluster()], OPTIONS)
    task = asyncio.create_task(rep.run())
    target = await eu.namespace()

    async def caught_up() -> bool:
        return len(await read_all(target, settle_s=0.05)) >= 60

    await eventually(caught_up, 20.0, what="the target to hold 60 records", interval_s=0.02)
    await eu.crash(rep.target.namespace.client)  # the replicator dies with its region's link...
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    async with await source.open_writer(STREAM, options=FAST_LOCK) as w:  # ...while the source goes on
        for j in range(60, 75):
            await w.append(f"us-{j}".encode())
    report = await failover_drill(source, target, STREAM, "us", options=FAST_LOCK)
    assert report.lost_records == 15
    assert report.lost_bytes == sum(len(f"us-{j}".encode()) for j in range(60, 75))
    assert report.loss_window_s >= 0 and report.time_to_writable_s >= report.source_stopped_s
    records = await read_all(target)
    assert [r.payload for r in records[:60]] == [f"us-{j}".encode() for j in range(60)]
    assert records[-1].headers.get(PROMOTED_FROM) == b"us"
    assert str(records[-1].position) == report.promotion_position
    # Nothing left behind: a second drill right away loses nothing more than the 15.
    again = await failover_drill(source, target, STREAM, "us", options=FAST_LOCK)
    assert again.lost_records == 15 and again.replicated_through == report.replicated_through
