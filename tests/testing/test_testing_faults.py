"""The Toxiproxy-compatible fault proxy, driven by the unmodified toxiproxy-python client.

Every test runs real TCP: a threaded echo server on 127.0.0.1, the proxy in a
thread (or as a process), and plain sockets with deadlines on every wait.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from scriba.embedded.process import wait_until
from scriba.testing.faults import (
    FaultProxyConfig,
    ToxiproxyProcess,
    ToxiproxyServer,
    is_builtin,
    toxiproxy_client,
    toxiproxy_url,
)

WAIT_S = 5.0


class EchoServer:
    """A threaded TCP echo server; closes its side when the client half-closes."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.conns: list[socket.socket] = []
        self.bytes_in: list[int] = []  # per connection, final once it is in `finished`
        self.finished: set[int] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.conns.append(conn)
                self.bytes_in.append(0)
                index = len(self.conns) - 1
            threading.Thread(target=self._echo, args=(conn, index), daemon=True).start()

    def _echo(self, conn: socket.socket, index: int) -> None:
        try:
            while data := conn.recv(65536):
                with self._lock:
                    self.bytes_in[index] += len(data)
                conn.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self.finished.add(index)
            conn.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone does not
        except OSError:
            pass
        self.sock.close()
        with self._lock:
            for conn in self.conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()
        self._thread.join(WAIT_S)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def proxy_server() -> Iterator[ToxiproxyServer]:
    server = ToxiproxyServer(config=FaultProxyConfig(seed=7))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def tp(proxy_server: ToxiproxyServer) -> Any:
    return toxiproxy_client(proxy_server.url)


def _addr(listen: str) -> tuple[str, int]:
    host, port = listen.rsplit(":", 1)
    return host, int(port)


def _connect(listen: str) -> socket.socket:
    sock = socket.create_connection(_addr(listen), timeout=WAIT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _recv_exactly(sock: socket.socket, n: int, timeout_s: float = WAIT_S) -> bytes:
    deadline = time.monotonic() + timeout_s
    out = b""
    while len(out) < n:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        data = sock.recv(n - len(out))
        if not data:
            raise EOFError(f"EOF after {len(out)} of {n} bytes")
        out += data
    return out


def _recv_until_eof(sock: socket.socket, timeout_s: float = WAIT_S) -> bytes:
    deadline = time.monotonic() + timeout_s
    out = b""
    while True:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        data = sock.recv(65536)
        if not data:
            return out
        out += data


def _round_trip_s(sock: socket.socket, payload: bytes = b"ping") -> float:
    start = time.monotonic()
    sock.sendall(payload)
    assert _recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - start


def _still_open_without_data(sock: socket.socket, wait_s: float) -> bool:
    """True if within ``wait_s`` nothing is readable (no data and no EOF/reset)."""
    readable, _, _ = select.select([sock], [], [], wait_s)
    return not readable


# --- API ---------------------------------------------------------------------------------


def test_faults_api_version_create_listen_port_and_errors(tp: Any, proxy_server: ToxiproxyServer, echo: EchoServer) -> None:
    assert b"version" in tp.version()
    assert is_builtin(proxy_server.url)
    proxy = tp.create(upstream=echo.address, name="echo")
    host, port = _addr(proxy.listen)
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
    with _connect(proxy.listen) as sock:
        assert _round_trip_s(sock) < 1.0
        proxy.add_toxic(type="latency", name="lat", stream="upstream", attributes={"latency": 50})
        assert _round_trip_s(sock) >= 0.050
        # update in place (POST /proxies/p/toxics/t) applies to the live connection
        updated = requests.post(
            f"{proxy_server.url}/proxies/echo/toxics/lat", json={"attributes": {"latency": 250}}, timeout=WAIT_S
        )
        assert updated.status_code == 200 and updated.json()["attributes"]["latency"] == 250
        assert _round_trip_s(sock) >= 0.250


# --- toxics ------------------------------------------------------------------------------


def test_faults_latency_adds_at_least_the_configured_delay(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    with _connect(proxy.listen) as sock:
        baseline = min(_round_trip_s(sock) for _ in range(5))
        proxy.add_toxic(type="latency", attributes={"latency": 150})
        with_latency = [_round_trip_s(sock) for _ in range(3)]
        assert min(with_latency) >= 0.150, with_latency
        assert max(with_latency) < 0.150 + 1.0  # added delay, not a stall
        proxy.add_toxic(type="latency", name="up", stream="upstream", attributes={"latency": 100})
        assert _round_trip_s(sock) >= 0.250
        proxy.destroy_toxic("latency_downstream")
        proxy.destroy_toxic("up")
        assert min(_round_trip_s(sock) for _ in range(3)) < baseline + 0.2


def test_faults_latency_toxicity_zero_never_applies(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="latency", toxicity=0.0, attributes={"latency": 1000})
    with _connect(proxy.listen) as sock:
        assert _round_trip_s(sock) < 0.5


def test_faults_timeout_zero_holds_data_then_delivers_when_removed(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    with _connect(proxy.listen) as sock:
        assert _round_trip_s(sock) < 1.0
        proxy.add_toxic(type="timeout", name="blackhole", attributes={"timeout": 0})
        sock.sendall(b"held-bytes")
        # silent: no data, and no EOF or reset (select would report either as readable)
        assert _still_open_without_data(sock, 0.7)
        proxy.destroy_toxic("blackhole")
        assert _recv_exactly(sock, len(b"held-bytes")) == b"held-bytes"
        assert _round_trip_s(sock) < 1.0


def test_faults_timeout_upstream_blackhole_holds_requests(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="timeout", name="bh", stream="upstream", attributes={"timeout": 0})
    with _connect(proxy.listen) as sock:  # new connections are blackholed too
        sock.sendall(b"x" * 1000)
        assert _still_open_without_data(sock, 0.5)
        proxy.destroy_toxic("bh")
        assert _recv_exactly(sock, 1000) == b"x" * 1000


def test_faults_timeout_positive_closes_after_the_delay(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    with _connect(proxy.listen) as sock:
        start = time.monotonic()
        proxy.add_toxic(type="timeout", attributes={"timeout": 300})
        sock.sendall(b"dropped")
        assert _recv_until_eof(sock) == b""
        elapsed = time.monotonic() - start
        assert 0.25 <= elapsed < 3.0, elapsed


def test_faults_disable_refuses_and_drops_then_enable_restores(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    live = _connect(proxy.listen)
    try:
        assert _round_trip_s(live) < 1.0
        with proxy.down():
            assert tp.proxies()["echo"].enabled is False
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(_addr(proxy.listen), timeout=WAIT_S)
            # the live connection was dropped
            try:
                assert _recv_until_eof(live) == b""
            except ConnectionResetError:
                pass
        assert tp.proxies()["echo"].enabled is True
        with _connect(proxy.listen) as again:  # same port again
            assert _round_trip_s(again) < 1.0
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
        with _connect(proxy.listen) as sock:
            assert _round_trip_s(sock) < 1.0


def test_faults_limit_data_closes_after_n_bytes(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="limit_data", attributes={"bytes": 1000})
    with _connect(proxy.listen) as sock:
        sock.sendall(os.urandom(5000))
        received = _recv_until_eof(sock)
    assert len(received) == 1000


def test_faults_reset_peer_gives_econnreset(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    with _connect(proxy.listen) as sock:
        assert _round_trip_s(sock) < 1.0
        proxy.add_toxic(type="reset_peer", attributes={"timeout": 100})
        start = time.monotonic()
        sock.sendall(b"trigger")
        with pytest.raises(ConnectionResetError) as info:
            _recv_until_eof(sock)
        assert info.value.errno == errno.ECONNRESET
        assert time.monotonic() - start >= 0.09


def test_faults_bandwidth_caps_the_rate(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    payload = os.urandom(100_000)
    with _connect(proxy.listen) as sock:
        start = time.monotonic()
        sock.sendall(payload)
        assert _recv_exactly(sock, len(payload)) == payload
        unlimited_s = time.monotonic() - start
        proxy.add_toxic(type="bandwidth", attributes={"rate": 200})  # 200 KB/s
        start = time.monotonic()
        sock.sendall(payload)
        assert _recv_exactly(sock, len(payload), timeout_s=10) == payload
        limited_s = time.monotonic() - start
    rate_kb_s = len(payload) / 1000 / limited_s
    assert rate_kb_s <= 200 * 1.25, rate_kb_s
    assert rate_kb_s >= 200 * 0.25, rate_kb_s  # roughly the cap, not a stall
    assert limited_s > unlimited_s


def test_faults_slicer_delivers_every_byte_in_order(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="slicer", attributes={"average_size": 64, "size_variation": 32, "delay": 200})
    payload = os.urandom(20_000)
    with _connect(proxy.listen) as sock:
        sock.sendall(payload)
        assert _recv_exactly(sock, len(payload)) == payload


def test_faults_slow_close_delays_eof(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="slow_close", attributes={"delay": 400})
    with _connect(proxy.listen) as sock:
        sock.sendall(b"bye")
        assert _recv_exactly(sock, 3) == b"bye"
        start = time.monotonic()
        sock.shutdown(socket.SHUT_WR)  # echo server closes; the proxy delays passing that on
        assert _recv_until_eof(sock) == b""
        assert time.monotonic() - start >= 0.35


def test_faults_connections_per_proxy_are_bounded(echo: EchoServer) -> None:
    with ToxiproxyServer(config=FaultProxyConfig(connections_per_proxy_max=2)) as server:
        tp = toxiproxy_client(server.url)
        proxy = tp.create(upstream=echo.address, name="echo")
        first, second = _connect(proxy.listen), _connect(proxy.listen)
        try:
            assert _round_trip_s(first) < 1.0 and _round_trip_s(second) < 1.0
            with _connect(proxy.listen) as third:
                try:
                    third.sendall(b"x")
                    assert _recv_until_eof(third) == b""
                except (ConnectionResetError, BrokenPipeError):
                    pass
        finally:
            first.close()
            second.close()


def test_faults_stop_closes_every_socket(echo: EchoServer) -> None:
    server = ToxiproxyServer()
    tp = toxiproxy_client(server.start())
    proxy = tp.create(upstream=echo.address, name="echo")
    with _connect(proxy.listen) as sock:
        assert _round_trip_s(sock) < 1.0
        server.stop()
        try:
            assert _recv_until_eof(sock) == b""
        except ConnectionResetError:
            pass
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(_addr(proxy.listen), timeout=WAIT_S)
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{server.url}/version", timeout=WAIT_S)


def test_faults_proxy_as_a_process(tmp_path: Path, echo: EchoServer) -> None:
    with ToxiproxyProcess(tmp_path / "proxy.log") as proc:
        tp = toxiproxy_client(proc.url)
        proxy = tp.create(upstream=echo.address, name="echo")
        proxy.add_toxic(type="latency", attributes={"latency": 100})
        with _connect(proxy.listen) as sock:
            assert _round_trip_s(sock) >= 0.1
        pid = proc.process.pid
    assert pid is not None and not proc.process.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_faults_toxiproxy_url_falls_back_to_builtin(monkeypatch: pytest.MonkeyPatch, echo: EchoServer) -> None:
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with toxiproxy_url() as url:
        assert is_builtin(url)
        proxy = toxiproxy_client(url).create(upstream=echo.address, name="echo")
        with _connect(proxy.listen) as sock:
            assert _round_trip_s(sock) < 1.0
    monkeypatch.setenv("TOXIPROXY_URL", "http://127.0.0.1:1/")
    with toxiproxy_url() as url:
        assert url == "http://127.0.0.1:1"


# --- a real ZooKeeper session through the proxy -------------------------------------------


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


def test_faults_jitter_keeps_byte_order(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="latency", attributes={"latency": 20, "jitter": 15})
    messages = [f"{i:05d};".encode() for i in range(300)]
    with _connect(proxy.listen) as sock:
        for message in messages:  # many small writes: many chunks with different delays
            sock.sendall(message)
        assert _recv_exactly(sock, sum(map(len, messages)), timeout_s=20) == b"".join(messages)


def test_faults_blackholed_link_buffers_a_bounded_amount(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="timeout", name="bh", stream="upstream", attributes={"timeout": 0})
    with _connect(proxy.listen) as sock:
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
        assert _still_open_without_data(sock, 0.2)


def test_faults_process_stops_gracefully_on_sigterm(tmp_path: Path, echo: EchoServer) -> None:
    proc = ToxiproxyProcess(tmp_path / "proxy.log")
    proc.start()
    tp = toxiproxy_client(proc.url)
    proxy = tp.create(upstream=echo.address, name="echo")
    live = _connect(proxy.listen)
    try:
        assert _round_trip_s(live) < 1.0
        proc.stop()  # SIGTERM; SIGKILL only after a timeout
        assert proc.process.returncode == 0, proc.process.log_tail()
        try:
            assert _recv_until_eof(live) == b""
        except ConnectionResetError:
            pass
    finally:
        live.close()


def test_faults_throughput_without_toxics(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    payload = os.urandom(1024 * 1024)
    total = 16 * len(payload)
    with _connect(proxy.listen) as sock:
        start = time.monotonic()
        received = 0
        sender = threading.Thread(target=lambda: [sock.sendall(payload) for _ in range(16)], daemon=True)
        sender.start()
        while received < total:
            sock.settimeout(WAIT_S)
            chunk = sock.recv(1024 * 1024)
            assert chunk, "EOF before all bytes came back"
            received += len(chunk)
        elapsed = time.monotonic() - start
        sender.join(WAIT_S)
    mb_s = total / elapsed / 1e6
    print(f"proxy echo throughput: {mb_s:.0f} MB/s each way")
    assert mb_s > 5, mb_s


def test_faults_cli_registers_faults_proxy() -> None:
    from scriba.cli import build_parser
    from scriba.testing import faults_cli

    args = build_parser().parse_args(["faults-proxy", "--listen", "127.0.0.1:0", "--seed", "3"])
    assert args.func is faults_cli.run
    assert args.listen == "127.0.0.1:0" and args.seed == 3


def test_faults_toxicity_is_rolled_per_connection(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="latency", toxicity=0.5, attributes={"latency": 80})
    delayed = 0
    for _ in range(20):
        with _connect(proxy.listen) as sock:
            first = _round_trip_s(sock)
            second = _round_trip_s(sock)
            assert (first >= 0.08) == (second >= 0.08)  # decided once for the whole connection
            delayed += first >= 0.08
    assert 3 <= delayed <= 17, delayed


def test_faults_limit_data_upstream_cuts_what_the_server_gets(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="limit_data", stream="upstream", attributes={"bytes": 1500})
    with _connect(proxy.listen) as sock:
        payload = os.urandom(6000)
        try:
            sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            received = _recv_until_eof(sock)
        except ConnectionResetError:
            received = b""
    assert len(received) <= 1500
    assert received == payload[: len(received)]
    wait_until(lambda: 0 in echo.finished, WAIT_S, what="the server saw the connection end")
    assert echo.bytes_in[0] == 1500


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


def test_faults_cli_foreground_prints_url_and_stops_on_sigint(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "scriba.cli", "faults-proxy", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
    )
    try:
        url = ""
        deadline = time.monotonic() + 20
        while not url and time.monotonic() < deadline:
            readable, _, _ = select.select([proc.stdout], [], [], 0.5)
            line = proc.stdout.readline() if readable and proc.stdout else ""
            if line.startswith("listening on "):
                url = line.split()[-1]
            assert proc.poll() is None, "faults-proxy exited early"
        assert url.startswith("http://127.0.0.1:")
        assert is_builtin(url)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
