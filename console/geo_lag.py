"""Geo-replication lag over the last minutes, from the replicators' own ``/metrics``.

A replicator process (``scriba geo replicate --http HOST:PORT``) publishes, per stream and
source cluster, ``scriba_geo_lag_records`` (shipped, not yet confirmed in the target) and
``scriba_geo_lag_seconds`` (age of the oldest such record) — see ``scriba.geo.metrics``.
Replicators do not register in the metadata store, so the console is told where they are
(``scriba console --geo-metrics HOST:PORT``, repeatable) and scrapes them every probe
interval.

:class:`LagWindow` (no I/O) keeps, per (stream, source), the samples of the last
``window_s`` seconds, at most ``samples_max`` of them, and at most ``series_max`` series;
a series not seen for ``window_s`` goes. :class:`GeoScraper` feeds it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from scriba.console.periodic import Periodic
from scriba.log import get_logger

log = get_logger(__name__)

SCRAPE_TIMEOUT_S: Final = 1.0
LAG_RECORDS: Final = "scriba_geo_lag_records"
LAG_SECONDS: Final = "scriba_geo_lag_seconds"


@dataclass(frozen=True, slots=True)
class LagReading:
    stream: str  # target namespace/stream, as the replicator labels it
    source: str  # the source cluster's name
    records: float
    seconds: float


def parse_lag(text: str) -> list[LagReading]:
    """The lag gauges of one replicator's Prometheus text (other metrics ignored)."""
    found: dict[tuple[str, str], dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in (LAG_RECORDS, LAG_SECONDS) and "stream" in s.labels and "source" in s.labels:
                found.setdefault((s.labels["stream"], s.labels["source"]), {})[s.name] = s.value
    return [LagReading(stream, source, v.get(LAG_RECORDS, 0.0), v.get(LAG_SECONDS, 0.0))
            for (stream, source), v in sorted(found.items())]


@dataclass(slots=True)
class _Series:
    samples: deque[tuple[float, float, float]]  # (wall time, records behind, seconds behind)
    endpoint: str = ""


@dataclass(slots=True)
class LagWindow:
    window_s: float = 600.0
    samples_max: int = 600
    series_max: int = 1000
    _series: dict[tuple[str, str], _Series] = field(default_factory=dict)

    def record(self, at_s: float, readings: Iterable[LagReading], endpoint: str = "") -> None:
        for r in readings:
            key = (r.stream, r.source)
            series = self._series.get(key)
            if series is None:
                if len(self._series) >= self.series_max:
                    continue  # bounded: a new series waits until an old one goes
                series = self._series[key] = _Series(deque(maxlen=self.samples_max))
            series.endpoint = endpoint
            series.samples.append((at_s, r.records, r.seconds))
        self.expire(at_s)

    def expire(self, now_s: float) -> None:
        cutoff = now_s - self.window_s
        for key in list(self._series):
            samples = self._series[key].samples
            while samples and samples[0][0] < cutoff:
                samples.popleft()
            if not samples:
                del self._series[key]

    def __len__(self) -> int:
        return len(self._series)

    def series(self) -> list[dict[str, Any]]:
        out = []
        for (stream, source), s in sorted(self._series.items()):
            last = s.samples[-1]
            out.append({"stream": stream, "source": source, "endpoint": s.endpoint,
                        "records_behind": last[1], "seconds_behind": round(last[2], 3),
                        "samples": [[round(t, 3), r, round(sec, 3)] for t, r, sec in s.samples]})
        return out


@dataclass(slots=True)
class Endpoint:
    address: str
    up: bool = False
    error: str = "not scraped yet"
    scraped_s: float = 0.0


class GeoScraper(Periodic):
    """Scrapes each replicator ``/metrics`` endpoint every ``interval_s`` into a :class:`LagWindow`."""

    name = "console-geo-scraper"

    def __init__(self, addresses: Sequence[str], window: LagWindow, *, interval_s: float = 1.0) -> None:
        super().__init__(interval_s)
        self.endpoints = [Endpoint(a) for a in addresses]
        self.window = window
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        if self.endpoints:  # nothing to scrape: no task
            super().start()

    async def closed(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def tick(self) -> None:
        await self.scrape_all()

    async def scrape_all(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S))
        await asyncio.gather(*(self._scrape(self._session, e) for e in self.endpoints))
        self.window.expire(time.time())

    async def _scrape(self, session: aiohttp.ClientSession, endpoint: Endpoint) -> None:
        endpoint.scraped_s = time.time()
        try:
            async with session.get(f"http://{endpoint.address}/metrics") as reply:
                if reply.status != 200:
                    raise ValueError(f"HTTP {reply.status}")
                readings = parse_lag(await reply.text())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            endpoint.up, endpoint.error = False, f"{type(exc).__name__}: {exc}"
            return
        endpoint.up, endpoint.error = True, ""
        self.window.record(endpoint.scraped_s, readings, endpoint.address)
