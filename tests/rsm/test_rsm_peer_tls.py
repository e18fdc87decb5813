"""R20 on the RSM replica service: ReplicaServer and PeerClient over TLS and mutual TLS.

A server with a handler that records what reached it: an admitted client's call is
answered (the positive control); a plaintext client, a client trusting another CA and a
client whose certificate is on no allow-list are refused (UnavailableError /
UnauthorizedError, each within its deadline) and the handler sees nothing from them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from scriba.embedded.process import free_port
from scriba.errors import UnauthorizedError, UnavailableError
from scriba.rsm import wire
from scriba.rsm.peer import PeerClient, ReplicaServer
from scriba.testing.pki import TestPki

DEADLINE_S = 10.0


@pytest.fixture
async def served(pki: TestPki) -> AsyncIterator[tuple[str, list[bytes]]]:
    seen: list[bytes] = []

    async def handler(op: wire.Op, flags: int, body: bytes) -> bytes:
        seen.append(body)
        return b"answer:" + body

    address = f"127.0.0.1:{free_port()}"
    server = ReplicaServer(address, handler, 16, pki.server_tls().load())
    await server.start()
    try:
        yield address, seen
    finally:
        await server.close()


async def call(address: str, tls: object, body: bytes) -> bytes:
    client = PeerClient(address, tls)  # type: ignore[arg-type]
    try:
        return await asyncio.wait_for(client.call(wire.Op.STATUS, body, DEADLINE_S), DEADLINE_S * 2)
    finally:
        await client.close()


async def test_rsm_peer_mutual_tls_admits_and_refuses(served: tuple[str, list[bytes]], pki: TestPki) -> None:
    address, seen = served
    assert await call(address, pki.client_tls(pki.client).load(), b"ok") == b"answer:ok"
    with pytest.raises(UnauthorizedError, match="intruder"):
        await call(address, pki.client_tls(pki.intruder).load(), b"intruder")
    with pytest.raises(UnavailableError, match="CERTIFICATE_VERIFY_FAILED"):
        await call(address, pki.client_tls(pki.client, ca=pki.stranger.ca).load(), b"stranger")
    with pytest.raises(UnavailableError):
        await call(address, None, b"plaintext")  # the server hangs up on a non-TLS peer
    assert seen == [b"ok"]


async def test_rsm_metrics_https_admin_only(pki: TestPki) -> None:
    from scriba.rsm.metrics import MetricsEndpoint, RsmMetrics

    async def refresh() -> None:
        return None

    endpoint = MetricsEndpoint("127.0.0.1:0", RsmMetrics(), refresh, pki.server_tls().load())
    await endpoint.start()
    try:
        host, port = endpoint.address.rsplit(":", 1)

        async def get(who: object) -> bytes:
            ctx = pki.client_tls(who).load().client_ssl_context()  # type: ignore[arg-type]
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port), ssl=ctx), DEADLINE_S)
            try:
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                return await asyncio.wait_for(reader.read(), DEADLINE_S)
            finally:
                writer.close()

        assert (await get(pki.admin)).startswith(b"HTTP/1.1 200")  # positive control
        answer = await get(pki.client)
        assert answer.startswith(b"HTTP/1.1 403") and b"admin allow-list" in answer
    finally:
        await endpoint.close()
