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
