"""The console over HTTPS with mutual TLS: admin certificates only (R20 on its port)."""

from __future__ import annotations

import ssl
import uuid

import aiohttp
import pytest

from scriba.certs import Issued
from scriba.console.cli import Console, ConsoleConfig
from scriba.testing.pki import TestPki, https_get


async def test_console_https_admin_only(pki: TestPki) -> None:
    console = Console(ConsoleConfig(f"memory://console-tls-{uuid.uuid4().hex[:8]}", "127.0.0.1:0",
                                    tls=pki.server_tls()))
    await console.start()
    try:
        assert console.url.startswith("https://")

        async def status(who: Issued | None) -> tuple[int, str]:
            return await https_get(console.url + "api/status", pki.client_tls(who))

        assert (await status(pki.admin))[0] == 200  # positive control
        code, text = await status(pki.client)
        assert code == 403 and "not on the admin allow-list" in text
        with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
            await status(None)  # no client certificate: the handshake fails
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            with pytest.raises(aiohttp.ClientError):
                async with http.get(console.url.replace("https://", "http://") + "api/status") as reply:
                    await reply.read()
    finally:
        await console.stop()


async def test_console_actions_act_as_the_admin_certificate(pki: TestPki) -> None:
    """With --allow-actions over mutual TLS, an action runs as the admin certificate's identity and its
    token is bound to it; a client certificate gets no further than the TLS middleware."""
    uri = f"memory://console-tls-{uuid.uuid4().hex[:8]}"
    console = Console(ConsoleConfig(uri, "127.0.0.1:0", tls=pki.server_tls(), allow_actions=True))
    await console.start()
    try:
        async def post(who: Issued, body: dict[str, object]) -> tuple[int, dict[str, object]]:
            ctx = pki.client_tls(who).load().client_ssl_context()
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10),
                                             connector=aiohttp.TCPConnector(ssl=ctx)) as http:
                async with http.post(console.url + "api/actions/audit", json=body) as reply:
                    doc = await reply.json(content_type=None) if reply.content_type == "application/json" \
                        else {"text": await reply.text()}
                    return reply.status, doc

        code, doc = await post(pki.client, {})
        assert code == 403 and "admin allow-list" in str(doc["text"])
        code, asked = await post(pki.admin, {"full": False})
        assert code == 200 and asked["confirm"]
        code, done = await post(pki.admin, {"full": False, "confirm": asked["confirm"]})
        assert code == 200 and done["result"] == {"sequence": 1, "full": False}, done
        assert done["actor"] and done["actor"] != "operator"  # the certificate's identity, not the default
    finally:
        await console.stop()
