"""The etcd API servers (a KV replica's and a geo follower's) do not share a port.

gRPC sets SO_REUSEPORT on its listening sockets unless told not to, and two processes
of one user that both set it may bind the same port: the kernel then splits the
connections between them, and a client lands on whichever it is given. With the
servers' options the second bind fails (the server refuses to start); the negative
control, the same options with SO_REUSEPORT left on, binds twice.
"""

from __future__ import annotations

from typing import Any

import grpc.aio

from scriba.examples.kvstore.server import GRPC_OPTIONS
from scriba.grpc_auth import bind


async def _second_bind(options: list[tuple[str, Any]]) -> int:
    first, second = grpc.aio.server(options=options), grpc.aio.server(options=options)
    try:
        port = bind(first, "127.0.0.1:0", None)
        assert port > 0
        await first.start()
        return bind(second, f"127.0.0.1:{port}", None)
    finally:
        await first.stop(None)
        await second.stop(None)


async def test_a_port_held_by_another_server_is_refused() -> None:
    assert await _second_bind(GRPC_OPTIONS) == 0


async def test_negative_control_reuseport_shares_the_port() -> None:
    sharing = [(k, v) for k, v in GRPC_OPTIONS if k != "grpc.so_reuseport"]
    assert await _second_bind(sharing) > 0
