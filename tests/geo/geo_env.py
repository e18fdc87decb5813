"""Clusters for geo tests: each its own ``memory://`` store and its own in-process bookies.

A "process" (``Site.client``) has its own store session; ``Site.crash`` ends it without
closing anything cleanly (its writer locks go with the session), as a SIGKILL would.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

from scriba.client import ClientConfig
from scriba.client.driver import DriverConfig
from scriba.geo import Cluster
from scriba.stream import Namespace, Position, Record, WriterOptions, open_namespace
from scriba.testing.checkers import LogRead, check_acked_set, check_log
from scriba.testing.sim import InProcessSite

BOOKIES = [f"bk{i}" for i in range(3)]
CONFIG = ClientConfig(
    add_timeout_s=2.0, bookie_wait_s=2.0,
    driver=DriverConfig(read_timeout_s=2.0, metadata_timeout_s=5.0, long_poll_s=0.05),
)
FAST_LOCK = WriterOptions(lock_timeout_s=0.3)
NAMESPACE = "geo/test"
STREAM = "orders"


class Site(InProcessSite):
    def __init__(self, name: str, uri: str) -> None:
        super().__init__(uri, BOOKIES, CONFIG)
        self.name = name

    async def namespace(self) -> Namespace:
        return await open_namespace(await self.client(), NAMESPACE, create=True, ensemble_size=3,
                                    write_quorum_size=2, ack_quorum_size=2, segment_records_max=40)

    async def cluster(self) -> Cluster:
        return Cluster(self.name, await self.namespace())



async def make_site(name: str) -> Site:
    uri = f"memory://geo-{name}-{uuid.uuid4().hex[:8]}"
    site = Site(name, uri)
    await site.start()
    return site


async def read_until(ns: Namespace, count: int, timeout_s: float = 20.0) -> list[Record]:
    """The first ``count`` records of the stream (waits for them, with a deadline)."""
    out: list[Record] = []
    reader = await ns.open_reader(STREAM, "earliest")
    try:
        async with asyncio.timeout(timeout_s):
            while len(out) < count:
                out.append(await reader.__anext__())
    finally:
        await reader.close()
    return out


async def read_all(ns: Namespace, settle_s: float = 0.3) -> list[Record]:
    """Every record now in the stream: read until nothing new arrives within ``settle_s``."""
    out: list[Record] = []
    reader = await ns.open_reader(STREAM, "earliest")
    try:
        while (record := await reader.read_next(timeout_s=settle_s)) is not None:
            out.append(record)
    finally:
        await reader.close()
    return out


def payloads(records: Sequence[Record]) -> list[bytes]:
    return [r.payload for r in records]


def positions(records: Sequence[Record]) -> list[Position]:
    return [r.position for r in records]


def check_replica(source: Sequence[bytes], target: Sequence[bytes]) -> list[str]:
    """The target must hold exactly the source's records, in source order: 0 lost, 0 reordered,
    0 duplicated — the acked-set checker (lost, unexpected, read more than once) and the log
    checker (one value per position, nothing beyond the source's last position)."""
    acked = check_acked_set(source, source, target)
    last = len(source) - 1
    log = check_log([LogRead.from_values("target", list(target), closed_last=last)],
                    dict(enumerate(source)), closed_last=last)
    problems = [*([acked.explain()] if not acked.ok else []), *log.violations]
    if acked.duplicated:
        problems.append(f"duplicated: {len(acked.duplicated)} records read more than once")
    return problems
