"""The RSM shell against in-process bookies and ``memory://`` (fast stand-ins for the real
processes of ``test_rsm_processes.py``): each replica is its own "process" — its own Client
on its own store session — sharing the bookies; replica services on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from rsm_machines import Counter, Register

from scriba.client import ClientConfig
from scriba.client.driver import DriverConfig
from scriba.embedded.process import free_port
from scriba.errors import (
    BadConsistencyError,
    BadRequestError,
    ClientSessionError,
    CommandTooLargeError,
    ConfigError,
    MetadataUnavailableError,
    ReplicaIdInUseError,
    ReplicaNotFoundError,
    ReplicaStoppedError,
    RsmNotLeaderError,
    StateMachineError,
)
from scriba.rsm import ClientSession, ReplicatedStateMachine, Role, RsmConfig
from scriba.rsm import membership as mb
from scriba.rsm.remote import RsmClient
from scriba.rsm.snapshot_store import read_catalog
from scriba.rsm.snapshots_core import CATALOG_CODEC
from scriba.stream import Position, open_namespace
from scriba.testing.checkers import Applied, ReplicaTrace, check_rsm
from scriba.testing.sim import InProcessSite
from scriba.testing.waiting import eventually

BOOKIES = [f"bk{i}" for i in range(4)]
CLIENT_CONFIG = ClientConfig(add_timeout_s=2.0, bookie_wait_s=2.0,
                             driver=DriverConfig(read_timeout_s=2.0, metadata_timeout_s=5.0, long_poll_s=0.2))
FAST = RsmConfig(campaign_backoff_s=0.05, writer_lock_timeout_s=5.0, propose_timeout_s=10.0, read_timeout_s=10.0,
                 snapshot_every_commands=None, snapshot_every_bytes=None, transfer_timeout_s=5.0)


def free_address() -> str:
    return f"127.0.0.1:{free_port()}"


class Env(InProcessSite):
    def __init__(self, uri: str) -> None:
        super().__init__(uri, BOOKIES, CLIENT_CONFIG)
        self.replicas: list[ReplicatedStateMachine] = []

    async def replica(self, rid: str, machine: Any = None, config: RsmConfig = FAST, name: str = "counter",
                      start: bool = True, metrics_listen: str | None = None) -> ReplicatedStateMachine:
        r = ReplicatedStateMachine(await self.client(), namespace="apps", name=name,
                                   state_machine=machine if machine is not None else Counter(),
                                   replica_id=rid, address=free_address(), config=config,
                                   metrics_listen=metrics_listen)
        self.replicas.append(r)
        if start:
            await r.start()
        return r

    async def crash(self, r: ReplicatedStateMachine) -> None:
        """The process dies: its metadata session ends, nothing is closed cleanly."""
        for task in list(r._tasks):
            task.cancel()
        if r._term is not None:
            for task in list(r._term._tasks):
                task.cancel()
        if r._server is not None:
            await r._server.close()
        await r.client.store.close()
        r._stopped = ReplicaStoppedError("crashed")


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    uri = f"memory://rsm-{uuid.uuid4().hex[:10]}"
    e = Env(uri)
    await e.start()
    try:
        yield e
    finally:
        for r in e.replicas:
            # stop() every replica not stopped or crashed already: one its state machine
            # stopped (StateMachineError) still serves, and its listening socket leaked
            if not isinstance(r._stopped, ReplicaStoppedError):
                await asyncio.wait_for(r.stop(), 10)
        await e.close()


async def leader_of(replicas: list[ReplicatedStateMachine], timeout_s: float = 10.0) -> ReplicatedStateMachine:
    await eventually(lambda: sum(r.is_leader for r in replicas if r._stopped is None) == 1, timeout_s,
                     what="exactly one running replica leads")
    return next(r for r in replicas if r.is_leader and r._stopped is None)


def trace(r: ReplicatedStateMachine) -> ReplicaTrace:
    machine = r.state.machine
    assert isinstance(machine, Counter)
    applied = [Applied(int(p.segment_seq) * 10**12 + p.entry_id * 10**5 + p.slot, (str(p), cmd))
               for p, cmd in machine.log]
    return ReplicaTrace.build(r.replica_id, applied)


# --- one replica ----------------------------------------------------------------------------
async def test_single_replica_propose_read_and_sessions(env: Env) -> None:
    r = await env.replica("r1")
    await eventually(lambda: r.is_leader)
    session = await r.open_session()
    assert session.session_id == 1
    assert [await r.propose(b"incr", session=session) for _ in range(3)] == [b"1", b"2", b"3"]
    # group commit: concurrent proposals share record sets, each gets its own result
    results = await asyncio.gather(*[r.propose(b"incr") for _ in range(50)])
    assert sorted(int(x) for x in results) == list(range(4, 54))
    assert r._term is not None and r._term.batches_sent < 50 + 4
    # a retry of the last seq (its answer lost) returns the first result and applies nothing;
    # one below what the client said it has is refused, never applied again
    lost = ClientSession(session.session_id, next_seq=4, acked_below=3)
    assert await r.propose(b"incr", session=lost, seq=3) == b"3"
    with pytest.raises(ClientSessionError, match="below acked_below"):
        await r.propose(b"incr", session=lost, seq=1)
    assert await r.read(b"get") == b"53"
    assert await r.read(b"get", "sequential") == b"53"
    assert session.last_position is not None
    assert await r.read(b"get", "after", after=session.last_position) == b"53"
    status = r.status()
    assert status["role"] == "leader" and status["commands_applied"] == 53 and status["sessions"] == 1
    assert [m.replica_id for m in await r.members()] == ["r1"]


async def test_bad_input_is_typed(env: Env) -> None:
    r = await env.replica("r1", config=FAST.__class__(**{**_fields(FAST), "command_bytes_max": 1024}))
    await eventually(lambda: r.is_leader)
    with pytest.raises(BadConsistencyError):
        await r.read(b"get", "eventual")
    with pytest.raises(BadConsistencyError):
        await r.read(b"get", "after")
    with pytest.raises(CommandTooLargeError):
        await r.propose(b"x" * 2000)
    with pytest.raises(CommandTooLargeError):
        await r.propose("text")  # type: ignore[arg-type]
    with pytest.raises(ReplicaIdInUseError):
        await env.replica("r1")
    with pytest.raises(ClientSessionError, match="never opened"):
        await r.propose(b"incr", session=ClientSession(99))
    with pytest.raises(ReplicaNotFoundError):
        await r.transfer_leadership("nobody")
    with pytest.raises(Exception, match="replica id"):
        ReplicatedStateMachine(r.client, namespace="apps", name="counter", state_machine=Counter(),
                               replica_id="bad/id")


def _fields(config: RsmConfig) -> dict[str, Any]:
    return {f: getattr(config, f) for f in config.__dataclass_fields__}


async def test_a_state_machine_that_raises_stops_the_replica(env: Env) -> None:
    r = await env.replica("r1")
    await eventually(lambda: r.is_leader)
    await r.propose(b"incr")
    with pytest.raises(StateMachineError, match="refused boom"):
        await r.propose(b"boom")
    assert isinstance(r.error, StateMachineError) and r.role.role is Role.STOPPED
    with pytest.raises(StateMachineError):
        await r.propose(b"incr")
    with pytest.raises(StateMachineError):
        await r.read(b"get")
    # a follower replaying the same stream stops at the same record, saying so
    f = await env.replica("r2")
    await eventually(lambda: f.error is not None)
    assert isinstance(f.error, StateMachineError) and "refused boom" in str(f.error)


# --- three replicas ---------------------------------------------------------------------------
async def test_three_replicas_forward_and_read_linearizably_from_followers(env: Env) -> None:
    replicas = [await env.replica(f"r{i}") for i in range(3)]
    leader = await leader_of(replicas)
    followers = [r for r in replicas if r is not leader]
    await eventually(lambda: all(f.leader is not None and f.leader[0] == leader.replica_id for f in followers))
    session = await followers[0].open_session()
    results = [await followers[i % 2].propose(b"incr", session=session) for i in range(20)]
    assert results == [str(i).encode() for i in range(1, 21)]
    for f in followers:  # read index: the follower waits to apply up to the leader's barrier
        assert await f.read(b"get") == b"20"
    no_forward = await env.replica("r9", config=FAST.__class__(**{**_fields(FAST), "forward_proposals": False}))
    await eventually(lambda: no_forward.leader is not None)
    with pytest.raises(RsmNotLeaderError) as info:
        await no_forward.propose(b"incr")
    assert info.value.leader_address == leader.address and info.value.retriable
    await eventually(lambda: all(r.applied == leader.applied for r in replicas))
    result = check_rsm([trace(r) for r in replicas])
    assert result.ok and result.positions == 20, result.explain()


async def test_followers_apply_what_an_idle_leader_confirmed_last(env: Env) -> None:
    """The leader pushes its ledger's LAC only after ``lac_push_delay_s`` with no later record
    set (the next command carries it; the push stays off the commit path): every segment
    ledger it writes has that delay, and once it goes idle its followers still apply its
    last command."""
    config = FAST.__class__(**{**_fields(FAST), "lac_push_delay_s": 0.3})
    replicas = [await env.replica(f"r{i}", config=config) for i in range(3)]
    leader = await leader_of(replicas)
    term = leader._term
    assert term is not None and term.writer.current_ledger is not None
    assert term.writer.current_ledger.explicit_lac_delay_s == 0.3
    assert [await leader.propose(b"incr") for _ in range(5)] == [b"1", b"2", b"3", b"4", b"5"]
    await eventually(lambda: all(r.applied == leader.applied for r in replicas), what="the followers applied command 5")
    assert [r.state.machine.count for r in replicas] == [5, 5, 5]


@pytest.mark.parametrize(("configured", "expected"), [
    ({}, (1, 0.02)), ({"tail_poll_replicas": 2}, (2, 0.02)), ({"tail_poll_pause_s": 0.0}, (1, 0.0))])
async def test_followers_tail_with_the_configured_poll_options(
        env: Env, configured: dict[str, Any], expected: tuple[int, float], monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower's tail long-polls ``tail_poll_replicas`` bookies per entry: by default
    one (its tail is off the commit path: half the poll answers the bookies send and it
    takes), 2 when configured; it pauses ``tail_poll_pause_s`` after each answer (by
    default 20 ms; 0: not at all); the followers apply every command either way."""
    from scriba.client.reader import LedgerReader

    asked: list[tuple[int, float]] = []
    tail = LedgerReader.tail

    def noted(self: LedgerReader, start: int = 0, **options: Any) -> Any:
        asked.append((options.get("poll_replicas", -1), options.get("poll_pause_s", -1.0)))
        return tail(self, start, **options)

    monkeypatch.setattr(LedgerReader, "tail", noted)
    replicas = [await env.replica(f"r{i}", config=FAST.__class__(**{**_fields(FAST), **configured}))
                for i in range(3)]
    leader = await leader_of(replicas)
    assert [await leader.propose(b"incr") for _ in range(3)] == [b"1", b"2", b"3"]
    await eventually(lambda: all(r.applied == leader.applied for r in replicas), what="the followers applied command 3")
    assert asked and set(asked) == {expected}, asked


async def test_a_read_waiting_on_a_follower_ends_its_tails_pause(env: Env) -> None:
    """A follower's tail, caught up, pauses ``tail_poll_pause_s`` (here 1 s); a read there
    that waits for a position ends the pause (``StreamReader.hurry``): it is answered long
    before the pause would have ended. (A replica that does not hurry its tail answers it
    when the pause ends: the mutant ``rsm-follower-read-does-not-hurry``.)"""
    config = FAST.__class__(**{**_fields(FAST), "tail_poll_pause_s": 1.0})
    replicas = [await env.replica(f"r{i}", config=config) for i in range(3)]
    leader = await leader_of(replicas)
    follower = next(r for r in replicas if r is not leader)
    assert await leader.propose(b"incr") == b"1"
    await eventually(lambda: follower.applied == leader.applied, what="the follower applied command 1")
    pausing = time.monotonic()  # its tail has delivered command 1 and pauses now
    assert await leader.propose(b"incr") == b"2"
    assert leader.applied is not None
    assert await follower.read(b"get", "after", after=leader.applied) == b"2"
    assert time.monotonic() - pausing < 0.7, "the read waited out the tail's pause"
    assert await follower.read(b"get", "after", after=leader.applied) == b"2"  # applied: no wait at all


def test_tail_poll_replicas_is_checked() -> None:
    assert RsmConfig().validate().tail_poll_replicas == 1
    for bad in (0, 3):
        with pytest.raises(ConfigError, match="tail_poll_replicas"):
            RsmConfig(tail_poll_replicas=bad).validate()


def test_tail_poll_pause_is_checked() -> None:
    assert RsmConfig().validate().tail_poll_pause_s == 0.02
    for bad in (-0.001, 1.5):
        with pytest.raises(ConfigError, match="tail_poll_pause_s"):
            RsmConfig(tail_poll_pause_s=bad).validate()


def test_lac_push_delay_is_checked() -> None:
    assert RsmConfig().validate().lac_push_delay_s == 0.002
    for bad in (-0.001, 2.0):
        with pytest.raises(ConfigError, match="lac_push_delay_s"):
            RsmConfig(lac_push_delay_s=bad).validate()


async def test_failover_retries_apply_once(env: Env) -> None:
    replicas = [await env.replica(f"r{i}") for i in range(3)]
    leader = await leader_of(replicas)
    others = [r for r in replicas if r is not leader]
    session = await others[0].open_session()
    done: list[bytes] = []

    async def load() -> None:
        for _ in range(40):
            done.append(await others[0].propose(b"incr", session=session))

    task = asyncio.create_task(load())
    await eventually(lambda: len(done) >= 10)
    await env.crash(leader)
    await task
    new = await leader_of(others)
    assert new is not leader
    assert await new.read(b"get") == b"40"  # 40 distinct proposals applied once each
    assert done == [str(i).encode() for i in range(1, 41)]
    await eventually(lambda: others[0].applied == others[1].applied)
    assert check_rsm([trace(r) for r in others]).ok


async def test_transfer_leadership(env: Env) -> None:
    replicas = [await env.replica(f"r{i}") for i in range(3)]
    leader = await leader_of(replicas)
    await leader.propose(b"incr")
    target = next(r for r in replicas if r is not leader)
    await leader.transfer_leadership(target.replica_id)
    assert await leader_of(replicas) is target
    assert await target.propose(b"incr") == b"2"
    with pytest.raises(RsmNotLeaderError):
        await leader.transfer_leadership(leader.replica_id + "x")


async def test_transfer_leadership_through_the_replica_service(env: Env) -> None:
    """``RsmClient.transfer_leadership`` asked of a follower finds the leader, which hands over."""
    replicas = [await env.replica(f"r{i}") for i in range(3)]
    leader = await leader_of(replicas)
    follower, target = [r for r in replicas if r is not leader]
    client = RsmClient([follower.address], timeout_s=20.0)
    try:
        await client.transfer_leadership(target.replica_id)
        assert await leader_of(replicas) is target
        with pytest.raises(ReplicaNotFoundError):
            await client.transfer_leadership("nobody")
        with pytest.raises(BadRequestError):
            await client.transfer_leadership("no such/id")
        assert await leader_of(replicas) is target  # refused transfers moved nothing
    finally:
        await client.close()


async def test_member_record_comes_back_after_a_lost_session(env: Env) -> None:
    """A LOST metadata session takes the member record with it; the replica publishes it
    again on its new session, so members() and a transfer to it work without a role change."""
    replicas = [await env.replica(f"r{i}") for i in range(2)]
    leader = await leader_of(replicas)
    follower = next(r for r in replicas if r is not leader)
    await follower.client.store.expire_session_for_test()  # type: ignore[attr-defined]
    await eventually(lambda: follower.role.role is Role.FOLLOWER)

    async def listed() -> set[str]:
        return {m.replica_id for m in await leader.members()}

    async def follower_listed() -> bool:
        return follower.replica_id in await listed()

    await eventually(follower_listed, 10, what="the leader lists the follower as a member")
    await leader.transfer_leadership(follower.replica_id)
    assert await leader_of(replicas) is follower


# --- snapshots ------------------------------------------------------------------------------
SNAP = FAST.__class__(**{**_fields(FAST), "snapshot_every_commands": 25, "snapshots_kept": 2})


async def test_snapshots_truncate_and_restart_restores_with_the_same_digest(env: Env) -> None:
    await open_namespace(await env.client(), "apps", create=True, segment_records_max=10)  # many segments
    replicas = [await env.replica(f"r{i}", config=SNAP) for i in range(3)]
    leader = await leader_of(replicas)
    for _ in range(4):
        await asyncio.gather(*[leader.propose(b"incr") for _ in range(30)])
    await leader.snapshot()
    catalog = await read_catalog(leader.client, mb.catalog_key(leader.group))
    assert len(catalog.snapshots) == 2 and catalog.deleting == ()
    ns = await open_namespace(leader.client, "apps")
    info = await ns.info("counter")
    # whole segments below the oldest kept snapshot are gone
    assert Position(0, 0, 0) < info.record.truncated_before <= catalog.snapshots[0].position
    assert info.record.segments[0].seq > 0
    digest = await leader.read(b"digest")
    for r in replicas:
        await r.stop()
    restarted = [await env.replica(f"r{i}", config=SNAP) for i in range(3)]
    new = await leader_of(restarted)
    assert await new.read(b"digest") == digest and await new.read(b"get") == b"120"
    await eventually(lambda: all(r.applied == new.applied for r in restarted), what="every restarted replica caught up")
    for r in restarted:
        assert r.restored_from is not None and r.restored_from.position >= catalog.snapshots[-1].position
        machine = r.state.machine
        assert isinstance(machine, Counter)
        assert len(machine.log) < 40  # replayed only the tail after the snapshot
        assert await r.read(b"digest", "sequential") == digest


async def test_corrupt_newest_snapshot_falls_back_to_the_previous(env: Env) -> None:
    r = await env.replica("r1", config=SNAP)
    await eventually(lambda: r.is_leader)
    await asyncio.gather(*[r.propose(b"incr") for _ in range(10)])
    first = await r.snapshot()
    await asyncio.gather(*[r.propose(b"incr") for _ in range(10)])
    second = await r.snapshot()
    assert first < second
    await r.stop()
    key = mb.catalog_key(r.group)
    store = r.client.store
    raw = await store.get(key)
    catalog = CATALOG_CODEC.from_bytes(raw.value)
    doc = json.loads(catalog.to_bytes())
    doc["snapshots"][-1]["digest"] = "0" * 64  # the newest no longer matches its bytes
    await store.set(key, json.dumps(doc).encode(), expected_version=raw.version)
    again = await env.replica("r1", config=SNAP)
    assert again.restored_from is not None and again.restored_from.position == first
    await eventually(lambda: again.is_leader)
    assert await again.read(b"get") == b"20"


async def test_register_reads_see_every_acknowledged_write(env: Env) -> None:
    replicas = [await env.replica(f"r{i}", machine=Register(), name="reg") for i in range(3)]
    leader = await leader_of(replicas)
    for i in range(10):
        await leader.propose(b"set:%d" % i)
        for r in replicas:
            assert await r.read(b"get") == b"%d" % i


async def test_position_tokens_are_strings_too(env: Env) -> None:
    r = await env.replica("r1")
    await eventually(lambda: r.is_leader)
    committed = await r.submit(b"incr")
    assert await r.read(b"get", "after", after=str(committed.position)) == b"1"
    assert isinstance(committed.position, Position)




def test_sync_facade() -> None:
    """The blocking facade drives a replica from plain code. It runs in a child process: its
    event-loop thread trips a CPython 3.11 ``ast`` bug in pytest's own session-end imports."""
    script = Path(__file__).with_name("sync_facade_script.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("OK 1 1 leader s1"), done.stdout + done.stderr


async def test_shell_rsm_status(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from scriba.rsm.shell import SHELL_VERBS, cmd_rsm_status

    assert [v.name for v in SHELL_VERBS] == ["rsm-status"]
    replicas = [await env.replica(f"r{i}", config=SNAP) for i in range(2)]
    leader = await leader_of(replicas)
    await leader.propose(b"incr")
    await leader.snapshot()
    capsys.readouterr()
    assert await cmd_rsm_status(argparse.Namespace(target="apps/counter", json=True), env.uri) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["leader"] == leader.replica_id and len(doc["snapshots"]) == 1
    roles = {m["replica_id"]: m["role"] for m in doc["members"]}
    assert roles[leader.replica_id] == "leader" and sorted(roles.values()) == ["follower", "leader"]
    assert all(m["answered"] for m in doc["members"])
    lags = {m["replica_id"]: (m["lag_records"], m["lag_s"]) for m in doc["members"]}
    assert lags[leader.replica_id] == (0, 0.0) and all(s is not None and s >= 0 for _, s in lags.values())
    assert await cmd_rsm_status(argparse.Namespace(target="apps/counter", json=False), env.uri) == 0
    assert "leader " + leader.replica_id in capsys.readouterr().out
    with pytest.raises(Exception, match="NAMESPACE/NAME"):
        await cmd_rsm_status(argparse.Namespace(target="nonamespace", json=True), env.uri)


async def http_get(address: str, path: str) -> tuple[int, str]:
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = raw.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


async def scrape(r: ReplicatedStateMachine) -> dict[str, float]:
    """Every sample of the replica's /metrics, parsed: {"name{label=value}": value}."""
    from prometheus_client.parser import text_string_to_metric_families

    code, body = await http_get(r.metrics_address, "/metrics")
    assert code == 200, body
    return {s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


async def test_metrics_endpoint_serves_role_token_positions_lag_snapshot_and_batches(env: Env) -> None:
    replicas = [await env.replica(f"r{i}", config=SNAP, metrics_listen="127.0.0.1:0") for i in range(2)]
    leader = await leader_of(replicas)
    follower = next(r for r in replicas if r is not leader)
    await asyncio.gather(*(leader.propose(b"incr") for _ in range(20)))
    await leader.snapshot()
    m = await scrape(leader)
    assert m["scriba_rsm_role{role=leader}"] == 1 and m["scriba_rsm_role{role=follower}"] == 0
    assert m["scriba_rsm_fencing_token"] == leader.role.token > 0
    assert m["scriba_rsm_records_applied"] == leader.state.records_applied >= 20
    assert m["scriba_rsm_commands_applied"] == 20
    assert leader.applied is not None and m["scriba_rsm_applied_segment"] == leader.applied.segment_seq
    assert m["scriba_rsm_proposals_total"] == 20
    assert m["scriba_rsm_lag_records"] == 0 and m["scriba_rsm_lag_seconds"] == 0
    assert 0 <= m["scriba_rsm_snapshot_age_seconds"] < 60
    assert m["scriba_rsm_snapshot_segment"] == leader.snapshot_info.position.segment_seq
    assert leader._term is not None
    # every appended record set observed once, its size summed (group commit: fewer sets than records)
    assert m["scriba_rsm_batch_records_count"] == leader._term.batches_sent >= 1
    assert m["scriba_rsm_batch_records_sum"] == leader._term.records_sent
    assert m["scriba_rsm_batch_records_bucket{le=+Inf}"] == leader._term.batches_sent

    await eventually(lambda: follower.state.records_applied == leader.state.records_applied)
    f = await scrape(follower)
    assert f["scriba_rsm_role{role=follower}"] == 1 and f["scriba_rsm_role{role=leader}"] == 0
    assert f["scriba_rsm_lag_records"] == 0 and f["scriba_rsm_lag_seconds"] == 0
    assert f["scriba_rsm_records_applied"] == m["scriba_rsm_records_applied"]
    assert f["scriba_rsm_proposals_total"] == 0 and f["scriba_rsm_batch_records_count"] == 0
    assert (await http_get(leader.metrics_address, "/nothing"))[0] == 404


def test_metrics_lag_is_the_leaders_records_and_clock_ahead() -> None:
    from scriba.rsm.metrics import lag

    own = {"role": "follower", "records_applied": 10, "clock_ms": 5_000}
    assert lag(own, {"records_applied": 13, "clock_ms": 7_500}) == (3, 2.5)
    assert lag(own, {"records_applied": 10, "clock_ms": 9_000}) == (0, 0.0)  # caught up: no seconds behind
    assert lag(own, None) == (None, None)  # the leader unknown: unknown, not 0
    assert lag({**own, "role": "leader"}, None) == (0, 0.0)


async def test_metrics_listen_bad_address_is_a_config_error(env: Env) -> None:
    for bad in ("nohost", "127.0.0.1:x", "127.0.0.1:70000", ":80"):
        with pytest.raises(ConfigError, match="metrics_listen"):
            await env.replica("r1", metrics_listen=bad, start=False)


async def test_a_store_out_of_reach_while_campaigning_does_not_end_the_campaign(env: Env) -> None:
    """A cut from the metadata store that outlasts a call's deadline fails the campaign's store
    calls (the transfer check, the claim's retries); the replica campaigns again once the store
    answers. Ending the campaign there left replicas cut off once out of every later election."""
    r = await env.replica("r1", start=False)
    store = r.client.store
    real_get = store.get
    failed: list[str] = []

    async def get(key: str) -> Any:
        if key == mb.transfer_key(r.group) and len(failed) < 3:  # the store unreachable for a while
            failed.append(key)
            raise MetadataUnavailableError(f"get {key}: no answer within 10.0s")
        return await real_get(key)

    store.get = get  # type: ignore[method-assign]
    await r.start()
    await eventually(lambda: r.is_leader, 20.0, what="the replica leads once the store answers")
    assert len(failed) == 3
