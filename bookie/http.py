"""A tiny HTTP endpoint: ``/health`` (200 serving, 503 otherwise), ``/metrics`` (Prometheus)
and ``/api/gc`` (admin: ``GET`` the garbage collector's status; ``POST`` or ``PUT`` asks
for a GC cycle now, ``?major=1`` / ``?minor=1`` to compact as that pass even if its
interval has not passed — 202 with the number of the cycle to wait for).

With TLS (``tls``) the port speaks only TLS; with mutual TLS every request must come
from a certificate on the admin allow-list (403 otherwise, before any route runs).

Plain asyncio streams, one request per connection, every read bounded by a deadline and
a size (a request body is read and ignored). Nothing here can stop the bookie: a bad
request gets a 4xx.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Final, Protocol
from urllib.parse import parse_qs

from prometheus_client import CONTENT_TYPE_LATEST

from scriba.log import get_logger
from scriba.tls import LoadedTls, Role, refusal

log = get_logger(__name__)

REQUEST_BYTES_MAX: Final = 8192
REQUEST_TIMEOUT_S: Final = 5.0
_TRUE: Final = frozenset({"", "1", "true", "yes"})
_FALSE: Final = frozenset({"0", "false", "no"})
_REASONS: Final = {200: "OK", 202: "Accepted", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
                   405: "Method Not Allowed", 500: "Internal Server Error", 503: "Service Unavailable"}


class GcControl(Protocol):
    def request(self, *, major: bool = False, minor: bool = False) -> int: ...

    def status(self) -> dict[str, object]: ...


Reply = tuple[int, str, bytes]


class HttpEndpoint:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        health: Callable[[], tuple[bool, dict[str, object]]],
        metrics: Callable[[], bytes],
        gc: Callable[[], GcControl | None] = lambda: None,
        tls: LoadedTls | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._health = health
        self._metrics = metrics
        self._gc = gc
        self._tls = tls
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        if self._server is None or not self._server.sockets:
            return ""
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def start(self) -> None:
        ssl = self._tls.server_ssl_context() if self._tls is not None else None
        self._server = await asyncio.start_server(
            self._handle, self._host, self._port, limit=REQUEST_BYTES_MAX,
            ssl=ssl, ssl_handshake_timeout=REQUEST_TIMEOUT_S if ssl is not None else None,
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            lines = head.decode("latin-1").split("\r\n")
            method, _, rest = lines[0].partition(" ")
            path, _, query = rest.split(" ", 1)[0].partition("?")
            length = _content_length(lines[1:])
            if length > REQUEST_BYTES_MAX:
                raise ValueError("body too large")
            if length:
                await asyncio.wait_for(reader.readexactly(length), REQUEST_TIMEOUT_S)
            refusal = self._refusal(writer)
            if refusal is not None:
                code, ctype, body = 403, "text/plain", f"{refusal}\n".encode()
            else:
                code, ctype, body = self._route(method, path, query)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            code, ctype, body = 400, "text/plain", b"bad request\n"
        except Exception:
            log.exception("http_request_failed")
            code, ctype, body = 500, "text/plain", b"internal error\n"
        try:
            writer.write(
                f"HTTP/1.1 {code} {_REASONS[code]}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
            )
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_S)
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()

    def _refusal(self, writer: asyncio.StreamWriter) -> str | None:
        """Why this connection's peer may not use the endpoint (None: it may)."""
        refused = refusal(self._tls, writer.get_extra_info("peercert"), (Role.ADMIN,))
        if refused is None:
            return None
        log.warning("http_request_refused", reason=str(refused))
        return f"forbidden: {refused}"

    def _route(self, method: str, path: str, query: str) -> Reply:
        if path == "/api/gc":
            return self._route_gc(method, query)
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"GET only\n"
        if path == "/health":
            ok, detail = self._health()
            return (200 if ok else 503), "application/json", _json({"ok": ok, **detail})
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, self._metrics()
        return 404, "text/plain", b"not found (try /health, /metrics or /api/gc)\n"

    def _route_gc(self, method: str, query: str) -> Reply:
        gc = self._gc()
        if method not in ("GET", "HEAD", "POST", "PUT"):
            return 405, "application/json", _json({"error": "GET for the status, POST to run a GC cycle now"})
        if gc is None:
            return 503, "application/json", _json({"error": "garbage collector not running"})
        if method in ("GET", "HEAD"):
            return 200, "application/json", _json(gc.status())
        flags = {"major": False, "minor": False}
        for name, values in parse_qs(query, keep_blank_values=True).items():
            value = values[-1].lower()
            if name not in flags or value not in _TRUE | _FALSE:
                return 400, "application/json", _json(
                    {"error": f"unknown parameter {name}={values[-1]!r} (major, minor: 1 or 0)"})
            flags[name] = value in _TRUE
        cycle = gc.request(major=flags["major"], minor=flags["minor"])
        log.info("gc_requested", cycle=cycle, **flags)
        return 202, "application/json", _json({"requested_cycle": cycle, **gc.status()})


def _content_length(header_lines: list[str]) -> int:
    for line in header_lines:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            n = int(value.strip())  # ValueError: a bad request
            if n < 0:
                raise ValueError("negative Content-Length")
            return n
    return 0


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True).encode() + b"\n"
