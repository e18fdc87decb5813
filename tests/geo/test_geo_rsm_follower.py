"""``StreamFollower`` on a geo-replicated copy of an RSM's command stream (in-process clusters).

Cluster ``a`` runs an RSM replica whose state machine journals every ``(position,
command)`` it applies; a :class:`~scriba.geo.Replicator` copies its stream into cluster
``b``; a follower in ``b`` applies the copy. Checked:

- the follower applies exactly what the replica applied, at the replica's positions
  (its whole replicated state — journal, session table, clock, token — equals the
  replica's at the same position: the RSM convergence rule across clusters);
- its staleness bound is exact: while the copy is stopped and ``a`` confirms a command
  the follower has not applied, ``caught_up_ms`` stays before that confirmation; once
  the copy resumes it passes it;
- a record that is not the group's history (written in ``b``, or copied from another
  cluster than the one named) stops the follower with ``StateMachineError`` before it
  is applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from scriba.client import Client, ClientConfig
from scriba.client.driver import DriverConfig
from scriba.errors import ConfigError, PositionTruncatedError, StateMachineError, UnavailableError
from scriba.examples.kvstore.follower import geo_bootstrap, geo_locate
from scriba.geo import Cluster, Replicator, translate
from scriba.geo.replicator import hold_cursor_name
from scriba.rsm import ReplicatedStateMachine, RsmConfig, SnapshotReader, SnapshotWriter
from scriba.rsm.envelope import Envelope, Kind
from scriba.rsm.follower import StreamFollower
from scriba.stream import Namespace, Position, WriterOptions, open_namespace
from scriba.testing.sim import InProcessSite
from scriba.testing.waiting import eventually

BOOKIES = [f"bk{i}" for i in range(3)]
CONFIG = ClientConfig(add_timeout_s=2.0, bookie_wait_s=2.0,
                      driver=DriverConfig(read_timeout_s=2.0, metadata_timeout_s=5.0, long_poll_s=0.05))
RSM = RsmConfig(campaign_backoff_s=0.05, writer_lock_timeout_s=5.0, propose_timeout_s=10.0, read_timeout_s=10.0,
                snapshot_every_commands=None, snapshot_every_bytes=None)
NAMESPACE, STREAM = "apps", "journal"


class Journal:
    """Records every command with the position it was applied at."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, str]] = []

    def apply(self, command: bytes, position: Position) -> bytes:
        self.entries.append((str(position), command.decode()))
        return str(len(self.entries)).encode()

    def query(self, request: bytes) -> bytes:
        return json.dumps(self.entries).encode()

    def snapshot(self, out: SnapshotWriter) -> None:
        out.write(json.dumps(self.entries).encode())

    def restore(self, src: SnapshotReader) -> None:
        self.entries = [tuple(e) for e in json.loads(src.read())]  # type: ignore[misc]


@dataclass
class World:
    replica: ReplicatedStateMachine
    source: Namespace
    target: Namespace
    replicator: Replicator | None = None
    task: asyncio.Task[None] | None = None

    async def start_copy(self) -> None:
        self.replicator = Replicator(Cluster("b", self.target), STREAM, [Cluster("a", self.source)])
        self.task = asyncio.create_task(self.replicator.run())
        await self.replicator.wait_ready(20)

    async def stop_copy(self) -> None:
        if self.replicator is not None:
            await self.replicator.stop()
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        self.replicator = self.task = None

    def follower(self, origin: str = "a", *, snapshots: bool = False) -> StreamFollower:
        async def reference() -> Namespace:
            return self.source

        async def source_client() -> Client:
            return self.replica.client
        return StreamFollower(self.target, STREAM, Journal(), config=RSM, locate=geo_locate(origin),
                              reference=reference, check_s=0.05, retry_s=0.05,
                              bootstrap=geo_bootstrap(source_client, self.target, STREAM, origin) if snapshots else None)


@contextlib.asynccontextmanager
async def world(rsm: RsmConfig = RSM, source_settings: dict[str, Any] | None = None,
                **target_settings: Any) -> AsyncIterator[World]:
    a = InProcessSite(f"memory://fa-{uuid.uuid4().hex[:8]}", BOOKIES, CONFIG)
    b = InProcessSite(f"memory://fb-{uuid.uuid4().hex[:8]}", BOOKIES, CONFIG)
    await a.start()
    await b.start()
    if source_settings:
        await open_namespace(await a.client(), NAMESPACE, create=True, **source_settings)
    replica = ReplicatedStateMachine(await a.client(), namespace=NAMESPACE, name=STREAM, state_machine=Journal(),
                                     replica_id="r1", config=rsm)
    w: World | None = None
    try:
        await replica.start()
        source = await open_namespace(await a.client(), NAMESPACE)
        target = await open_namespace(await b.client(), NAMESPACE, create=True, **target_settings)
        w = World(replica, source, target)
        await w.start_copy()
        yield w
    finally:
        if w is not None:
            await w.stop_copy()
        await replica.stop()
        await a.close()
        await b.close()


async def propose(replica: ReplicatedStateMachine, n: int, tag: str) -> None:
    session = await replica.open_session()
    for i in range(n):
        await replica.propose(f"{tag}-{i}".encode(), session=session)


async def test_the_follower_applies_the_replicas_history_at_its_positions() -> None:
    async with world() as w:
        follower = await w.follower().start()
        try:
            await propose(w.replica, 25, "x")
            await w.replica.read(b"", "linearizable")  # a barrier record too
            await eventually(lambda: follower.applied == w.replica.state.applied, 30.0, what="follower at the replica's position", interval_s=0.02)
            mine, theirs = follower.state, w.replica.state
            assert mine.machine.entries == theirs.machine.entries  # type: ignore[attr-defined]
            assert len(mine.machine.entries) == 25  # type: ignore[attr-defined]
            assert mine.snapshot(1 << 20) == theirs.snapshot(1 << 20)  # sessions, clock, token, counts too
            assert json.loads(follower.query(b"")) == [list(e) for e in theirs.machine.entries]  # type: ignore[attr-defined]
            assert follower.stream_applied is not None
            await eventually(lambda: follower.caught_up_ms > 0, 30.0, what="a freshness sample settled", interval_s=0.02)
            assert follower.status()["error"] is None
        finally:
            await follower.stop()


async def test_the_staleness_bound_holds_while_the_copy_is_stopped() -> None:
    async with world() as w:
        follower = await w.follower().start()
        try:
            await propose(w.replica, 5, "before")
            await eventually(lambda: follower.applied == w.replica.state.applied, 30.0, what="caught up", interval_s=0.02)
            await w.stop_copy()
            await propose(w.replica, 3, "during")
            confirmed_ms = int(time.time() * 1000)  # a is now ahead of anything the follower can apply
            newest = w.replica.state.applied
            assert newest is not None
            await eventually(lambda: follower.reference_last == newest, 30.0, what="the follower saw the source's new end", interval_s=0.02)
            for _ in range(20):  # observe: the bound never claims a time after the unapplied confirmation
                assert follower.applied is not None and follower.applied < newest
                assert follower.caught_up_ms < confirmed_ms, (follower.caught_up_ms, confirmed_ms)
                await asyncio.sleep(0.02)
            assert follower.status()["stale_s"] > 0
            await w.start_copy()
            await eventually(lambda: follower.caught_up_ms > confirmed_ms, 30.0, what="fresh again once the copy resumed", interval_s=0.02)
            assert follower.applied == newest
        finally:
            await follower.stop()


@pytest.mark.parametrize("case", ["written-in-b", "other-origin"])
async def test_a_record_outside_the_groups_history_stops_the_follower(case: str) -> None:
    async with world() as w:
        await propose(w.replica, 4, "ok")
        await eventually(lambda: _copied(w), 30.0, what="the copy holds the replica's records", interval_s=0.02)
        if case == "written-in-b":
            await w.stop_copy()
            async with await w.target.open_writer(STREAM, options=WriterOptions(lock_timeout_s=5)) as writer:
                await writer.append(Envelope(Kind.COMMAND, token=10**6, time_ms=0, payload=b"rogue").encode())
        follower = await w.follower(origin="a" if case == "written-in-b" else "elsewhere").start()
        try:
            await eventually(lambda: follower.error is not None, 30.0, what="the follower stopped", interval_s=0.02)
            assert isinstance(follower.error, StateMachineError)
            if case == "written-in-b":
                assert "no replication mark" in str(follower.error)
                entries = follower.state.machine.entries  # type: ignore[attr-defined]
                assert [c for _p, c in entries] == [f"ok-{i}" for i in range(4)]  # the rogue record not applied
            else:
                assert "copied from cluster 'a'" in str(follower.error) and follower.applied is None
            with pytest.raises(StateMachineError):
                follower.query(b"")
        finally:
            await follower.stop()


async def _copied(w: World) -> bool:
    last = await w.target.last_position(STREAM)
    links = w.replicator.links() if w.replicator is not None else {}
    return last is not None and "a" in links and links["a"].lag(0).confirmed == w.replica.state.applied


async def test_a_follower_starts_from_the_source_snapshot_when_its_copy_is_truncated() -> None:
    """The copy (small segments) truncated before the record copied from the snapshot's
    position: a follower without snapshots stops (its history is gone: the negative
    control); one with them restores the source's snapshot, reads the copy from the
    translated position, and ends equal to the replica."""
    async with world(segment_records_max=5) as w:
        await propose(w.replica, 12, "old")
        snapshot_at = await w.replica.snapshot()
        await propose(w.replica, 9, "new")
        await eventually(lambda: _copied(w), 30.0, what="the copy holds everything", interval_s=0.02)
        where = (await translate(w.target, STREAM, "a", [snapshot_at]))[snapshot_at]
        assert where.target_position is not None
        deleted = await w.target.truncate(STREAM, where.target_position)
        assert deleted, "the copy's early segments were not deleted"
        blind = await w.follower().start()
        booted = await w.follower(snapshots=True).start()
        try:
            await eventually(lambda: blind.error is not None, 30.0, what="the follower without snapshots stopped", interval_s=0.02)
            assert isinstance(blind.error, PositionTruncatedError), blind.error
            await eventually(lambda: booted.applied == w.replica.state.applied, 30.0, what="the bootstrapped follower caught up", interval_s=0.02)
            assert booted.restored == snapshot_at and booted.resumed_at == where.target_position.successor()
            assert booted.state.snapshot(1 << 20) == w.replica.state.snapshot(1 << 20)
            entries = booted.state.machine.entries  # type: ignore[attr-defined]
            assert [c for _p, c in entries] == [f"old-{i}" for i in range(12)] + [f"new-{i}" for i in range(9)]
        finally:
            await blind.stop()
            await booted.stop()


@pytest.mark.parametrize(("argv", "message"), [
    (["--max-staleness-s", "0"], "--max-staleness-s must be > 0"),
    (["--stale-after-s", "-1"], "--stale-after-s must be > 0"),
    (["--source-metadata", "etcd://127.0.0.1:1/x"], "--source-metadata needs --origin"),
    (["--rsm-config", '{"session_ttl_msx": 5}'], "--rsm-config"),
    (["--rsm-config", "{not json"], "--rsm-config"),
])
def test_follow_options_that_cannot_work_get_a_config_error(argv: list[str], message: str) -> None:
    from scriba.examples.kvstore.__main__ import parse_args
    from scriba.examples.kvstore.follower import check_follow_args

    args = parse_args(["follow", "--metadata", "memory://x", "--replica-id", "f1", "--listen", "127.0.0.1:1", *argv])
    with pytest.raises(ConfigError, match=message):
        check_follow_args(args)


async def test_a_source_that_does_not_answer_at_start_does_not_keep_the_follower_from_its_copy() -> None:
    async with world() as w:
        await propose(w.replica, 6, "x")
        asked: list[Position | None] = []

        async def source_down(applied: Position | None) -> tuple[list[bytes], Position] | None:
            asked.append(applied)
            raise UnavailableError("cluster a: no answer")

        follower = StreamFollower(w.target, STREAM, Journal(), config=RSM, locate=geo_locate("a"),
                                  bootstrap=source_down, check_s=0.05, retry_s=0.05)
        await follower.start()
        try:
            await eventually(lambda: follower.applied == w.replica.state.applied, 30.0, what="the copy applied from its start", interval_s=0.02)
            assert asked == [None] and follower.restored is None and follower.error is None
        finally:
            await follower.stop()


@pytest.mark.parametrize("held", [True, False])
async def test_the_replicators_cursor_holds_the_source_history_through_snapshots(held: bool) -> None:
    """The source RSM snapshots and truncates its stream (small segments, one snapshot
    kept) while the replicator is down. Its cursor holds what it has not copied, so it
    resumes and the copy is whole; the negative control (the cursor deleted) finds the
    records truncated away and the replicator fails for good (PositionTruncatedError)."""
    config = dataclasses.replace(RSM, snapshots_kept=1)
    async with world(rsm=config, source_settings={"segment_records_max": 5}) as w:
        await propose(w.replica, 10, "a")
        await eventually(lambda: _copied(w), 30.0, what="the copy holds the first records", interval_s=0.02)
        cursor = hold_cursor_name("b")

        async def held_at_end() -> bool:
            return await w.source.cursor(STREAM, cursor) == w.replica.state.applied
        await eventually(held_at_end, 30.0, what="the replicator's cursor on the source at what the target confirmed", interval_s=0.02)
        await w.stop_copy()
        if not held:
            await w.source.delete_cursor(STREAM, cursor)
        await propose(w.replica, 20, "b")
        await w.replica.snapshot()
        truncated = (await w.source.info(STREAM)).record.truncated_before
        copied = (await w.source.cursor(STREAM, cursor)) if held else None
        if held:
            assert copied is not None and truncated <= copied
        w.replicator = Replicator(Cluster("b", w.target), STREAM, [Cluster("a", w.source)])
        w.task = asyncio.create_task(w.replicator.run())
        if held:
            await eventually(lambda: _copied(w), 30.0, what="the copy resumed and holds everything", interval_s=0.02)
            follower = await w.follower().start()
            try:
                await eventually(lambda: follower.applied == w.replica.state.applied, 30.0, what="the follower caught up", interval_s=0.02)
                assert follower.state.snapshot(1 << 20) == w.replica.state.snapshot(1 << 20)
            finally:
                await follower.stop()
        else:
            with pytest.raises(PositionTruncatedError):
                await asyncio.wait_for(w.task, 30)
            w.replicator = w.task = None  # it ended: nothing to stop
