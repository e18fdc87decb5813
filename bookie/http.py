"""A tiny HTTP endpoint: ``/health`` (200 serving, 503 otherwise) and ``/metrics`` (Prometheus).

Plain asyncio streams, GET only, one request per connection, every read bounded by a
deadline and a size. Nothing here can stop the bookie: a bad request gets a 4xx.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST

from scriba.log import get_logger

log = get_logger(__name__)

REQUEST_BYTES_MAX: Final = 8192
REQUEST_TIMEOUT_S: Final = 5.0


class HttpEndpoint:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        health: Callable[[], tuple[bool, dict[str, object]]],
        metrics: Callable[[], bytes],
    ) -> None:
        self._host = host
        self._port = port
        self._health = health
        self._metrics = metrics
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        if self._server is None or not self._server.sockets:
            return ""
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, self._host, self._port, limit=REQUEST_BYTES_MAX
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
            path = rest.split(" ", 1)[0].split("?", 1)[0]
            code, ctype, body = self._route(method, path)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            code, ctype, body = 400, "text/plain", b"bad request\n"
        except Exception:
            log.exception("http_request_failed")
            code, ctype, body = 500, "text/plain", b"internal error\n"
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                  500: "Internal Server Error", 503: "Service Unavailable"}[code]
        try:
            writer.write(
                f"HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
            )
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_S)
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()

    def _route(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"GET only\n"
        if path == "/health":
            ok, detail = self._health()
            body = json.dumps({"ok": ok, **detail}, sort_keys=True).encode() + b"\n"
            return (200 if ok else 503), "application/json", body
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, self._metrics()
        return 404, "text/plain", b"not found (try /health or /metrics)\n"
