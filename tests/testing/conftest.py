"""Fixtures of the fault proxy's tests (``test_testing_faults*.py``): an echo server, a
fault proxy in a thread (seeded), and the toxiproxy-python client of that proxy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fault_proxy_site import EchoServer

from scriba.testing.faults import FaultProxyConfig, ToxiproxyServer, toxiproxy_client


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
