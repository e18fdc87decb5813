"""Faults for the store's process tests: the leader found through etcd's own Status call,
then SIGKILLed and restarted, paused past its metadata session, or cut off from the
metadata store through its fault proxy (a Toxiproxy ``timeout`` toxic both ways).

    nemesis = Nemesis(kv, meta_proxies)
    await nemesis.run(["kill", "pause", "partition"], gap_s=3.0)
    nemesis.done  # {"kill": 1, "pause": 1, "partition": 1}

Replicas are signalled by PID (``KvCluster``); a replica that stopped itself (it lost
its metadata session for good) is started again after each fault.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aetcd
import grpc
from aetcd.rpc import rpc_pb2 as pb
from aetcd.rpc import rpc_pb2_grpc as stubs

from scriba.embedded.kvstore import KvCluster
from scriba.testing.checkers import check_kv
from scriba.testing.history import History
from scriba.testing.waiting import eventually

LEADER_DEADLINE_S = 60.0
STATUS_TIMEOUT_S = 2.0
KILLED_DOWN_S = 1.0
PAUSE_S = 3.5  # past the metadata session (2 s) and its grace: another replica takes over
PARTITION_S = 4.0
RESTART_DEADLINE_S = 60.0
CLIENT_ERRORS = (aetcd.ClientError, grpc.aio.AioRpcError, TimeoutError, OSError)  # a failed client call
FAULTS = ("kill", "pause", "partition")


@dataclass
class FaultCluster:
    kv: KvCluster
    meta_proxies: list[Any]  # toxiproxy-python proxies: replica i -> the metadata store


async def status(endpoint: str) -> Any:
    async with grpc.aio.insecure_channel(endpoint) as channel:
        return await stubs.MaintenanceStub(channel).Status(pb.StatusRequest(), timeout=STATUS_TIMEOUT_S)


async def leader_index(kv: KvCluster, skip: frozenset[int] = frozenset()) -> int:
    """The replica that reports itself leader (etcd's Status: ``leader == header.member_id``)."""
    found: list[int] = []

    async def one_leads() -> bool:
        for i, r in enumerate(kv.replicas):
            if i in skip or not r.running:
                continue
            try:
                st = await status(r.endpoint)
            except grpc.aio.AioRpcError:
                continue
            if st.leader and st.leader == st.header.member_id:
                found.append(i)
                return True
        return False

    await eventually(one_leads, LEADER_DEADLINE_S, what="a leader among the running replicas", interval_s=0.2)
    return found[0]


class Nemesis:
    """One fault at a time on the current leader; counts what it did and the terms it saw."""

    def __init__(self, kv: KvCluster, meta_proxies: list[Any]) -> None:
        self.kv = kv
        self.meta_proxies = meta_proxies
        self.done: Counter[str] = Counter()
        self.leaders: list[int] = []

    async def run(self, plan: list[str], gap_s: float) -> None:
        for kind in plan:
            await asyncio.sleep(gap_s)  # load runs undisturbed for a while
            await self.fault(kind)

    async def fault(self, kind: str) -> int:
        leader = await leader_index(self.kv)
        self.leaders.append(leader)
        if kind == "kill":
            await asyncio.to_thread(self.kv.kill, leader)
            await asyncio.sleep(KILLED_DOWN_S)
        elif kind == "pause":
            self.kv.signal(leader, signal.SIGSTOP)
            try:
                await asyncio.sleep(PAUSE_S)
            finally:
                self.kv.signal(leader, signal.SIGCONT)
        elif kind == "partition":
            proxy = self.meta_proxies[leader]
            for stream in ("upstream", "downstream"):
                proxy.add_toxic(type="timeout", stream=stream, name=f"cut-{stream}", attributes={"timeout": 0})
            try:
                await asyncio.sleep(PARTITION_S)
            finally:
                for stream in ("upstream", "downstream"):
                    proxy.destroy_toxic(f"cut-{stream}")
        else:
            raise ValueError(f"unknown fault {kind!r}")
        await self.restart_stopped()
        self.done[kind] += 1
        return leader

    async def restart_stopped(self) -> None:
        """Start every stopped replica again; a start refused while the dead incarnation's
        registration (an ephemeral record) has not expired yet is retried."""
        for i, r in enumerate(self.kv.replicas):
            deadline = time.monotonic() + RESTART_DEADLINE_S
            while not r.running:
                await asyncio.to_thread(self.kv.kill, i)  # closes the dead incarnation's pipe
                try:
                    await asyncio.to_thread(self.kv.start, i)
                except RuntimeError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)  # retry pacing, not synchronisation


async def follower_read_history(kv: KvCluster, *, serializable: bool, writes_max: int = 600) -> Any:
    """Puts on the leader, each followed at once by a get on each follower recorded as a
    linearizable read (``serializable``: etcd's local read; else the store's default);
    checked every 100 puts, stopping at the first violation: the checker's result."""
    leader = await leader_index(kv)
    followers = [i for i in range(len(kv.replicas)) if i != leader]
    history = History()

    def client(i: int) -> aetcd.Client:
        host, port = kv.replicas[i].endpoint.rsplit(":", 1)
        return aetcd.Client(host, int(port), timeout=20)

    async with client(leader) as w, client(followers[0]) as f0, client(followers[1]) as f1:
        for i in range(writes_max):
            key = f"neg/{i % 4}"
            op_id = history.invoke(f"writer.{i}", "put", [key, f"v{i}"])
            try:
                await w.put(key.encode(), f"v{i}".encode())
                history.ok(op_id)
            except CLIENT_ERRORS as exc:  # a slow moment on a loaded machine: indeterminate
                history.info(op_id, exc)
            for name, reader in (("f0", f0), ("f1", f1)):
                op_id = history.invoke(name, "get", key)
                try:
                    got = await reader.get(key.encode(), serializable=serializable)
                    history.ok(op_id, None if got is None else got.value.decode())
                except CLIENT_ERRORS as exc:
                    history.fail(op_id, exc)  # a failed read constrains nothing
            if i % 100 == 99 and not check_kv(history).ok:
                break
    return check_kv(history)
