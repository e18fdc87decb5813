"""Backends for the metadata contract suite: memory, etcd x1, etcd x3, ZooKeeper x1, ZooKeeper x3.

Servers are session-scoped (started the first time a test needs them, stopped at
the end of the run); every test gets a fresh key prefix / chroot, so tests never
see each other's records. ``make_store()`` opens another client (its own session)
on the same prefix; every store a test opens is closed at its end.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

from scriba.meta import connect
from scriba.meta.store import MetadataStore
from scriba.testing import waiting

SESSION_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 5.0

ZK_MODULES = ("scriba.meta.zookeeper", "scriba.embedded.zookeeper")


def _zk_built() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ZK_MODULES)


class Cluster(Protocol):
    members: list[Any]

    def uri(self, prefix: str = "scriba") -> str: ...

    def kill_member(self, index: int) -> None: ...

    def start_member(self, index: int, timeout_s: float = 30.0) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    uri: str
    cluster: Cluster | None
    exact_watch: bool  # every change delivered (memory, etcd); ZooKeeper: per-key order + last value

    @property
    def fresh_reads(self) -> bool:
        """A read by any client sees every write completed before it (memory, etcd). ZooKeeper is
        sequentially consistent: another client's server may lag behind a write for a moment."""
        return not self.name.startswith("zk")

    @property
    def members(self) -> int:
        return len(self.cluster.members) if self.cluster is not None else 0


def _start(kind: str, members: int, base: Path) -> Cluster:
    if kind == "etcd":
        from scriba.embedded.etcd import EtcdCluster

        cluster: Cluster = EtcdCluster(base, members)
    else:
        from scriba.embedded.zookeeper import ZooKeeperEnsemble

        cluster = ZooKeeperEnsemble(base, members)
    cluster.start(timeout_s=60.0)  # type: ignore[attr-defined]
    return cluster


def _server(kind: str, members: int) -> Callable[..., Iterator[Cluster]]:
    @pytest.fixture(scope="session", name=f"{kind}{members}_server")
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
        cluster = _start(kind, members, tmp_path_factory.mktemp(f"{kind}{members}"))
        try:
            yield cluster
        finally:
            cluster.stop()

    return fixture


etcd1_server = _server("etcd", 1)
etcd3_server = _server("etcd", 3)
zk1_server = _server("zk", 1)
zk3_server = _server("zk", 3)

BACKENDS = ["memory", "etcd1", "etcd3", "zk1", "zk3"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    name: str = request.param
    prefix = f"t{uuid.uuid4().hex[:12]}"
    if name == "memory":
        return Backend(name, f"memory://{prefix}", None, exact_watch=True)
    if name.startswith("zk") and not _zk_built():
        pytest.skip("zk driver not built yet")
    cluster: Cluster = request.getfixturevalue(f"{name}_server")
    return Backend(name, cluster.uri(prefix), cluster, exact_watch=name.startswith("etcd"))


StoreFactory = Callable[..., Awaitable[MetadataStore]]


@pytest.fixture
async def make_store(backend: Backend) -> AsyncIterator[StoreFactory]:
    opened: list[MetadataStore] = []

    async def make(*, session_timeout_s: float = SESSION_TIMEOUT_S) -> MetadataStore:
        store = await connect(backend.uri, connect_timeout_s=CONNECT_TIMEOUT_S, session_timeout_s=session_timeout_s)
        opened.append(store)
        return store

    yield make
    for store in reversed(opened):
        await asyncio.wait_for(store.close(), 10.0)


@pytest.fixture
async def store(make_store: StoreFactory) -> MetadataStore:
    return await make_store()


Eventually = Callable[..., Awaitable[float]]


async def _eventually(
    condition: Callable[[], Awaitable[bool]], timeout_s: float, *, what: str, interval_s: float = 0.05
) -> float:
    """Poll an async condition until it holds; fail after ``timeout_s``. Returns the seconds waited."""
    start = time.monotonic()
    await waiting.eventually(condition, timeout_s, what=what, interval_s=interval_s)
    return time.monotonic() - start


@pytest.fixture
def eventually() -> Eventually:
    """``await eventually(async_condition, timeout_s, what=...)``: poll with a deadline."""
    return _eventually
