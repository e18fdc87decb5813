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
import os
import signal
import time
from typing import Any

import pytest
from rsm_group import Group

from scriba.errors import ScribaError
from scriba.rsm.remote import RsmClient
from scriba.testing.checkers import Operation, check_register, check_rsm
from scriba.testing.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SOAK = os.environ.get("SCRIBA_SOAK") == "1"
FAILOVERS = 50 if SOAK else 10


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

    async def confirmed_at_least(count: int, what: str) -> None:
        await eventually(lambda: len(confirmed) >= count, 60, what=what, interval_s=0.02)

    loads = [asyncio.create_task(load(c)) for c in range(3)]
    kills = pauses = 0
    try:
        for i in range(FAILOVERS):
            before = len(confirmed)
            await confirmed_at_least(before + 30, "30 more commands confirmed")
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
                await confirmed_at_least(len(confirmed) + 1,
                                         "the new leader confirms a command while the old one is still stopped")
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
    async def all_applied_alike() -> bool:
        return len({s["applied"] for s in await group.statuses(admin)}) == 1

    await eventually(all_applied_alike, 60, what="every replica applied the same index", interval_s=0.1)
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
            await asyncio.sleep(1.0)  # fault pacing, not synchronisation: the writers run a while between pauses
            current = await group.leader(admin)
            group.signal(current, signal.SIGSTOP)
            current.paused = True
            await group.leader(admin, exclude=current)  # past the session expiry: another replica takes over
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
