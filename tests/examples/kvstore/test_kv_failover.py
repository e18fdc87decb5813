"""The leader replica SIGKILLed during writes: etcdctl and aetcd keep working against the
others, every acknowledged write is there on every survivor, and the killed replica
catches up when restarted."""

from __future__ import annotations

import asyncio
import json
import time

import aetcd
import pytest
from kv_harness import Ctl

from scriba.embedded.kvstore import KvCluster
from scriba.testing.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WRITES = 60
KILL_AT = 20
RETRY_DEADLINE_S = 60.0


def leader_index(ctl: Ctl, kv: KvCluster, exclude: int | None = None) -> int:
    found: list[int] = []

    def one_leads() -> bool:
        for i, r in enumerate(kv.replicas):
            if i == exclude or not r.running:
                continue
            p = ctl.run("endpoint", "status", "-w", "json", endpoints=r.endpoint)
            if p.returncode == 0 and '"leader":' in p.stdout:
                status = json.loads(p.stdout)[0]["Status"]
                if status["leader"] == status["header"]["member_id"]:
                    found.append(i)
                    return True
        return False

    wait_until(one_leads, RETRY_DEADLINE_S, what="a leader among the running replicas", interval_s=0.2)
    return found[0]


def put_until_done(ctl: Ctl, key: str, value: str, endpoints: str) -> int:
    """Retry one put (same key and value: idempotent) until acknowledged; the attempts it took."""
    deadline = time.monotonic() + RETRY_DEADLINE_S
    attempts = 0
    while True:
        attempts += 1
        if ctl.run("put", key, value, endpoints=endpoints).returncode == 0:
            return attempts
        assert time.monotonic() < deadline, f"put {key} never acknowledged"
        time.sleep(0.1)  # retry pacing (the attempts are counted), not synchronisation


async def aetcd_put(kv: KvCluster, index: int, key: bytes, value: bytes) -> None:
    host, port = kv.replicas[index].endpoint.rsplit(":", 1)
    async with asyncio.timeout(RETRY_DEADLINE_S):
        while True:
            try:
                async with aetcd.Client(host, int(port), timeout=20) as c:
                    await c.put(key, value)
                    return
            except aetcd.ClientError:
                await asyncio.sleep(0.1)  # retry pacing, not synchronisation


def test_leader_killed_during_writes(kv_cluster: KvCluster, ctl: Ctl) -> None:
    leader = leader_index(ctl, kv_cluster)
    survivors = [i for i in range(3) if i != leader]
    endpoints = ",".join(kv_cluster.replicas[i].endpoint for i in survivors)
    for i in range(WRITES):
        if i == KILL_AT:
            kv_cluster.kill(leader)  # SIGKILL, mid-load
        # before the kill: through every endpoint (the leader included); after: the survivors only
        put_until_done(ctl, f"f/{i:03d}", f"v{i}", ctl.endpoints if i < KILL_AT else endpoints)
        if i % 10 == 5:  # aetcd too, on a survivor
            asyncio.run(aetcd_put(kv_cluster, survivors[i % 2], b"f/aetcd-%03d" % i, b"a%d" % i))
    new_leader = leader_index(ctl, kv_cluster, exclude=leader)
    assert new_leader in survivors
    expected = [x for i in range(WRITES) for x in (f"f/{i:03d}", f"v{i}")]
    for i in survivors:  # linearizable reads on each survivor: every acknowledged write
        got = ctl.ok("get", "--prefix", "f/0", endpoints=kv_cluster.replicas[i].endpoint).split()
        assert got == expected
        assert len(ctl.ok("get", "--prefix", "f/aetcd-", "--keys-only",
                          endpoints=kv_cluster.replicas[i].endpoint).split()) == WRITES // 10
    # the killed replica comes back and catches up (serializable: its own applied state)
    kv_cluster.start(leader)
    back = kv_cluster.replicas[leader].endpoint
    wait_until(lambda: ctl.ok("get", "--prefix", "f/0", "--consistency", "s", endpoints=back).split() == expected,
               RETRY_DEADLINE_S, what="the restarted replica caught up", interval_s=0.2)
