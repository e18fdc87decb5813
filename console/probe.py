"""Probing the bookies' HTTP endpoints (``/health``, ``/metrics``: scriba.bookie.http).

Every ``interval_s`` the prober asks each bookie it knows of (from the mirror's
registrations; a bookie whose registration went keeps its last address, so a killed
bookie is probed and found down before its lease lapses) for ``/health`` and
``/metrics``, all at once, each with a short deadline. It keeps per bookie whether the
last probe answered and a bounded window of samples (time, adds, reads, free bytes) from
which the pages draw charts and compute rates. Memory is bounded: ``window`` samples a
bookie, and bookies forgotten once they have been unknown for ``forget_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from scriba.console.periodic import Periodic
from scriba.log import get_logger
from scriba.tls import TlsConfig

log = get_logger(__name__)

PROBE_TIMEOUT_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float  # wall clock
    adds: float  # adds answered OK since the bookie started
    reads: float  # reads answered OK since the bookie started
    free_bytes: float
    total_bytes: float


@dataclass(slots=True)
class BookieProbe:
    http_address: str
    up: bool = False
    probed_s: float = 0.0  # last probe's wall time (0: never)
    last_up_s: float = 0.0
    error: str = ""  # why the last completed probe failed; "" when it answered (or none completed yet)
    health: dict[str, object] = field(default_factory=dict)
    samples: deque[Sample] = field(default_factory=deque)

    @property
    def failed(self) -> bool:
        """The last completed probe failed. A first probe still in flight has not: ``probed_s`` is
        set when a probe starts, and ``up`` is still False until the first one answers."""
        return bool(self.error)

    def rates(self) -> tuple[float, float]:
        """Adds/s and reads/s over the last two samples (0 with fewer, or after a restart)."""
        if len(self.samples) < 2:
            return 0.0, 0.0
        return rates_between(self.samples[-2], self.samples[-1]) or (0.0, 0.0)


def rates_between(a: Sample, b: Sample) -> tuple[float, float] | None:
    """Adds/s and reads/s from ``a`` to ``b``; None if the counters restarted (or no time passed)."""
    dt = b.at_s - a.at_s
    if dt <= 0 or b.adds < a.adds or b.reads < a.reads:
        return None
    return (b.adds - a.adds) / dt, (b.reads - a.reads) / dt


def parse_metrics(text: str) -> dict[str, float]:
    """The few numbers the console uses from a bookie's Prometheus text."""
    out = {"adds": 0.0, "reads": 0.0, "free_bytes": 0.0, "total_bytes": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "scriba_bookie_adds_total" and s.labels.get("status") == "OK":
                out["adds"] += s.value
            elif s.name == "scriba_bookie_reads_total" and s.labels.get("status") == "OK":
                out["reads"] += s.value
            elif s.name == "scriba_bookie_free_bytes":
                out["free_bytes"] = s.value
            elif s.name == "scriba_bookie_total_bytes":
                out["total_bytes"] = s.value
    return out


class Prober(Periodic):
    """Probes the bookies ``targets()`` names (bookie id -> http address)."""

    name = "console-prober"

    def __init__(self, targets: Callable[[], Mapping[str, str]], *, interval_s: float = 1.0,
                 window: int = 300, forget_s: float = 600.0, tls: TlsConfig | None = None) -> None:
        """``tls``: probe bookies over HTTPS with this client certificate (an admin one)."""
        super().__init__(interval_s)
        self._targets = targets
        self._ssl = tls.load().client_ssl_context() if tls is not None else None
        self.window = window
        self.forget_s = forget_s
        self.probes: dict[str, BookieProbe] = {}
        self._session: aiohttp.ClientSession | None = None

    async def closed(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def tick(self) -> None:
        await self.probe_all()

    async def probe_all(self) -> None:
        now = time.time()
        for bookie_id, address in self._targets().items():
            probe = self.probes.get(bookie_id)
            if probe is None:
                self.probes[bookie_id] = BookieProbe(address, samples=deque(maxlen=self.window))
            elif address:
                probe.http_address = address
        targets = self._targets()
        for bookie_id in [b for b, p in self.probes.items()
                          if b not in targets and now - max(p.last_up_s, p.probed_s) > self.forget_s]:
            del self.probes[bookie_id]
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._ssl) if self._ssl is not None else None
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S),
                                                  connector=connector)
        await asyncio.gather(*(self._probe(self._session, p) for p in self.probes.values()))

    async def _probe(self, session: aiohttp.ClientSession, probe: BookieProbe) -> None:
        probe.probed_s = time.time()
        if not probe.http_address:
            probe.up, probe.error = False, "no http address registered"
            return
        base = f"{'https' if self._ssl is not None else 'http'}://{probe.http_address}"
        try:
            async with session.get(f"{base}/health") as reply:
                probe.health = dict(await reply.json(content_type=None))
                healthy = reply.status == 200
            async with session.get(f"{base}/metrics") as reply:
                numbers = parse_metrics(await reply.text())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            probe.up, probe.error = False, f"{type(exc).__name__}: {exc}"
            return
        probe.up = healthy
        probe.error = "" if healthy else "health: not serving"
        probe.last_up_s = probe.probed_s
        probe.samples.append(Sample(probe.probed_s, numbers["adds"], numbers["reads"],
                                    numbers["free_bytes"], numbers["total_bytes"]))
