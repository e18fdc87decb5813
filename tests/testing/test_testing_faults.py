"""The Toxiproxy-compatible fault proxy, driven by the unmodified toxiproxy-python client:
its HTTP API, proxies disabled, enabled and reset, bounded connections and buffers, stop.

Every test runs real TCP: a threaded echo server on 127.0.0.1, the proxy in a
thread (or as a process), and plain sockets with deadlines on every wait (the echo
server and socket helpers: ``fault_proxy_site.py``; fixtures: ``conftest.py``). Each toxic:
``test_testing_faults_toxics.py``; the proxy as a process and its CLI:
``test_testing_faults_process.py``; ZooKeeper and gRPC clients through it:
``test_testing_faults_clients.py``.
"""

from __future__ import annotations

import hashlib
import os
import select
import socket
import threading
import time
from typing import Any

import pytest
import requests
from fault_proxy_site import (
    WAIT_S,
    EchoServer,
    addr,
    connect,
    recv_until_eof,
    round_trip_s,
    still_open_without_data,
)
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from scriba.testing.faults import FaultProxyConfig, ToxiproxyServer, is_builtin, toxiproxy_client


def test_faults_api_version_create_listen_port_and_errors(tp: Any, proxy_server: ToxiproxyServer, echo: EchoServer) -> None:
    assert b"version" in tp.version()
    assert is_builtin(proxy_server.url)
    proxy = tp.create(upstream=echo.address, name="echo")
    host, port = addr(proxy.listen)
    assert host == "127.0.0.1" and port != 0  # "127.0.0.1:0" picked a real port
    assert proxy.enabled is True
    assert set(tp.proxies()) == {"echo"}
    with pytest.raises(ProxyExists):
        tp.create(upstream=echo.address, name="echo")
    # the raw API: 409 with {"error", "status"}, 404, 400
    raw = requests.post(f"{proxy_server.url}/proxies", json={"name": "echo", "upstream": echo.address}, timeout=WAIT_S)
    assert raw.status_code == 409 and raw.json()["status"] == 409 and "exists" in raw.json()["error"]
    missing = requests.get(f"{proxy_server.url}/proxies/nope", timeout=WAIT_S)
    assert missing.status_code == 404 and missing.json()["status"] == 404
    with pytest.raises(NotFound):
        tp.get_proxy("echo").destroy_toxic("nope")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="no_such_toxic")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="latency", attributes={"latncy": 5})
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="latency", toxicity=1.5)
    bad = requests.post(f"{proxy_server.url}/proxies", json={"name": "x", "upstream": echo.address, "listen": "8.8.8.8:0"}, timeout=WAIT_S)
    assert bad.status_code == 400
    proxy.add_toxic(type="latency", name="lat", attributes={"latency": 1})
    with pytest.raises(ProxyExists):
        proxy.add_toxic(type="latency", name="lat", attributes={"latency": 1})
    toxics = proxy.toxics()
    assert set(toxics) == {"lat"}
    assert toxics["lat"].attributes == {"latency": 1, "jitter": 0}
    assert toxics["lat"].stream == "downstream" and toxics["lat"].toxicity == 1.0
    got = requests.get(f"{proxy_server.url}/proxies/echo", timeout=WAIT_S).json()
    assert got["name"] == "echo" and got["upstream"] == echo.address and got["toxics"][0]["name"] == "lat"
    assert proxy.destroy() is True
    assert tp.proxies() == {}


def test_faults_echo_through_proxy_and_update_toxic(tp: Any, proxy_server: ToxiproxyServer, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    with connect(proxy.listen) as sock:
        assert round_trip_s(sock) < 1.0
        proxy.add_toxic(type="latency", name="lat", stream="upstream", attributes={"latency": 50})
        assert round_trip_s(sock) >= 0.050
        # update in place (POST /proxies/p/toxics/t) applies to the live connection
        updated = requests.post(
            f"{proxy_server.url}/proxies/echo/toxics/lat", json={"attributes": {"latency": 250}}, timeout=WAIT_S
        )
        assert updated.status_code == 200 and updated.json()["attributes"]["latency"] == 250
        assert round_trip_s(sock) >= 0.250


def test_faults_disable_refuses_and_drops_then_enable_restores(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    live = connect(proxy.listen)
    try:
        assert round_trip_s(live) < 1.0
        with proxy.down():
            assert tp.proxies()["echo"].enabled is False
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(addr(proxy.listen), timeout=WAIT_S)
            # the live connection was dropped
            try:
                assert recv_until_eof(live) == b""
            except ConnectionResetError:
                pass
        assert tp.proxies()["echo"].enabled is True
        with connect(proxy.listen) as again:  # same port again
            assert round_trip_s(again) < 1.0
    finally:
        live.close()


def test_faults_reset_reenables_and_drops_every_toxic(tp: Any, proxy_server: ToxiproxyServer, echo: EchoServer) -> None:
    a = tp.create(upstream=echo.address, name="a")
    b = tp.create(upstream=echo.address, name="b")
    a.add_toxic(type="timeout", attributes={"timeout": 0})
    b.add_toxic(type="latency", attributes={"latency": 2000})
    b.disable()
    assert tp.reset() is True
    proxies = tp.proxies()
    assert proxies["a"].enabled and proxies["b"].enabled
    assert a.toxics() == {} and b.toxics() == {}
    for proxy in (a, b):
        with connect(proxy.listen) as sock:
            assert round_trip_s(sock) < 1.0


def test_faults_connections_per_proxy_are_bounded(echo: EchoServer) -> None:
    with ToxiproxyServer(config=FaultProxyConfig(connections_per_proxy_max=2)) as server:
        tp = toxiproxy_client(server.url)
        proxy = tp.create(upstream=echo.address, name="echo")
        first, second = connect(proxy.listen), connect(proxy.listen)
        try:
            assert round_trip_s(first) < 1.0 and round_trip_s(second) < 1.0
            with connect(proxy.listen) as third:
                try:
                    third.sendall(b"x")
                    assert recv_until_eof(third) == b""
                except (ConnectionResetError, BrokenPipeError):
                    pass
        finally:
            first.close()
            second.close()


def test_faults_stop_closes_every_socket(echo: EchoServer) -> None:
    server = ToxiproxyServer()
    tp = toxiproxy_client(server.start())
    proxy = tp.create(upstream=echo.address, name="echo")
    with connect(proxy.listen) as sock:
        assert round_trip_s(sock) < 1.0
        server.stop()
        try:
            assert recv_until_eof(sock) == b""
        except ConnectionResetError:
            pass
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(addr(proxy.listen), timeout=WAIT_S)
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{server.url}/version", timeout=WAIT_S)


def test_faults_blackholed_link_buffers_a_bounded_amount(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="timeout", name="bh", stream="upstream", attributes={"timeout": 0})
    with connect(proxy.listen) as sock:
        sock.setblocking(False)
        sent, block = 0, os.urandom(64 * 1024)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sent < 256 * 1024 * 1024:
            try:
                sent += sock.send(block)
            except BlockingIOError:
                _, writable, _ = select.select([], [sock], [], 0.5)
                if not writable:
                    break  # the proxy stopped reading: TCP pushes back on the sender
        assert sent < 64 * 1024 * 1024, f"the proxy kept accepting data: {sent} bytes"
        assert still_open_without_data(sock, 0.2)


def test_faults_bulk_data_comes_back_intact_without_toxics(tp: Any, echo: EchoServer) -> None:
    """16 MiB through a proxy without toxics, echoed: every byte back, in order (the
    data path's speed is a benchmark's business, not a test's)."""
    proxy = tp.create(upstream=echo.address, name="echo")
    payload = os.urandom(1024 * 1024)
    total = 16 * len(payload)
    back = hashlib.sha256()
    with connect(proxy.listen) as sock:
        received = 0
        sender = threading.Thread(target=lambda: [sock.sendall(payload) for _ in range(16)], daemon=True)
        sender.start()
        while received < total:
            sock.settimeout(WAIT_S)
            chunk = sock.recv(1024 * 1024)
            assert chunk, "EOF before all bytes came back"
            received += len(chunk)
            back.update(chunk)
        sender.join(WAIT_S)
    assert received == total
    assert back.digest() == hashlib.sha256(payload * 16).digest()
