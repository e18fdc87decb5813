"""Three store replicas as real processes on real bookies and a real etcd (module scope)."""

from __future__ import annotations

import asyncio
import gc
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from scriba.embedded.kvstore import KvCluster
from scriba.testing.cluster import BookieCluster
from scriba.testing.faults import FaultProxyConfig, ToxiproxyServer, toxiproxy_client

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.append(_HERE)

from kv_faults import FaultCluster  # noqa: E402
from kv_harness import Ctl  # noqa: E402

RSM_CONFIG = {"campaign_backoff_s": 0.1, "suspended_grace_s": 0.5, "propose_timeout_s": 20.0,
              "writer_lock_timeout_s": 60.0, "snapshot_every_commands": 500}


@pytest.fixture(scope="module")
def kv_cluster(etcd_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KvCluster]:
    uri = str(etcd_cluster.uri(f"kv{uuid.uuid4().hex[:8]}"))
    base = tmp_path_factory.mktemp("kv")
    bookies = BookieCluster(base / "bookies", uri)
    bookies.start_bookies(3, zones=["z1", "z2", "z3"])
    kv = KvCluster(uri, base / "replicas", replicas=3, zones=["z1", "z2", "z3"], rsm_config=RSM_CONFIG)
    try:
        yield kv.start_all(attempts=3)
    finally:
        kv.stop_all()
        bookies.stop_all()


@pytest.fixture
def ctl(kv_cluster: KvCluster) -> Ctl:
    return Ctl(kv_cluster.endpoints)


@pytest.fixture(scope="module")
def fault_cluster(etcd_cluster: Any, tmp_path_factory: pytest.TempPathFactory,
                  request: pytest.FixtureRequest) -> Iterator[FaultCluster]:
    """Three replicas, each reaching the metadata store through its own fault proxy (the test
    module's ``RSM_CONFIG_EXTRA`` added to their RSM config)."""
    prefix = f"kvf{uuid.uuid4().hex[:8]}"
    base = tmp_path_factory.mktemp("kvf")
    host, port = etcd_cluster.endpoints[0]
    with ToxiproxyServer(config=FaultProxyConfig(seed=16)) as server:
        toxiproxy = toxiproxy_client(server.url)
        proxies = [toxiproxy.create(upstream=f"{host}:{port}", name=f"{prefix}-r{i + 1}") for i in range(3)]
        bookies = BookieCluster(base / "bookies", str(etcd_cluster.uri(prefix)))
        bookies.start_bookies(3, zones=["z1", "z2", "z3"])
        kv = KvCluster(str(etcd_cluster.uri(prefix)), base / "replicas", replicas=3, zones=["z1", "z2", "z3"],
                       rsm_config={**RSM_CONFIG, **getattr(request.module, "RSM_CONFIG_EXTRA", {})},
                       metadata_uris=[f"etcd://{p.listen}/{prefix}" for p in proxies])
        try:
            yield FaultCluster(kv.start_all(attempts=3), proxies)
        finally:
            kv.stop_all()
            bookies.stop_all()


@pytest.fixture
async def collect_on_the_loop() -> AsyncIterator[None]:
    """Finalise the clients' gRPC objects while their event loop still runs (else they are
    reported as unraisable exceptions during a later test). Async tests use it by mark."""
    yield
    gc.collect()
    await asyncio.sleep(0)
