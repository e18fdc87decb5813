"""A populated cluster and a console on it: real etcd, three bookie processes in three
zones, a zone-aware ledger and a stream with closed segments, the console in-process
on a free port. And a console on an empty ``memory://`` store (``memory_console``), for
the mirror's and the views' tests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from scriba.client import Client, ClientConfig
from scriba.console.cli import Console, ConsoleConfig
from scriba.meta import connect
from scriba.meta.store import MetadataStore
from scriba.stream import open_namespace
from scriba.testing.waiting import eventually

ZONES = ["z1", "z2", "z3"]


@dataclass
class Populated:
    console: Console
    cluster: Any  # scriba.testing.cluster.BookieCluster
    ledger_id: int
    http: aiohttp.ClientSession

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.http.get(self.console.url.rstrip("/") + path) as reply:
            if reply.content_type == "application/json":
                return reply.status, await reply.json()
            return reply.status, await reply.text()


async def wait_for(what: str, check: Callable[[], Any], deadline_s: float) -> Any:
    """Poll the async ``check`` until it returns something truthy (returned), or fail after ``deadline_s``."""
    return await eventually(check, deadline_s, what=what, interval_s=0.1)


async def until(what: str, check: Callable[[], Any], deadline_s: float = 30.0) -> Any:
    """Poll the plain ``check`` until it returns something truthy (returned), or fail after ``deadline_s``."""
    return await eventually(check, deadline_s, what=what, interval_s=0.005)


@pytest.fixture
async def memory_console() -> AsyncIterator[tuple[MetadataStore, Console]]:
    """A console on a fresh ``memory://`` store, synced; and a session to that store."""
    uri = f"memory://console-{uuid.uuid4().hex[:8]}"
    store = await connect(uri)
    console = Console(ConsoleConfig(uri, "127.0.0.1:0"))
    await console.start()
    try:
        await console.mirror.wait_synced(30.0)
        yield store, console
    finally:
        await console.stop()
        await store.close()


@pytest.fixture
async def populated(bookie_cluster: Any) -> AsyncIterator[Populated]:
    bookie_cluster.start_bookies(3, regions=["r1"], zones=ZONES, racks=["a", "b", "c"])
    config = ClientConfig(add_timeout_s=5.0, bookie_wait_s=20.0)
    async with Client.connect(bookie_cluster.metadata_uri, placement="zone-aware", config=config) as client:
        await client.registry.wait_for_bookies(3, 20.0)
        writer = await client.create_ledger(3, 3, 2, password=b"pw")
        for i in range(20):
            await writer.append(b"entry-%d" % i)
        await writer.close()
        ns = await open_namespace(client, "apps", create=True, ensemble_size=3, write_quorum_size=2,
                                  ack_quorum_size=2)
        for _ in range(2):  # two closed segments
            w = await ns.open_writer("orders", create=True)
            for i in range(5):
                await w.append(b"order-%d" % i)
            await w.close()
        ledger_id = int(writer.ledger_id)
    console = Console(ConsoleConfig(bookie_cluster.metadata_uri, "127.0.0.1:0", probe_interval_s=0.5))
    await console.start()
    try:
        await console.mirror.wait_synced(20.0)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            yield Populated(console, bookie_cluster, ledger_id, http)
    finally:
        await console.stop()


@pytest.fixture
async def acting(populated: Populated) -> AsyncIterator[tuple[Populated, str]]:
    """A second console on the same cluster, started with --allow-actions."""
    console = Console(ConsoleConfig(populated.cluster.metadata_uri, "127.0.0.1:0", probe_interval_s=0.5,
                                    allow_actions=True))
    url = await console.start()
    try:
        await console.mirror.wait_synced(20.0)
        yield populated, url
    finally:
        await console.stop()
