"""RSM replicas as real processes (``rsm_replica_proc.py``) on real bookies and real etcd.

- R15: the leader SIGKILLed or SIGSTOPped (past its session expiry, then resumed: R7)
  during a write load from several clients with exactly-once sessions. CI: 10 fail-overs;
  ``SCRIBA_SOAK=1``: 50. Checks: every confirmed command counted once (the final count
  equals the number of confirmed commands; results distinct), the RSM convergence
  checker over every replica incarnation's apply trace (same command at each position,
  equal digests at equal positions, nothing applied twice, positions increasing) —
  a resumed deposed leader that applied its own post-fence proposals would diverge.
- Linearizable reads (register) under leader pauses, checked by the linearizability
  checker; its negative control (replicas answering "linearizable" locally without the
  barrier, read from followers) must be reported non-linearizable.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from scriba.embedded.process import free_port
from scriba.errors import ScribaError
from scriba.rsm.remote import RsmClient
from scriba.testing.checkers import Applied, Operation, ReplicaTrace, check_register, check_rsm
from scriba.testing.cluster import BookieCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROC = str(Path(__file__).with_name("rsm_replica_proc.py"))
SOAK = os.environ.get("SCRIBA_SOAK") == "1"
FAILOVERS = 50 if SOAK else 10
REPLICA_CONFIG = {"campaign_backoff_s": 0.1, "suspended_grace_s": 0.5, "snapshot_every_commands": 300,
                  "writer_lock_timeout_s": 60.0, "propose_timeout_s": 20.0}


def free_address() -> str:
    return f"127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def backend(etcd_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    uri = str(etcd_cluster.uri(f"r{uuid.uuid4().hex[:8]}"))
    bookies = BookieCluster(tmp_path_factory.mktemp("rsm-bookies"), uri)
    bookies.start_bookies(3, zones=["z1", "z2", "z3"])
    try:
        yield uri
    finally:
        bookies.stop_all()


@dataclass
class Replica:
    rid: str
    address: str
    dir: Path
    incarnation: int = 0
    proc: asyncio.subprocess.Process | None = None
    paused: bool = False
    traces: list[Path] = field(default_factory=list)


class Group:
    def __init__(self, uri: str, machine: str, base: Path, config: dict[str, Any]) -> None:
        self.uri, self.machine, self.config = uri, machine, config
        self.namespace = f"t{uuid.uuid4().hex[:8]}"  # each group its own stream and member ids
        self.replicas = [Replica(f"r{i}", free_address(), base) for i in range(3)]

    async def start(self, r: Replica) -> None:
        r.incarnation += 1
        trace = r.dir / f"{r.rid}-{r.incarnation}.trace"
        r.traces.append(trace)
        with (r.dir / f"{r.rid}-{r.incarnation}.log").open("w") as log_file:
            r.proc = await asyncio.create_subprocess_exec(
                sys.executable, PROC, self.uri, self.namespace, r.rid, r.address, str(trace), self.machine, json.dumps(self.config),
                stdout=asyncio.subprocess.PIPE, stderr=log_file,
            )
        assert r.proc.stdout is not None
        line = await asyncio.wait_for(r.proc.stdout.readline(), 60)
        assert line.strip() == b"READY", f"{r.rid} did not start: {line!r}"

    def signal(self, r: Replica, sig: int) -> None:
        assert r.proc is not None and r.proc.returncode is None
        os.kill(r.proc.pid, sig)  # our own child, by its PID

    async def kill(self, r: Replica) -> None:
        if r.proc is not None and r.proc.returncode is None:
            if r.paused:
                self.signal(r, signal.SIGCONT)
                r.paused = False
            self.signal(r, signal.SIGKILL)
            await r.proc.wait()

    async def leader(self, client: RsmClient, exclude: Replica | None = None, timeout_s: float = 60) -> Replica:
        async with asyncio.timeout(timeout_s):
            while True:
                for r in self.replicas:
                    if r is exclude or r.paused or r.proc is None or r.proc.returncode is not None:
                        continue
                    try:
                        if (await client.status(r.address))["role"] == "leader":
                            return r
                    except ScribaError:
                        pass
                await asyncio.sleep(0.05)

    async def statuses(self, client: RsmClient) -> list[dict[str, Any]]:
        return [await client.status(r.address) for r in self.replicas]

    def traces(self) -> list[ReplicaTrace]:
        out = []
        for r in self.replicas:
            for path in r.traces:
                applied, digests = [], {}
                for line in path.read_text().splitlines():
                    pos, command, digest = json.loads(line)
                    if pos == "restore":
                        continue
                    seg, entry, slot = (int(x) for x in pos.split(":"))
                    number = (seg << 40) | (entry << 16) | slot
                    applied.append(Applied(number, command, digest))
                out.append(ReplicaTrace.build(path.name, applied, digests))
        return out


@pytest.fixture
async def group_factory(backend: str, tmp_path: Path) -> AsyncIterator[Any]:
    groups: list[Group] = []

    def make(machine: str, config: dict[str, Any] | None = None) -> Group:
        g = Group(backend, machine, tmp_path, {**REPLICA_CONFIG, **(config or {})})
        groups.append(g)
        return g

    try:
        yield make
    finally:
        for g in groups:
            for r in g.replicas:
                await g.kill(r)


async def test_r15_failovers_under_load_lose_nothing_and_apply_once(group_factory: Any) -> None:
    group: Group = group_factory("counter")
    for r in group.replicas:
        await group.start(r)
    admin = RsmClient([r.address for r in group.replicas], timeout_s=120)
    confirmed: dict[str, bytes] = {}
    stop = asyncio.Event()

    async def load(c: int) -> None:
        client = RsmClient([r.address for r in group.replicas], timeout_s=120, attempt_timeout_s=3.0)
        session = await client.open_session()
        for seq in itertools.count(1):
            if stop.is_set():
                break
            command = f"incr:{c}:{seq}".encode()
            confirmed[command.decode()] = await client.propose(command, session=session, seq=seq)
        await client.close()

    loads = [asyncio.create_task(load(c)) for c in range(3)]
    kills = pauses = 0
    try:
        for i in range(FAILOVERS):
            before = len(confirmed)
            async with asyncio.timeout(60):
                while len(confirmed) < before + 30:
                    await asyncio.sleep(0.02)
            leader = await group.leader(admin)
            started = time.monotonic()
            if i % 2 == 0:
                kills += 1
                await group.kill(leader)
                await group.leader(admin, exclude=leader)
                await group.start(leader)
            else:
                pauses += 1
                group.signal(leader, signal.SIGSTOP)
                leader.paused = True
                await group.leader(admin, exclude=leader)
                await asyncio.sleep(0.5)  # the new leader serves while the old one is still stopped
                group.signal(leader, signal.SIGCONT)
                leader.paused = False
            print(f"fail-over {i} ({'kill' if i % 2 == 0 else 'pause'}): {time.monotonic() - started:.2f}s")
    finally:
        stop.set()
        await asyncio.gather(*loads)
    total = len(confirmed)
    assert kills + pauses == FAILOVERS and total >= 30 * FAILOVERS
    assert sorted(int(v) for v in confirmed.values()) == list(range(1, total + 1))  # each once, none lost
    assert await admin.read(b"get") == str(total).encode()
    async with asyncio.timeout(60):
        while len({s["applied"] for s in await group.statuses(admin)}) != 1:
            await asyncio.sleep(0.1)
    digests = {await admin.read(b"digest", "sequential", address=r.address) for r in group.replicas}
    assert len(digests) == 1
    result = check_rsm(group.traces())
    assert result.ok and result.compared_digests > 0, result.explain()
    await admin.close()


async def _register_history(group: Group, *, pauses: int, follower_reads: bool, ops: int) -> list[Operation]:
    admin = RsmClient([r.address for r in group.replicas], timeout_s=60)
    history: list[Operation] = []
    values = itertools.count(1)
    leader = await group.leader(admin)
    readers = [r for r in group.replicas if r is not leader] if follower_reads else group.replicas

    async def writer(name: str) -> None:
        client = RsmClient([r.address for r in group.replicas], timeout_s=60)
        session = await client.open_session()
        for _ in range(ops):
            v = next(values)
            call = time.monotonic()
            try:
                await client.propose(b"set:%d" % v, session=session)
                history.append(Operation(name, "write", v, None, call, time.monotonic()))
            except ScribaError:
                history.append(Operation(name, "write", v, None, call))  # indeterminate
            for r in readers:  # read right after the write returned, from each reader replica
                call = time.monotonic()
                try:
                    out = await client.read(b"get", address=r.address)
                except ScribaError:
                    continue  # a failed read constrains nothing
                history.append(Operation(f"{name}-{r.rid}", "read", None, int(out) if out else None,
                                         call, time.monotonic()))
        await client.close()

    async def faults() -> None:
        for _ in range(pauses):
            await asyncio.sleep(1.0)
            current = await group.leader(admin)
            group.signal(current, signal.SIGSTOP)
            current.paused = True
            await asyncio.sleep(3.0)  # past the session expiry: another replica takes over
            group.signal(current, signal.SIGCONT)
            current.paused = False

    await asyncio.gather(writer("w1"), writer("w2"), faults())
    await admin.close()
    return history


async def test_linearizable_reads_under_leader_pauses(group_factory: Any) -> None:
    group: Group = group_factory("register")
    for r in group.replicas:
        await group.start(r)
    history = await _register_history(group, pauses=2, follower_reads=False, ops=80)
    reads = [op for op in history if op.f == "read"]
    assert len(reads) > 100
    result = check_register(history)
    assert result.ok, result.explain()


async def test_negative_control_local_linearizable_reads_are_caught(group_factory: Any) -> None:
    group: Group = group_factory("register", {"unsafe_local_linearizable_reads": True})
    for r in group.replicas:
        await group.start(r)
    history = await _register_history(group, pauses=0, follower_reads=True, ops=150)
    result = check_register(history)
    assert not result.ok, "reads answered locally by followers were not reported non-linearizable"
