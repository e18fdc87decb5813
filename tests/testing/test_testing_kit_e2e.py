"""The kit end to end: clients -> fault proxy -> a small KV server, recorded into a History,
checked for linearizability. A correct server passes under latency, jitter and a blackhole
(timed-out ops are indeterminate); a server that reads from a lagging copy is caught."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from scriba.testing.checkers import check_kv
from scriba.testing.faults import FaultProxyConfig, ToxiproxyServer, toxiproxy_client
from scriba.testing.history import History

OP_TIMEOUT_S = 0.4


class KVServer:
    """Line protocol: GET k | PUT k v | CAS k old new. ``stale_every`` > 0 serves reads from a
    copy refreshed only every that many writes (the broken mode)."""

    def __init__(self, stale_every: int = 0) -> None:
        self.data: dict[str, str] = {}
        self.copy: dict[str, str] = {}
        self.writes = 0
        self.stale_every = stale_every
        self.lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn, conn.makefile("rwb") as stream:
                for line in stream:
                    stream.write(self._apply(line.decode().split()).encode() + b"\n")
                    stream.flush()
        except OSError:
            pass

    def _apply(self, words: list[str]) -> str:
        with self.lock:
            if words[0] == "GET":
                source = self.copy if self.stale_every else self.data
                return f"VAL {source.get(words[1], '-')}"
            if words[0] == "PUT":
                self.data[words[1]] = words[2]
            elif self.data.get(words[1], "-") != words[2]:  # CAS
                return "FAIL"
            else:
                self.data[words[1]] = words[3]
            self.writes += 1
            if self.stale_every and self.writes % self.stale_every == 0:
                self.copy = dict(self.data)
            return "OK"

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        for conn in self.conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.thread.join(5)


class Client:
    def __init__(self, listen: str) -> None:
        self.listen = listen
        self.conn: socket.socket | None = None

    def call(self, line: str) -> str:
        if self.conn is None:
            host, port = self.listen.rsplit(":", 1)
            self.conn = socket.create_connection((host, int(port)), timeout=OP_TIMEOUT_S)
        self.conn.settimeout(OP_TIMEOUT_S)
        try:
            self.conn.sendall(line.encode() + b"\n")
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = self.conn.recv(4096)
                if not chunk:
                    raise ConnectionResetError("server closed")
                reply += chunk
            return reply.decode().strip()
        except OSError:
            self.close()  # a late reply must not be read as the next op's answer
            raise

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _workload(history: History, listen: str, process: str, seed: int, ops: int) -> None:
    rng = random.Random(seed)
    client = Client(listen)
    try:
        for i in range(ops):
            key = rng.choice("ab")
            kind = rng.random()
            if kind < 0.45:
                op_id = history.invoke(process, "get", key)
                line = f"GET {key}"
            elif kind < 0.85:
                value = f"{process}.{i}"
                op_id = history.invoke(process, "put", [key, value])
                line = f"PUT {key} {value}"
            else:
                old, new = rng.choice(["-", f"{process}.{i - 1}"]), f"{process}.{i}"
                op_id = history.invoke(process, "cas", [key, None if old == "-" else old, new])
                line = f"CAS {key} {old} {new}"
            try:
                reply = client.call(line)
            except OSError as exc:  # timeouts and drops: indeterminate
                history.error(op_id, exc)
                continue
            if reply.startswith("VAL"):
                value = reply.split()[1]
                history.ok(op_id, None if value == "-" else value)
            elif reply == "OK":
                history.ok(op_id, True if line.startswith("CAS") else None)
            else:
                history.ok(op_id, False)
    finally:
        client.close()


def _faults(proxy: Any, stop: threading.Event) -> None:
    """Latency with jitter, then a blackhole long enough for timeouts, then healthy."""
    proxy.add_toxic(type="latency", name="lat", attributes={"latency": 30, "jitter": 25})
    stop.wait(0.5)
    proxy.add_toxic(type="timeout", name="bh", attributes={"timeout": 0})
    stop.wait(0.6)
    proxy.destroy_toxic("bh")
    stop.wait(0.5)
    proxy.destroy_toxic("lat")


@pytest.fixture
def proxy_url() -> Iterator[str]:
    with ToxiproxyServer(config=FaultProxyConfig(seed=11)) as server:
        yield server.url


def _run(proxy_url: str, stale_every: int, name: str, ops: int) -> History:
    server = KVServer(stale_every)
    try:
        proxy = toxiproxy_client(proxy_url).create(upstream=server.address, name=name)
        history = History()
        stop = threading.Event()
        faults = threading.Thread(target=_faults, args=(proxy, stop), daemon=True)
        workers = [
            threading.Thread(target=_workload, args=(history, proxy.listen, f"c{k}", 100 + k, ops), daemon=True)
            for k in range(4)
        ]
        faults.start()
        for w in workers:
            w.start()
        deadline = time.monotonic() + 60
        for w in workers:
            w.join(max(deadline - time.monotonic(), 0.1))
        stop.set()
        faults.join(5)
        assert not any(w.is_alive() for w in workers), "workers hung past the deadline"
        return history
    finally:
        server.close()


def test_kit_e2e_correct_kv_is_linearizable_under_faults(proxy_url: str) -> None:
    history = _run(proxy_url, stale_every=0, name="kv", ops=60)
    statuses = [p.status for p in history.pairs()]
    assert statuses.count("ok") > 100
    assert statuses.count("info") >= 1, "the blackhole should have timed some operations out"
    result = check_kv(history)
    assert result.ok, result.explain()


def test_kit_e2e_stale_reads_are_caught(proxy_url: str) -> None:
    history = _run(proxy_url, stale_every=7, name="kv-stale", ops=60)
    result = check_kv(history)
    assert result.verdict == "illegal", result.explain()
    explanation = result.explain()
    assert "NOT LINEARIZABLE" in explanation and "minimal counter-example" in explanation
