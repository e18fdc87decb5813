"""The replicator between two (or three) clusters, each its own ``memory://`` store and bookies.

Kills are process deaths: the replicator's store session ends (its writer lock goes) and
its task is cancelled; a new replicator with a new client takes over. The checkers
(``geo_env.check_replica``) hold the target to exactly the source's records in order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from geo_env import (
    FAST_LOCK,
    STREAM,
    Site,
    check_replica,
    make_site,
    payloads,
    read_all,
)

from scriba.errors import ConfigError, StreamNotFoundError
from scriba.geo import Cluster, Mark, Replicator, ReplicatorOptions
from scriba.stream import Namespace, Position
from scriba.testing.waiting import eventually

OPTIONS = ReplicatorOptions(writer=FAST_LOCK, retry_delay_s=0.05, retry_delay_max_s=0.2, inflight_max=64)


@pytest.fixture
async def sites() -> AsyncIterator[dict[str, Site]]:
    made = {name: await make_site(name) for name in ("us", "eu", "ap")}
    try:
        yield made
    finally:
        for site in made.values():
            await site.close()


class Running:
    """A replicator in its own "process" (client), killable."""

    def __init__(self, rep: Replicator, site: Site, task: asyncio.Task[None]) -> None:
        self.rep, self.site, self.task = rep, site, task

    async def kill(self) -> None:
        await self.site.crash(self.rep.target.namespace.client)
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task


async def start(target: Site, sources: list[Site], *, cls: type[Replicator] = Replicator,
                options: ReplicatorOptions = OPTIONS) -> Running:
    rep = cls(await target.cluster(), STREAM, [await s.cluster() for s in sources], options)
    return Running(rep, target, asyncio.create_task(rep.run()))


async def count(ns: Namespace) -> int:
    info = await ns.info(STREAM)
    return sum(s.summary.record_count for s in info.record.segments)


async def produce(ns: Namespace, n: int, prefix: str, pause_every: int = 10) -> list[bytes]:
    values = [f"{prefix}-{i}".encode() for i in range(n)]
    async with await ns.open_writer(STREAM, create=True, options=FAST_LOCK) as w:
        for i in range(0, n, pause_every):
            await w.append_many(values[i:i + pause_every])
            await asyncio.sleep(0)  # let the replicator interleave
    return values


async def test_pair_exactly_once_across_kills_and_restarts(sites: dict[str, Site]) -> None:
    us, eu = sites["us"], sites["eu"]
    source = await us.namespace()
    producing = asyncio.create_task(produce(source, 300, "us"))
    target = await eu.namespace()
    running = await start(eu, [us])
    for threshold in (20, 60, 110, 170, 230):
        async def reached(t: int = threshold) -> bool:
            return (await read_count(target)) >= t
        await eventually(reached, 20.0, what=f"{threshold} records replicated", interval_s=0.02)
        await running.kill()
        running = await start(eu, [us])
    sent = await producing
    await eventually(lambda: has(target, len(sent)), 20.0, what="all records replicated", interval_s=0.02)
    records = await read_all(target)
    assert running.rep.sessions == 1
    await running.kill()
    assert check_replica(sent, payloads(records)) == []
    marks = [Mark.from_headers(r.headers) for r in records]
    assert all(m is not None and m.origin == "us" and m.source == "us" for m in marks)
    source_positions = [m.source_position for m in marks if m is not None]
    assert source_positions == sorted(source_positions) and len(set(source_positions)) == len(sent)


async def read_count(ns: Namespace) -> int:
    try:
        return len(await read_all(ns, settle_s=0.05))
    except StreamNotFoundError:
        return 0


async def has(ns: Namespace, n: int) -> bool:
    return await read_count(ns) >= n


async def test_two_replicators_race_one_wins_and_the_other_takes_over(sites: dict[str, Site]) -> None:
    us, eu = sites["us"], sites["eu"]
    source = await us.namespace()
    producing = asyncio.create_task(produce(source, 150, "us"))
    target = await eu.namespace()
    a, b = await start(eu, [us]), await start(eu, [us])
    await eventually(lambda: has(target, 40), 20.0, what="40 records replicated", interval_s=0.02)
    holders = [r for r in (a, b) if r.rep.sessions > 0]
    assert len(holders) == 1, "the target writer lock lets exactly one replicator hold the stream"
    winner, loser = holders[0], (b if holders[0] is a else a)
    await winner.kill()
    await eventually(lambda: loser.rep.sessions > 0, 20.0, what="the other replicator takes over", interval_s=0.02)
    sent = await producing
    await eventually(lambda: has(target, len(sent)), 20.0, what="all records replicated", interval_s=0.02)
    records = await read_all(target)
    await loser.kill()
    assert check_replica(sent, payloads(records)) == []



async def test_ring_of_three_active_active_converges_exactly_once(sites: dict[str, Site]) -> None:
    order = ["us", "eu", "ap"]
    for name in order:  # each cluster's stream exists before links read it (a missing one is refused)
        await (await sites[name].namespace()).create_stream(STREAM)
    running = {name: await start(sites[name], [sites[order[i - 1]]]) for i, name in enumerate(order)}
    for r in running.values():
        await r.rep.wait_ready(10.0)

    async def local_writes(name: str) -> list[bytes]:
        values = [f"{name}-{i}".encode() for i in range(40)]
        for v in values:
            await running[name].rep.append_local(v)
        return values

    written = await asyncio.gather(*(local_writes(n) for n in order))
    everything = sorted(v for vs in written for v in vs)
    namespaces = {n: await sites[n].namespace() for n in order}
    for n in order:
        await eventually(lambda n=n: has(namespaces[n], len(everything)), 20.0, what=f"{n} converged", interval_s=0.02)
    for n, ns in namespaces.items():
        got = payloads(await read_all(ns))
        assert sorted(got) == everything and len(got) == len(set(got)), f"{n}: not every record exactly once"
        for origin, values in zip(order, written, strict=True):  # each origin's records in its order
            assert [v for v in got if v.startswith(origin.encode())] == values
    for r in running.values():
        await r.kill()


async def test_lag_is_reported_and_drains(sites: dict[str, Site]) -> None:
    us, eu = sites["us"], sites["eu"]
    sent = await produce(await us.namespace(), 50, "us")
    running = await start(eu, [us])
    target = await eu.namespace()
    await eventually(lambda: has(target, len(sent)), 20.0, what="all records replicated", interval_s=0.02)
    await eventually(lambda: running.rep.lag()["us"].records_behind == 0, 20.0, what="lag drained", interval_s=0.02)
    lag = running.rep.lag()["us"]
    assert lag.seconds_behind == 0.0 and lag.confirmed is not None
    await running.kill()


async def test_bad_input_is_refused_clearly(sites: dict[str, Site]) -> None:
    us, eu = sites["us"], sites["eu"]
    cluster = await us.cluster()
    with pytest.raises(ConfigError, match="both the target and a source"):
        Replicator(Cluster("us", (await eu.namespace())), STREAM, [cluster])
    with pytest.raises(ConfigError, match="at least one source"):
        Replicator(cluster, STREAM, [])
    rep = Replicator(await eu.cluster(), STREAM, [cluster], OPTIONS)  # the source stream does not exist
    with pytest.raises(StreamNotFoundError):
        await asyncio.wait_for(rep.run(), 10.0)


class CheckpointReplicator(Replicator):
    """Negative control: progress from a checkpoint committed after the append. A crash
    between the append and the commit leaves the checkpoint behind the target."""

    checkpoint: dict[str, Position] = {}

    async def _recover(self) -> dict[str, Position]:
        return dict(self.checkpoint)


async def test_negative_control_a_checkpoint_replicator_is_caught_duplicating(sites: dict[str, Site]) -> None:
    us, eu = sites["us"], sites["eu"]
    sent = await produce(await us.namespace(), 60, "us")
    target = await eu.namespace()
    running = await start(eu, [us], cls=CheckpointReplicator)
    await eventually(lambda: has(target, 30), 20.0, what="30 records replicated", interval_s=0.02)
    # the crash: appended and confirmed up to here, the checkpoint commit of the last 10 lost
    CheckpointReplicator.checkpoint = {"us": (await read_all(target))[19].headers and
                                       _mark_position((await read_all(target))[19].headers)}
    await running.kill()
    running = await start(eu, [us], cls=CheckpointReplicator)
    await eventually(lambda: has(target, len(sent) + 1), 20.0, what="re-shipped records", interval_s=0.02)
    records = await read_all(target)
    await running.kill()
    problems = check_replica(sent, payloads(records))
    assert problems and any("duplicat" in p for p in problems), problems


def _mark_position(headers: object) -> Position:
    mark = Mark.from_headers(headers)  # type: ignore[arg-type]
    assert mark is not None
    return mark.source_position


async def test_link_status_counts_what_is_behind_and_metrics_follow(sites: dict[str, Site]) -> None:
    from scriba.geo.metrics import GeoMetrics
    from scriba.geo.status import link_status

    us, eu = sites["us"], sites["eu"]
    sent = await produce(await us.namespace(), 30, "us")
    src, dst = await us.cluster(), await eu.cluster()
    await dst.namespace.create_stream(STREAM)
    before = await link_status(src, dst, STREAM, idle_s=0.2)
    assert (before.confirmed, before.records_behind, before.counted_all) == (None, len(sent), True)
    assert before.seconds_behind > 0
    running = await start(eu, [us])
    await eventually(lambda: has(dst.namespace, len(sent)), 20.0, what="all records replicated", interval_s=0.02)
    after = await link_status(src, dst, STREAM, idle_s=0.2)
    assert (after.records_behind, after.seconds_behind) == (0, 0.0) and after.confirmed is not None
    metrics = GeoMetrics()
    metrics.update(running.rep)
    shipped = metrics.registry.get_sample_value("scriba_geo_records_shipped",
                                                {"stream": "geo/test/orders", "source": "us"})
    assert shipped is not None and shipped > 0
    assert metrics.registry.get_sample_value("scriba_geo_lag_records",
                                             {"stream": "geo/test/orders", "source": "us"}) == 0
    await running.kill()


async def test_replicator_survives_losing_the_target_writer_lock(sites: dict[str, Site]) -> None:
    """The target's metadata session expires mid-shipping (the writer lock goes, appends fail with
    WriterFencedError inside the link's nested task groups): the session ends, the next one resumes
    from the target, the replicator keeps running — and the target still holds each record once."""
    us, eu = sites["us"], sites["eu"]
    source = await us.namespace()
    producing = asyncio.create_task(produce(source, 200, "us"))
    target = await eu.namespace()
    running = await start(eu, [us])
    await eventually(lambda: has(target, 30), 20.0, what="30 records replicated", interval_s=0.02)
    await running.rep.target.namespace.client.store.expire_session_for_test()  # type: ignore[attr-defined]
    await eventually(lambda: running.rep.sessions >= 2, 20.0, what="a new session after the lock was lost", interval_s=0.02)
    sent = await producing
    await eventually(lambda: has(target, len(sent)), 20.0, what="all records replicated", interval_s=0.02)
    assert not running.task.done(), "the replicator ended on a retriable error"
    records = await read_all(target)
    await running.kill()
    assert check_replica(sent, payloads(records)) == []
