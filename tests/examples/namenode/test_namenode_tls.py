"""The namenode's WebHDFS server over HTTPS with mutual TLS (the middleware, in process).

The namenode behind it is a stand-in: a refused certificate gets 403 before any handler
runs; an admitted one reaches the router (404 for a path that does not exist).
"""

from __future__ import annotations

import types
from typing import Any

from scriba.certs import Issued
from scriba.embedded.process import free_port
from scriba.examples.namenode.server import serve
from scriba.testing.pki import TestPki, https_get


async def test_webhdfs_https_allow_list(pki: TestPki) -> None:
    nn: Any = types.SimpleNamespace(url="")
    runner = await serve(nn, "127.0.0.1", free_port(), pki.server_tls().load())
    try:
        assert nn.url.startswith("https://")

        async def get(who: Issued) -> tuple[int, str]:
            return await https_get(nn.url + "/no/such/route", pki.client_tls(who))

        assert (await get(pki.client))[0] == 404  # admitted: the router answered
        code, text = await get(pki.intruder)
        assert code == 403 and "intruder" in text
    finally:
        await runner.cleanup()
