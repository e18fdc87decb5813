"""The KV example over mutual TLS end to end: TLS bookies, two replicas whose RSM peer
service, bookie client and etcd API all use TLS, and etcd-API clients with certificates.

A write sent to either replica (one forwards to the leader over the TLS peer service)
lands and is read back from the other (the positive control); a client whose
certificate is on no allow-list, and a plaintext client, are refused within their
deadline and write nothing.
"""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import grpc.aio
import pytest
from aetcd.rpc import rpc_pb2 as pb
from aetcd.rpc import rpc_pb2_grpc as stubs
from conftest import RSM_CONFIG

from scriba.embedded.bookie import tls_argv
from scriba.embedded.kvstore import KvCluster
from scriba.testing.cluster import BookieCluster
from scriba.testing.pki import TestPki
from scriba.tls import TlsConfig

pytestmark = [pytest.mark.timeout(300)]
DEADLINE_S = 20.0


@pytest.fixture(autouse=True)
async def collect_on_the_loop() -> AsyncIterator[None]:
    yield
    gc.collect()
    await asyncio.sleep(0)


@pytest.fixture(scope="module")
def kv_tls(etcd_cluster: Any, pki: TestPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KvCluster]:
    uri = str(etcd_cluster.uri(f"kvtls{uuid.uuid4().hex[:8]}"))
    base = tmp_path_factory.mktemp("kv-tls")
    bookies = BookieCluster(base / "bookies", uri, tls=pki.server_tls())
    # the replicas present the bookie identity (on the bookies' and their own allow-lists)
    kv = KvCluster(uri, base / "replicas", replicas=2, zones=["z1", "z2"], rsm_config=RSM_CONFIG,
                   extra_args=tls_argv(pki.server_tls()))
    try:
        bookies.start_bookies(3, zones=["z1", "z2", "z3"])
        yield kv.start_all()
    finally:
        kv.stop_all()
        bookies.stop_all()


def channel(endpoint: str, tls: TlsConfig | None) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(endpoint)
    return grpc.aio.secure_channel(endpoint, tls.load().grpc_channel_credentials())


async def put_get(endpoint: str, other: str, tls: TlsConfig, key: bytes) -> bytes:
    async with channel(endpoint, tls) as ch, channel(other, tls) as ch2:
        await stubs.KVStub(ch).Put(pb.PutRequest(key=key, value=b"v-" + key), timeout=DEADLINE_S)
        got = await stubs.KVStub(ch2).Range(pb.RangeRequest(key=key), timeout=DEADLINE_S)
        return bytes(got.kvs[0].value) if got.kvs else b""


async def test_kv_over_mutual_tls(kv_tls: KvCluster, pki: TestPki) -> None:
    a, b = (r.endpoint for r in kv_tls.replicas)
    good = pki.client_tls(pki.client)
    assert await put_get(a, b, good, b"tls-a") == b"v-tls-a"
    assert await put_get(b, a, good, b"tls-b") == b"v-tls-b"  # one of the two is a follower: forwarded
    async with channel(a, pki.client_tls(pki.intruder)) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stubs.KVStub(ch).Put(pb.PutRequest(key=b"intruder", value=b"x"), timeout=DEADLINE_S)
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED and "intruder" in str(refused.value.details())
    async with channel(a, None) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as plain:
            await stubs.KVStub(ch).Put(pb.PutRequest(key=b"plain", value=b"x"), timeout=5)
    assert plain.value.code() is grpc.StatusCode.UNAVAILABLE
    async with channel(b, good) as ch:
        for key in (b"intruder", b"plain"):
            assert not (await stubs.KVStub(ch).Range(pb.RangeRequest(key=key), timeout=DEADLINE_S)).kvs
