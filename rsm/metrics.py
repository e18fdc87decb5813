"""Prometheus metrics of one replica, served on ``GET /metrics`` of ``metrics_listen``.

A registry per replica (tests run several in one process). Two counted figures: the
proposals received (``scriba_rsm_proposals_total``: rate() gives proposals/s) and the
records per appended record set (``scriba_rsm_batch_records``: the group commit's batch
size, observed by the leader per append). Everything else is a gauge set at scrape time
from the replica's ``status()``: the role (one series per role, 1 for the current one),
the election's fencing token, the applied position and record count, the newest
snapshot's position and age, and the lag behind the stream's end.

The lag. A leader applies each record set once it is confirmed, so it is at the
stream's confirmed end: lag 0. A follower asks the leader for its status over the
replica service when scraped: ``lag_records`` is the leader's records applied less its
own; ``lag_seconds`` is the leader's replicated clock (the stamp of the newest record it
applied) less the follower's — a difference of leader stamps, so no clock of this host
enters it — and 0 when nothing is behind. Leader unknown or not answering: both NaN.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from scriba.errors import ConfigError
from scriba.log import get_logger
from scriba.rsm.role import Role
from scriba.stream import Position
from scriba.tls import LoadedTls, refusal
from scriba.tls import Role as TlsRole

log = get_logger(__name__)

BATCH_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
REQUEST_BYTES_MAX: Final = 8192
REQUEST_TIMEOUT_S: Final = 5.0
NAN: Final = float("nan")


class RsmMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.proposals = Counter("scriba_rsm_proposals", "Proposals received (own and forwarded)", registry=r)
        self.batch_records = Histogram("scriba_rsm_batch_records", "Records per appended record set (group commit)",
                                       buckets=BATCH_BUCKETS, registry=r)
        self.role = Gauge("scriba_rsm_role", "1 for the replica's current role", ["role"], registry=r)
        self.token = Gauge("scriba_rsm_fencing_token", "The election's fencing token of the term last seen", registry=r)
        self.records_applied = Gauge("scriba_rsm_records_applied", "Stream records applied (every kind)", registry=r)
        self.commands_applied = Gauge("scriba_rsm_commands_applied", "Commands applied", registry=r)
        self.applied_segment = Gauge("scriba_rsm_applied_segment", "Applied position: segment", registry=r)
        self.applied_entry = Gauge("scriba_rsm_applied_entry", "Applied position: entry in the segment", registry=r)
        self.lag_records = Gauge("scriba_rsm_lag_records", "Records behind the stream's end (NaN: unknown)",
                                 registry=r)
        self.lag_seconds = Gauge("scriba_rsm_lag_seconds",
                                 "Replicated-clock seconds behind the stream's end (NaN: unknown)", registry=r)
        self.snapshot_segment = Gauge("scriba_rsm_snapshot_segment", "Newest snapshot's position: segment "
                                      "(NaN: none)", registry=r)
        self.snapshot_entry = Gauge("scriba_rsm_snapshot_entry", "Newest snapshot's position: entry (NaN: none)",
                                    registry=r)
        self.snapshot_age_seconds = Gauge("scriba_rsm_snapshot_age_seconds", "Age of the newest snapshot "
                                          "(NaN: none)", registry=r)

    def update(self, status: dict[str, Any]) -> None:
        for role in Role:
            self.role.labels(role=role.value).set(1 if status["role"] == role.value else 0)
        self.token.set(status["token"])
        self.records_applied.set(status["records_applied"])
        self.commands_applied.set(status["commands_applied"])
        _set_position(self.applied_segment, self.applied_entry, status["applied"])
        _set_position(self.snapshot_segment, self.snapshot_entry, status["snapshot_position"])
        age = status["snapshot_age_s"]
        self.snapshot_age_seconds.set(NAN if age is None else age)
        for gauge, key in ((self.lag_records, "lag_records"), (self.lag_seconds, "lag_s")):
            value = status.get(key)
            gauge.set(NAN if value is None else value)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def lag(own: dict[str, Any], leader: dict[str, Any] | None) -> tuple[int | None, float | None]:
    """(records, seconds) behind the leader's status ``leader`` (None: unknown)."""
    if own["role"] == Role.LEADER.value:
        return 0, 0.0
    if leader is None:
        return None, None
    records = max(0, int(leader["records_applied"]) - int(own["records_applied"]))
    seconds = max(0.0, (int(leader["clock_ms"]) - int(own["clock_ms"])) / 1000) if records else 0.0
    return records, seconds


def _set_position(segment: Gauge, entry: Gauge, text: str | None) -> None:
    position = Position.parse(text) if text else None
    segment.set(NAN if position is None else position.segment_seq)
    entry.set(NAN if position is None else position.entry_id)


def check_listen(listen: str) -> str:
    """``host:port`` (port 0..65535; 0 picks a free one) or ``ConfigError``."""
    host, sep, port = listen.rpartition(":") if isinstance(listen, str) else ("", "", "")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"metrics_listen {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:9464 (port 0: any free)")
    return listen


class MetricsEndpoint:
    """``GET /metrics`` on ``host:port`` (port 0: any free one; see :attr:`address`); one
    request per connection, bounded in size and time; ``refresh`` runs before each scrape."""

    def __init__(self, listen: str, metrics: RsmMetrics, refresh: Callable[[], Awaitable[None]],
                 tls: LoadedTls | None = None) -> None:
        """``tls``: HTTPS only; with mutual TLS only certificates on the admin allow-list."""
        host, _, port = check_listen(listen).rpartition(":")
        self._tls = tls
        self._host, self._port = host, int(port)
        self._metrics = metrics
        self._refresh = refresh
        self._server: asyncio.Server | None = None
        self.address = ""  # host:port once started

    async def start(self) -> None:
        ssl = self._tls.server_ssl_context() if self._tls is not None else None
        server = await asyncio.start_server(self._serve, self._host, self._port, limit=REQUEST_BYTES_MAX, ssl=ssl,
                                            ssl_handshake_timeout=REQUEST_TIMEOUT_S if ssl is not None else None)
        host, port = server.sockets[0].getsockname()[:2]
        self._server, self.address = server, f"{host}:{port}"

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            method, _, rest = head.decode("latin-1").partition(" ")
            path = rest.split(" ", 1)[0].partition("?")[0]
            refused = refusal(self._tls, writer.get_extra_info("peercert"), (TlsRole.ADMIN,))
            if refused is not None:
                code, ctype, body = 403, "text/plain", f"forbidden: {refused}\n".encode()
            elif method not in ("GET", "HEAD"):
                code, ctype, body = 405, "text/plain", b"GET only\n"
            elif path != "/metrics":
                code, ctype, body = 404, "text/plain", b"not found (try /metrics)\n"
            else:
                await self._refresh()
                code, ctype, body = 200, CONTENT_TYPE_LATEST, self._metrics.render()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            code, ctype, body = 400, "text/plain", b"bad request\n"
        except Exception:
            log.exception("rsm_metrics_request_failed")
            code, ctype, body = 500, "text/plain", b"internal error\n"
        with contextlib.suppress(OSError, TimeoutError):
            writer.write(f"HTTP/1.1 {code} {'OK' if code == 200 else 'Error'}\r\nContent-Type: {ctype}\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_S)
        writer.close()

