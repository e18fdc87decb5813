"""RSM tests: the state machines and the simulation scenario live beside the tests; the
simulation kit and the in-process bookies come from ``scriba.testing.sim``."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from scriba.testing.cluster import BookieCluster

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.append(_HERE)

from rsm_group import REPLICA_CONFIG, Group  # noqa: E402 - after the path is set


@pytest.fixture
async def env() -> AsyncIterator[Any]:
    """In-process replicas on ``memory://`` (``test_rsm_inprocess.Env``), stopped at the end
    (``test_rsm_inprocess`` has its own, which also spares replicas it crashed)."""
    from test_rsm_inprocess import Env

    e = Env(f"memory://rsm-{uuid.uuid4().hex[:10]}")
    await e.start()
    try:
        yield e
    finally:
        for r in e.replicas:
            if r._stopped is None:
                await asyncio.wait_for(r.stop(), 10)
        await e.close()


@pytest.fixture(scope="module")
def backend(etcd_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    uri = str(etcd_cluster.uri(f"r{uuid.uuid4().hex[:8]}"))
    bookies = BookieCluster(tmp_path_factory.mktemp("rsm-bookies"), uri)
    bookies.start_bookies(3, zones=["z1", "z2", "z3"])
    try:
        yield uri
    finally:
        bookies.stop_all()


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
