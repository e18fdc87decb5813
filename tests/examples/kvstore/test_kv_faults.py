"""The store's watches and leases under leader faults (real processes, one cluster).

Watch continuity across 10 leader fail-overs: every watcher sees every revision
exactly once, in order, with no gap.

A writer (aetcd, failing over to the next replica on an error) puts ``wc/<n> = n``
while the leader is SIGKILLed (and restarted) 10 times. Watchers on the prefix,
from the revision before the first put:
- ``aetcd`` following the leader: it (re)connects to whichever replica leads, so each
  kill breaks its stream; it resumes elsewhere from its last revision + 1, as etcd's
  clients do;
- ``aetcd`` on a round-robin replica, resuming the same way when its replica dies;
- Debian's ``etcdctl watch --rev`` given every endpoint (clientv3 resumes by itself).

Only this writer writes in this cluster, so the revisions from the first put to the
last are exactly the writes: each watcher's revisions must be that range, strictly
increasing, each event the put that made it, and every acknowledged put among them.

Lease expiry with a paused leader: the next leader decides it; the keys go once, in
one revision, on every replica.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
from dataclasses import dataclass, field

import aetcd
import pytest
from kv_faults import CLIENT_ERRORS, FaultCluster, Nemesis, leader_index

from scriba.embedded.kvstore import KvCluster
from scriba.testing.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("collect_on_the_loop"), pytest.mark.timeout(900)]

FAILOVERS = 10
PREFIX = b"wc/"
OP_TIMEOUT_S = 5
CATCH_UP_DEADLINE_S = 90.0
RUN_DEADLINE_S = 600.0



def client(kv: KvCluster, index: int) -> aetcd.Client:
    host, port = kv.replicas[index].endpoint.rsplit(":", 1)
    return aetcd.Client(host, int(port), timeout=OP_TIMEOUT_S)


@dataclass
class Seen:
    name: str
    events: list[tuple[int, bytes, bytes]] = field(default_factory=list)  # (mod_revision, key, value)
    resumes: int = 0

    @property
    def last(self) -> int:
        return self.events[-1][0] if self.events else 0


async def writer(kv: KvCluster, stop: asyncio.Event, acked: dict[int, tuple[bytes, bytes]]) -> None:
    index, n = 0, 0
    while not stop.is_set():
        n += 1
        key, value = PREFIX + b"%06d" % n, b"%d" % n
        try:
            async with client(kv, index) as c:
                while not stop.is_set():
                    acked[(await c.put(key, value)).header.revision] = (key, value)
                    n += 1
                    key, value = PREFIX + b"%06d" % n, b"%d" % n
        except CLIENT_ERRORS:
            index = (index + 1) % len(kv.replicas)  # this put is indeterminate: the next one has a new key
            await asyncio.sleep(0.05)  # retry pacing, not synchronisation


async def aetcd_watcher(kv: KvCluster, seen: Seen, start: int, follow_leader: bool, stop: asyncio.Event) -> None:
    index = 0
    while not stop.is_set():
        if follow_leader:
            index = await leader_index(kv)
        try:
            async with client(kv, index) as c:
                watch = await c.watch_prefix(PREFIX, start_revision=max(start, seen.last + 1))
                try:
                    async for event in watch:
                        seen.events.append((event.kv.mod_revision, event.kv.key, event.kv.value))
                        if stop.is_set():
                            break
                finally:
                    with contextlib.suppress(*CLIENT_ERRORS):
                        await watch.cancel()
        except CLIENT_ERRORS:
            seen.resumes += 1
            index = (index + 1) % len(kv.replicas)
            await asyncio.sleep(0.1)  # retry pacing, not synchronisation


async def etcdctl_watcher(kv: KvCluster, seen: Seen, start: int, stop: asyncio.Event) -> None:
    proc = await asyncio.create_subprocess_exec(
        "etcdctl", "--endpoints", kv.endpoints, "watch", "--prefix", PREFIX.decode(), "--rev", str(start),
        "-w", "json", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "ETCDCTL_API": "3"})
    assert proc.stdout is not None
    try:
        while not stop.is_set():
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), 0.5)
            except TimeoutError:
                continue
            if not line:
                return
            for event in json.loads(line).get("Events") or []:
                kv_ = event["kv"]
                seen.events.append((int(kv_["mod_revision"]), base64.b64decode(kv_["key"]),
                                    base64.b64decode(kv_.get("value", ""))))
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGTERM)  # our own child, by its PID
        await proc.wait()


async def test_watchers_see_every_revision_once_across_10_leader_failovers(fault_cluster: FaultCluster) -> None:
    kv = fault_cluster.kv
    async with client(kv, await leader_index(kv)) as c:
        start = (await c.put(b"before", b"x")).header.revision + 1  # the first revision of the writer
    acked: dict[int, tuple[bytes, bytes]] = {}
    watchers = [Seen("aetcd-leader"), Seen("aetcd-round-robin"), Seen("etcdctl")]
    stop_writes, stop_watch = asyncio.Event(), asyncio.Event()
    nemesis = Nemesis(kv, fault_cluster.meta_proxies)
    tasks = [asyncio.create_task(aetcd_watcher(kv, watchers[0], start, True, stop_watch)),
             asyncio.create_task(aetcd_watcher(kv, watchers[1], start, False, stop_watch)),
             asyncio.create_task(etcdctl_watcher(kv, watchers[2], start, stop_watch))]
    write_task = asyncio.create_task(writer(kv, stop_writes, acked))
    try:
        async with asyncio.timeout(RUN_DEADLINE_S):
            await nemesis.run(["kill"] * FAILOVERS, gap_s=1.5)
            await asyncio.sleep(1.0)  # fault pacing: a last stretch of writes after the final fail-over
            stop_writes.set()
            await write_task
            async with client(kv, await leader_index(kv)) as c:
                final = (await c.put(b"after", b"x")).header.revision - 1  # the writer's last revision
        await eventually(lambda: min(w.last for w in watchers) >= final, CATCH_UP_DEADLINE_S,
                         what="every watcher saw the writer's last revision", interval_s=0.2)
    finally:
        stop_writes.set()
        stop_watch.set()
        for t in [write_task, *tasks]:
            t.cancel()
        for t in [write_task, *tasks]:
            with contextlib.suppress(asyncio.CancelledError, *CLIENT_ERRORS):
                await t
    assert nemesis.done["kill"] == FAILOVERS and len(acked) > 100
    print(f"watch continuity: {len(acked)} acknowledged puts, revisions {start}..{final}, leaders killed "
          f"{nemesis.leaders}, resumes {[w.resumes for w in watchers]}")
    assert watchers[0].resumes >= FAILOVERS // 2  # the leader-following watcher really lost its stream
    for w in watchers:
        revisions = [rev for rev, _, _ in w.events if rev <= final]
        assert revisions == list(range(start, final + 1)), f"{w.name}: gaps, repeats or disorder"
        for rev, key, value in w.events:
            assert key == PREFIX + b"%06d" % int(value), f"{w.name}: revision {rev} is not the put that made it"
            if rev in acked:
                assert acked[rev] == (key, value)
        assert set(acked) <= set(revisions)


LEASE_TTL_S = 3
LEASE_KEYS = [b"lease/%d" % i for i in range(3)]
LEASE_PAUSE_S = 6.0  # past the lease's TTL and the leader's metadata session


async def test_lease_expires_once_by_the_replicated_decision_while_the_leader_is_paused(
        fault_cluster: FaultCluster) -> None:
    """The leader is SIGSTOPped holding a lease: the next leader decides the expiry; the keys
    go once (one revision, one DELETE each, seen by a watcher), on every replica; the old
    leader, resumed, expires nothing again."""
    kv = fault_cluster.kv
    leader = await leader_index(kv)
    follower = (leader + 1) % len(kv.replicas)
    async with client(kv, leader) as c:
        lease = await c.lease(LEASE_TTL_S)
        for key in LEASE_KEYS:
            start = (await c.put(key, b"v", lease=lease)).header.revision + 1
    seen: list[tuple[str, bytes, int]] = []
    async with client(kv, follower) as w:
        watch = await w.watch_prefix(b"lease/", start_revision=start)
        kv.signal(leader, signal.SIGSTOP)
        try:
            async with asyncio.timeout(CATCH_UP_DEADLINE_S):
                async for event in watch:
                    seen.append((event.kind, event.kv.key, event.kv.mod_revision))
                    if len(seen) == len(LEASE_KEYS):
                        break
            await asyncio.sleep(max(0.0, LEASE_PAUSE_S - 1.0))
        finally:
            kv.signal(leader, signal.SIGCONT)
        async with client(kv, leader) as back:  # the old leader, resumed: catches up, expires nothing

            async def expired_there() -> bool:
                return await back.get(LEASE_KEYS[0], serializable=True) is None

            await eventually(expired_there, CATCH_UP_DEADLINE_S, what="the resumed old leader applied the expiry",
                             interval_s=0.2)
            marker = (await back.put(b"lease-marker", b"x")).header.revision
        async with asyncio.timeout(CATCH_UP_DEADLINE_S):  # anything after the expiry would come before the marker
            await w.put(b"lease/after", b"y")
            async for event in watch:
                seen.append((event.kind, event.kv.key, event.kv.mod_revision))
                if event.kv.key == b"lease/after":
                    break
        await watch.cancel()
    deletes = [s for s in seen if s[0] == "DELETE"]
    assert sorted(key for _, key, _ in deletes) == LEASE_KEYS  # each key expired exactly once
    assert len({rev for _, _, rev in deletes}) == 1  # by one replicated decision: one revision
    assert seen[-1][1] == b"lease/after" and len(seen) == len(LEASE_KEYS) + 1
    assert marker == deletes[0][2] + 1  # no other revision in between: nothing expired twice
    for r in kv.replicas:  # every replica: the keys and the lease are gone
        async with client(kv, kv.replicas.index(r)) as c:
            for key in LEASE_KEYS:
                assert await c.get(key, serializable=True) is None
            ttl = await c.get_lease_info(lease.id)
            assert ttl.TTL == -1
