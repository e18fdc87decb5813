"""The fault proxy's toxics, each on real TCP through the proxy (``fault_proxy_site.py``):
latency and jitter, timeout (blackhole, and close after a delay), limit_data both ways,
reset_peer, bandwidth, slicer, slow_close, and toxicity rolled once per connection.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from typing import Any

import pytest
from fault_proxy_site import (
    WAIT_S,
    EchoServer,
    connect,
    recv_exactly,
    recv_until_eof,
    round_trip_s,
    still_open_without_data,
)

from scriba.embedded.process import wait_until


def test_faults_latency_adds_at_least_the_configured_delay(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    with connect(proxy.listen) as sock:
        baseline = min(round_trip_s(sock) for _ in range(5))
        proxy.add_toxic(type="latency", attributes={"latency": 150})
        with_latency = [round_trip_s(sock) for _ in range(3)]
        assert min(with_latency) >= 0.150, with_latency
        assert max(with_latency) < 0.150 + 1.0  # added delay, not a stall
        proxy.add_toxic(type="latency", name="up", stream="upstream", attributes={"latency": 100})
        assert round_trip_s(sock) >= 0.250
        proxy.destroy_toxic("latency_downstream")
        proxy.destroy_toxic("up")
        assert min(round_trip_s(sock) for _ in range(3)) < baseline + 0.2


def test_faults_latency_toxicity_zero_never_applies(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="latency", toxicity=0.0, attributes={"latency": 1000})
    with connect(proxy.listen) as sock:
        assert round_trip_s(sock) < 0.5


def test_faults_timeout_zero_holds_data_then_delivers_when_removed(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    with connect(proxy.listen) as sock:
        assert round_trip_s(sock) < 1.0
        proxy.add_toxic(type="timeout", name="blackhole", attributes={"timeout": 0})
        sock.sendall(b"held-bytes")
        # silent: no data, and no EOF or reset (select would report either as readable)
        assert still_open_without_data(sock, 0.7)
        proxy.destroy_toxic("blackhole")
        assert recv_exactly(sock, len(b"held-bytes")) == b"held-bytes"
        assert round_trip_s(sock) < 1.0


def test_faults_timeout_upstream_blackhole_holds_requests(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="timeout", name="bh", stream="upstream", attributes={"timeout": 0})
    with connect(proxy.listen) as sock:  # new connections are blackholed too
        sock.sendall(b"x" * 1000)
        assert still_open_without_data(sock, 0.5)
        proxy.destroy_toxic("bh")
        assert recv_exactly(sock, 1000) == b"x" * 1000


def test_faults_timeout_positive_closes_after_the_delay(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    with connect(proxy.listen) as sock:
        start = time.monotonic()
        proxy.add_toxic(type="timeout", attributes={"timeout": 300})
        sock.sendall(b"dropped")
        assert recv_until_eof(sock) == b""
        elapsed = time.monotonic() - start
        assert 0.25 <= elapsed < 3.0, elapsed


def test_faults_limit_data_closes_after_n_bytes(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="limit_data", attributes={"bytes": 1000})
    with connect(proxy.listen) as sock:
        sock.sendall(os.urandom(5000))
        received = recv_until_eof(sock)
    assert len(received) == 1000


def test_faults_reset_peer_gives_econnreset(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    with connect(proxy.listen) as sock:
        assert round_trip_s(sock) < 1.0
        proxy.add_toxic(type="reset_peer", attributes={"timeout": 100})
        start = time.monotonic()
        sock.sendall(b"trigger")
        with pytest.raises(ConnectionResetError) as info:
            recv_until_eof(sock)
        assert info.value.errno == errno.ECONNRESET
        assert time.monotonic() - start >= 0.09


def test_faults_bandwidth_caps_the_rate(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    payload = os.urandom(100_000)
    with connect(proxy.listen) as sock:
        start = time.monotonic()
        sock.sendall(payload)
        assert recv_exactly(sock, len(payload)) == payload
        unlimited_s = time.monotonic() - start
        proxy.add_toxic(type="bandwidth", attributes={"rate": 200})  # 200 KB/s
        start = time.monotonic()
        sock.sendall(payload)
        assert recv_exactly(sock, len(payload), timeout_s=10) == payload
        limited_s = time.monotonic() - start
    rate_kb_s = len(payload) / 1000 / limited_s
    assert rate_kb_s <= 200 * 1.25, rate_kb_s
    assert rate_kb_s >= 200 * 0.25, rate_kb_s  # roughly the cap, not a stall
    assert limited_s > unlimited_s


def test_faults_slicer_delivers_every_byte_in_order(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="slicer", attributes={"average_size": 64, "size_variation": 32, "delay": 200})
    payload = os.urandom(20_000)
    with connect(proxy.listen) as sock:
        sock.sendall(payload)
        assert recv_exactly(sock, len(payload)) == payload


def test_faults_slow_close_delays_eof(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="slow_close", attributes={"delay": 400})
    with connect(proxy.listen) as sock:
        sock.sendall(b"bye")
        assert recv_exactly(sock, 3) == b"bye"
        start = time.monotonic()
        sock.shutdown(socket.SHUT_WR)  # echo server closes; the proxy delays passing that on
        assert recv_until_eof(sock) == b""
        assert time.monotonic() - start >= 0.35


def test_faults_jitter_keeps_byte_order(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="latency", attributes={"latency": 20, "jitter": 15})
    messages = [f"{i:05d};".encode() for i in range(300)]
    with connect(proxy.listen) as sock:
        for message in messages:  # many small writes: many chunks with different delays
            sock.sendall(message)
        assert recv_exactly(sock, sum(map(len, messages)), timeout_s=20) == b"".join(messages)


def test_faults_toxicity_is_rolled_per_connection(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="latency", toxicity=0.5, attributes={"latency": 80})
    delayed = 0
    for _ in range(20):
        with connect(proxy.listen) as sock:
            first = round_trip_s(sock)
            second = round_trip_s(sock)
            assert (first >= 0.08) == (second >= 0.08)  # decided once for the whole connection
            delayed += first >= 0.08
    assert 3 <= delayed <= 17, delayed


def test_faults_limit_data_upstream_cuts_what_the_server_gets(tp: Any, echo: EchoServer) -> None:
    proxy = tp.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="limit_data", stream="upstream", attributes={"bytes": 1500})
    with connect(proxy.listen) as sock:
        payload = os.urandom(6000)
        try:
            sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            received = recv_until_eof(sock)
        except ConnectionResetError:
            received = b""
    assert len(received) <= 1500
    assert received == payload[: len(received)]
    wait_until(lambda: 0 in echo.finished, WAIT_S, what="the server saw the connection end")
    assert echo.bytes_in[0] == 1500
