"""The metadata store goes away under a running console, and comes back (#22's bad input).

Real etcd, killed (SIGKILL) and restarted on the same data dir and port. The etcd driver
rides out the outage itself — its watches stay open, silent, and re-sync once the server
is back — so the console learns of it from the store's session (SUSPENDED): the status
says so and the page shows its banner over the last copy; once the store is back the
console follows it again (a ledger created afterwards is shown). The banner's text is in
every page, hidden unless there is an error, so the test reads the ``hidden`` attribute.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from scriba.console.cli import Console, ConsoleConfig
from scriba.embedded.etcd import EtcdCluster
from scriba.meta import connect
from scriba.meta.records import LedgerMetadata, ledger_key
from scriba.testing.waiting import eventually

DEADLINE_S = 60.0  # the session's keep-alive notices the outage within its TTL; generous for a busy machine
BANNER_HIDDEN = '<div id="store-status" hidden>'


async def _create_ledger(uri: str, lid: int) -> None:
    store = await connect(uri)
    try:
        await store.create(ledger_key(lid), LedgerMetadata(lid, 1, 1, 1, ((0, ("b1",)),)).to_bytes())
    finally:
        await store.close()


async def test_store_back_console_recovers(tmp_path: Path) -> None:
    etcd = EtcdCluster(tmp_path / "etcd", 1)
    await asyncio.to_thread(etcd.start)
    console = None
    try:
        uri = etcd.uri("console-outage")
        await _create_ledger(uri, 1)
        console = Console(ConsoleConfig(uri, "127.0.0.1:0"))
        await console.start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async def get(path: str) -> Any:
                async with http.get(console.url + path) as reply:
                    assert reply.status == 200, path
                    return await (reply.json() if path.startswith("api/") else reply.text())

            async def ledger_ids() -> list[int]:
                return [row["ledger_id"] for row in (await get("api/ledgers"))["ledgers"]]

            async def shows(ids: list[int]) -> bool:
                return await ledger_ids() == ids

            async def store_error() -> bool:
                return bool((await get("api/status"))["error"])

            async def synced_again() -> bool:
                doc = await get("api/status")
                return bool(doc["synced"]) and doc["error"] is None

            await eventually(lambda: shows([1]), DEADLINE_S, what="ledger 1 shown")
            assert BANNER_HIDDEN in await get("")
            await asyncio.to_thread(etcd.kill_member, 0)  # the store goes away
            await eventually(store_error, DEADLINE_S, what="the store's outage reported")
            away = await get("api/status")
            assert uri in away["error"] and away["synced"] is False, away
            assert BANNER_HIDDEN not in await get("")  # the page says so ...
            assert await ledger_ids() == [1]  # ... over the last copy
            await asyncio.to_thread(etcd.start_member, 0)  # it comes back: the console follows it again
            await eventually(synced_again, DEADLINE_S, what="the console synced again")
            await _create_ledger(uri, 2)
            await eventually(lambda: shows([1, 2]), DEADLINE_S, what="ledger 2 shown")
            assert BANNER_HIDDEN in await get("")
    finally:
        if console is not None:
            await console.stop()
        await asyncio.to_thread(etcd.stop)
