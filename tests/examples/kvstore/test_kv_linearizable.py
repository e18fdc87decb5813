"""R16: the store's history under faults is linearizable.

Real processes (etcd, 3 bookies, 3 store replicas each reaching etcd through its own
fault proxy), real clients: ``aetcd`` workers on every replica (failing over to the
next replica after an error) and one ``etcdctl`` process loop given all endpoints.
Operations on 40 keys (fewer than 200 each): linearizable get, put of a unique value,
compare-and-set as a Txn (value or "absent" compared, put on success), delete
(a put of None for the checker). Meanwhile the leader is SIGKILLed and restarted,
paused past its metadata session, and cut off from etcd, in turn. A write that failed
or timed out is indeterminate (``info``); a failed read constrains nothing.

The history goes to ``scriba.testing``'s KV linearizability checker. Negative control:
serializable reads (a follower's applied state) recorded as linearizable gets, read
right after each acknowledged write, must be reported non-linearizable.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from typing import Any

import aetcd
import pytest
from kv_faults import CLIENT_ERRORS, FAULTS, FaultCluster, Nemesis, follower_read_history

from scriba.embedded.kvstore import KvCluster
from scriba.testing.checkers import check_kv
from scriba.testing.history import History

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("collect_on_the_loop"), pytest.mark.timeout(900)]

SOAK = os.environ.get("SCRIBA_SOAK") == "1"
OPS_MIN = 20_000 if SOAK else 5_000
KEYS = 40
OPS_PER_EPOCH = 4_000  # each epoch works on fresh keys: fewer than 200 operations per key
WORKERS = 8
FAULT_ROUNDS = 4 if SOAK else 2  # each round: kill, pause, partition
FAULT_GAP_S = 3.0
OP_TIMEOUT_S = 5
THROTTLE_S = 0.1
OP_DEADLINE_S = 15.0  # an operation's hard bound (aetcd's own timeout is per RPC)
RUN_DEADLINE_S = 600.0
SEED = int(os.environ.get("SCRIBA_SEED", "16"))



class Budget:
    """Operations left to start; workers stop when it is spent and the faults are over."""

    def __init__(self, ops: int) -> None:
        self.left = ops
        self.started = 0
        self.faults_done = asyncio.Event()

    def take(self) -> bool:
        self.left -= 1
        self.started += 1
        return self.left >= 0 or not self.faults_done.is_set()

    def key(self, prefix: str, rng: random.Random) -> str:
        return f"{prefix}{self.started // OPS_PER_EPOCH}.{rng.randrange(KEYS)}"


class Worker:
    """One aetcd client on one replica at a time; after an error, the next replica."""

    def __init__(self, name: str, kv: KvCluster, prefix: str, seed: int, history: History) -> None:
        self.name, self.kv, self.prefix, self.history = name, kv, prefix, history
        self.rng = random.Random(seed)
        self.index = self.rng.randrange(len(kv.replicas))
        self.client: aetcd.Client | None = None
        self.generation = 0
        self.seq = 0

    @property
    def process(self) -> str:
        return f"{self.name}.{self.generation}"  # a new process after an indeterminate op

    async def connect(self) -> aetcd.Client:
        if self.client is None:
            host, port = self.kv.replicas[self.index].endpoint.rsplit(":", 1)
            self.client = aetcd.Client(host, int(port), timeout=OP_TIMEOUT_S)
        return self.client

    async def drop(self) -> None:
        if self.client is not None:
            with contextlib.suppress(*CLIENT_ERRORS):
                await self.client.close()
        self.client = None
        self.index = (self.index + 1) % len(self.kv.replicas)

    async def run(self, budget: Budget) -> None:
        try:
            while budget.take():
                if budget.left < 0:  # the budget is spent, the faults are not over: pace the load, so a
                    await asyncio.sleep(THROTTLE_S)  # fast machine does not give the checker a huge history
                await self.one(budget.key(self.prefix, self.rng))
        finally:
            await self.drop()

    async def one(self, key: str) -> None:
        self.seq += 1
        value = f"{self.name}-{self.seq}"
        roll = self.rng.random()
        if roll < 0.45:
            f, arg = "get", key
        elif roll < 0.8:
            f, arg = "put", [key, value]
        elif roll < 0.95:
            f, arg = "cas", [key, self.rng.choice([None, f"{self.name}-{self.seq - 1}", value]), value]
        else:
            f, arg = "put", [key, None]  # delete
        op_id = self.history.invoke(self.process, f, arg)
        try:
            async with asyncio.timeout(OP_DEADLINE_S):
                out = await self.call(f, arg)
        except CLIENT_ERRORS as exc:
            if f == "get":
                self.history.fail(op_id, exc)  # a read that failed constrains nothing
            else:
                self.history.info(op_id, exc)
                self.generation += 1
            await self.drop()
            return
        self.history.ok(op_id, out)

    async def call(self, f: str, arg: Any) -> Any:
        c = await self.connect()
        if f == "get":
            got = await c.get(arg.encode())
            return None if got is None else got.value.decode()
        key, *rest = arg
        if f == "put" and rest[0] is None:
            await c.delete(key.encode())
            return None
        if f == "put":
            await c.put(key.encode(), rest[0].encode())
            return None
        old, new = rest
        tx = c.transactions
        compare = tx.version(key.encode()) == 0 if old is None else tx.value(key.encode()) == old.encode()
        succeeded, _ = await c.transaction(compare=[compare], success=[tx.put(key.encode(), new.encode())],
                                           failure=[])
        return bool(succeeded)


async def etcdctl_loop(kv: KvCluster, prefix: str, history: History, budget: Budget, seed: int) -> int:
    """Debian's etcdctl, a process per operation, given every endpoint (it fails over itself)."""
    rng = random.Random(seed)
    generation = done = 0
    while budget.take():
        key = budget.key(prefix, rng)
        put = rng.random() < 0.5
        value = f"ctl-{done}"
        args = ["put", key, value] if put else ["get", key, "--print-value-only"]
        op_id = history.invoke(f"ctl.{generation}", "put" if put else "get", [key, value] if put else key)
        proc = await asyncio.create_subprocess_exec(
            "etcdctl", "--endpoints", kv.endpoints, f"--command-timeout={OP_TIMEOUT_S}s", *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ, "ETCDCTL_API": "3"})
        out, err = await proc.communicate()
        if proc.returncode != 0:
            if put:
                history.info(op_id, err.decode(errors="replace")[-200:])
                generation += 1
            else:
                history.fail(op_id, err.decode(errors="replace")[-200:])
        else:
            history.ok(op_id, None if put else (out.decode().rstrip("\n") or None))
        done += 1
    return done


async def test_r16_history_under_kills_pauses_and_partitions_is_linearizable(fault_cluster: FaultCluster) -> None:
    kv = fault_cluster.kv
    history = History()
    budget = Budget(OPS_MIN)
    nemesis = Nemesis(kv, fault_cluster.meta_proxies)
    workers = [Worker(f"w{k}", kv, "lin/", SEED * 100 + k, history) for k in range(WORKERS)]

    async def faults() -> None:
        try:
            await nemesis.run(list(FAULTS) * FAULT_ROUNDS, FAULT_GAP_S)
        finally:
            budget.faults_done.set()

    async with asyncio.timeout(RUN_DEADLINE_S):
        *_, ctl_ops = await asyncio.gather(faults(), *(w.run(budget) for w in workers),
                                           etcdctl_loop(kv, "lin/", history, budget, SEED))
    pairs = history.pairs()
    statuses = [p.status for p in pairs]
    print(f"R16 seed {SEED}: {len(pairs)} ops ({statuses.count('ok')} ok, {statuses.count('info')} info, "
          f"{statuses.count('fail')} fail; {ctl_ops} by etcdctl), faults {dict(nemesis.done)}, "
          f"leaders {nemesis.leaders}")
    assert len(pairs) >= OPS_MIN
    assert all(nemesis.done[kind] == FAULT_ROUNDS for kind in FAULTS)
    ok_by_f = {f: sum(1 for p in pairs if p.invoke.f == f and p.status == "ok") for f in ("get", "put", "cas")}
    assert min(ok_by_f.values()) >= 200, ok_by_f  # the workload really ran through the faults
    per_key: dict[str, int] = {}
    for p in pairs:
        key = p.invoke.value if p.invoke.f == "get" else p.invoke.value[0]
        per_key[key] = per_key.get(key, 0) + 1
    assert max(per_key.values()) <= 200, max(per_key.values())
    result = check_kv(history)
    assert result.ok, result.explain()


async def test_negative_control_serializable_reads_as_linearizable_are_caught(fault_cluster: FaultCluster) -> None:
    """Right after each acknowledged put on the leader, a serializable get on each follower,
    recorded as a linearizable get: a follower that has not applied the put yet is caught."""
    result = await follower_read_history(fault_cluster.kv, serializable=True)
    assert result.verdict == "illegal", "serializable follower reads passed off as linearizable were not caught"


async def test_the_controls_workload_with_real_linearizable_reads_passes(fault_cluster: FaultCluster) -> None:
    """The negative controls' workload with the store's own linearizable reads on the followers:
    linearizable (so what the controls catch is the stale read, not the workload)."""
    result = await follower_read_history(fault_cluster.kv, serializable=False, writes_max=150)
    assert result.ok, result.explain()
