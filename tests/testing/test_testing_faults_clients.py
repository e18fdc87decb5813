"""Real clients through the fault proxy: a ZooKeeper session that survives latency and a
blackhole shorter than its timeout, and a gRPC channel whose deadlines hold and which
recovers after a blackhole and a proxy down (``fault_proxy_site.py``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from fault_proxy_site import WAIT_S

from scriba.embedded.process import wait_until


def test_faults_zookeeper_session_survives_latency_and_blackhole(tmp_path: Path, tp: Any) -> None:
    zookeeper = pytest.importorskip("scriba.embedded.zookeeper", reason="ZooKeeperEnsemble not built yet")
    kazoo_client = pytest.importorskip("kazoo.client")
    from kazoo.protocol.states import KazooState

    with zookeeper.ZooKeeperEnsemble(tmp_path / "zk", members=1) as ensemble:
        host, port = ensemble.endpoints[0]
        proxy = tp.create(upstream=f"{host}:{port}", name="zk")
        client = kazoo_client.KazooClient(hosts=proxy.listen, timeout=10.0)
        states: list[str] = []
        client.add_listener(lambda state: states.append(state))
        client.start(timeout=WAIT_S * 2)
        try:
            session_id = client.client_id[0]
            client.create("/faults-probe", b"v1")
            proxy.add_toxic(type="latency", attributes={"latency": 200})
            start = time.monotonic()
            assert client.get("/faults-probe")[0] == b"v1"
            assert time.monotonic() - start >= 0.2
            proxy.destroy_toxic("latency_downstream")
            # blackhole both ways for less than the session timeout: the client notices
            # (SUSPENDED) but the session survives the heal.
            proxy.add_toxic(type="timeout", name="bh-down", attributes={"timeout": 0})
            proxy.add_toxic(type="timeout", name="bh-up", stream="upstream", attributes={"timeout": 0})
            wait_until(lambda: KazooState.SUSPENDED in states, 15.0, what="kazoo saw the connection stall")
            proxy.destroy_toxic("bh-down")
            proxy.destroy_toxic("bh-up")
            wait_until(lambda: client.state == KazooState.CONNECTED, 15.0, what="kazoo reconnected")
            assert client.client_id[0] == session_id
            assert KazooState.LOST not in states
            client.set("/faults-probe", b"v2")
            assert client.get("/faults-probe")[0] == b"v2"
        finally:
            client.stop()
            client.close()


def test_faults_grpc_through_the_proxy(tp: Any) -> None:
    grpc = pytest.importorskip("grpc")
    from concurrent import futures

    handler = grpc.method_handlers_generic_handler(
        "scriba.test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        proxy = tp.create(upstream=f"127.0.0.1:{port}", name="grpc")
        with grpc.insecure_channel(proxy.listen) as channel:
            echo = channel.unary_unary("/scriba.test.Echo/Echo")
            assert echo(b"hello", timeout=WAIT_S) == b"hello"
            proxy.add_toxic(type="latency", attributes={"latency": 100})
            start = time.monotonic()
            assert echo(b"slow", timeout=WAIT_S) == b"slow"
            assert time.monotonic() - start >= 0.1
            proxy.destroy_toxic("latency_downstream")
            proxy.add_toxic(type="timeout", name="bh", stream="upstream", attributes={"timeout": 0})
            start = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                echo(b"lost", timeout=0.5)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert time.monotonic() - start < 2.0  # the deadline held: no hang past it
            proxy.destroy_toxic("bh")
            assert echo(b"again", timeout=WAIT_S) == b"again"  # the same channel recovers
            with proxy.down():
                with pytest.raises(grpc.RpcError) as info:
                    echo(b"down", timeout=2.0)
                assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            assert echo(b"back", timeout=WAIT_S, wait_for_ready=True) == b"back"
    finally:
        server.stop(grace=None).wait(WAIT_S)
