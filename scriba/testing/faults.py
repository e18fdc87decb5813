"""A TCP fault proxy that speaks the Toxiproxy HTTP API.

The unmodified ``toxiproxy-python`` client (and anything else written for
Toxiproxy's API) drives it: proxies are created with ``POST /proxies``, toxics
are added per stream direction with ``POST /proxies/{name}/toxics`` and take
effect on live connections at once. No real Toxiproxy server can be installed
on the build machines; when one is present (``toxiproxy-server`` on PATH or
``TOXIPROXY_URL`` set), :func:`toxiproxy_url` hands that out instead.

Parts: the toxics and their validation (``toxics.py``), the data path of proxies,
connections and links (``proxy_links.py``), the HTTP API (``toxiproxy_api.py``), and
here the server that serves that API and owns the proxies, with its limits
(:class:`FaultProxyConfig`).

Bounds: proxies, toxics per proxy, connections per proxy, buffered chunks per
link (a held link stops reading, so TCP pushes back on the sender), API request
size and time. Everything binds to loopback unless ``loopback_only=False``.

Thread mode: :meth:`ToxiproxyServer.start` returns the base URL, :meth:`stop`
joins the thread and closes every socket. Process mode: ``scriba faults-proxy``
or :class:`ToxiproxyProcess`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from scriba.config import require
from scriba.embedded.fault_proxy import ToxiproxyProcess
from scriba.errors import ScribaError
from scriba.invariant import invariant
from scriba.log import get_logger
from scriba.testing.proxy_links import run_handler
from scriba.testing.toxics import ApiError
from scriba.testing.toxiproxy_api import (
    ApiState,
    ToxiproxyApi,
    http_response,
    is_loopback,
    read_request,
)

log = get_logger(__name__)

CONNECTIONS_PER_PROXY_MAX = 256


@dataclass(frozen=True, slots=True)
class FaultProxyConfig:
    """Limits of a :class:`ToxiproxyServer`."""

    proxies_max: int = 256
    toxics_per_proxy_max: int = 64
    connections_per_proxy_max: int = CONNECTIONS_PER_PROXY_MAX
    chunk_bytes: int = 32 * 1024
    chunks_buffered_max: int = 32  # per link: at most chunk_bytes * this held in memory
    upstream_connect_timeout_s: float = 5.0
    api_connections_max: int = 64
    api_request_timeout_s: float = 10.0
    api_body_bytes_max: int = 1024 * 1024
    loopback_only: bool = True
    seed: int | None = None

    def validate(self) -> None:
        for name in (
            "proxies_max", "toxics_per_proxy_max", "connections_per_proxy_max", "chunk_bytes",
            "chunks_buffered_max", "upstream_connect_timeout_s", "api_connections_max",
            "api_request_timeout_s", "api_body_bytes_max",
        ):
            require(getattr(self, name) > 0, name, "must be positive")


# --- the server -----------------------------------------------------------------------------


class ToxiproxyServer:
    """The Toxiproxy-API-compatible proxy server, in a background thread or in a caller's loop."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, config: FaultProxyConfig | None = None) -> None:
        self.config = config or FaultProxyConfig()
        self.config.validate()
        invariant(not self.config.loopback_only or is_loopback(host), f"API host {host} is not loopback")
        self.host = host
        self.port = port
        self._state = ApiState(self.config, random.Random(self.config.seed))
        self._api = ToxiproxyApi(self._state)
        self._api_conns: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def serve(self, on_ready: Callable[[str], None] | None = None) -> None:
        """Serve on the running loop until :meth:`request_stop`; then close every socket."""
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        server = await asyncio.start_server(self._serve_api_conn, self.host, self.port, limit=16 * 1024)
        self.port = server.sockets[0].getsockname()[1]
        log.info("faults_proxy_listening", url=self.url)
        try:
            if on_ready is not None:
                on_ready(self.url)
            await self._stop_event.wait()
        finally:
            server.close()
            for writer in list(self._api_conns):
                writer.transport.abort()
            handlers = set(self._handlers)
            for proxy in list(self._state.proxies.values()):
                await proxy.disable()
                handlers |= proxy.handlers
            self._state.proxies.clear()
            if handlers:  # sockets are aborted: the handlers end on their own
                _done, pending = await asyncio.wait(handlers, timeout=5.0)
                for task in pending:
                    task.cancel()
            await server.wait_closed()

    def request_stop(self) -> None:
        """Ask :meth:`serve` to finish (safe from any thread)."""
        loop, event = self._loop, self._stop_event
        if loop is not None and event is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    def start(self, timeout_s: float = 10.0) -> str:
        """Run in a daemon thread with its own loop; returns the base URL once serving."""
        invariant(self._thread is None, "ToxiproxyServer already started")
        ready = threading.Event()

        def run() -> None:
            try:
                asyncio.run(self.serve(on_ready=lambda _url: ready.set()))
            except BaseException as exc:
                self._error = exc
                ready.set()

        self._thread = threading.Thread(target=run, name="toxiproxy-compat", daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s) or self._error is not None:
            self.stop()
            raise ScribaError(f"fault proxy did not start within {timeout_s}s: {self._error!r}")
        return self.url

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving, close every listener and connection, join the thread."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout_s)
            invariant(not self._thread.is_alive(), f"fault proxy thread did not stop within {timeout_s}s")
            self._thread = None

    def __enter__(self) -> ToxiproxyServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def _serve_api_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._api_conns) >= self.config.api_connections_max:
            writer.transport.abort()
            return
        self._api_conns.add(writer)
        try:
            await run_handler(self._handlers, self._serve_requests(reader, writer))
        except (TimeoutError, ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._api_conns.discard(writer)
            writer.close()

    async def _serve_requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        timeout_s = self.config.api_request_timeout_s
        while True:
            try:
                req = await asyncio.wait_for(read_request(reader, self.config.api_body_bytes_max), timeout_s)
            except ApiError as exc:
                writer.write(http_response(exc.code, {"error": str(exc), "status": exc.code}, False))
                await writer.drain()
                return
            except ValueError:  # a line longer than the reader's limit
                writer.write(http_response(400, {"error": "request line or header too long", "status": 400}, False))
                await writer.drain()
                return
            if req is None:
                return
            try:
                status, payload = await self._api.handle(req)
            except ApiError as exc:
                status, payload = exc.code, {"error": str(exc), "status": exc.code}
            writer.write(http_response(status, payload, req.keep_alive))
            await writer.drain()
            if not req.keep_alive:
                return


# --- process mode and helpers ---------------------------------------------------------------


@contextlib.contextmanager
def toxiproxy_url(*, prefer_real: bool = True, log_dir: Path | None = None) -> Iterator[str]:
    """A Toxiproxy API base URL for the duration of the block.

    ``TOXIPROXY_URL`` if set (nothing is started), else a ``toxiproxy-server`` on
    PATH started on a free loopback port, else this module's :class:`ToxiproxyServer`
    in a thread. ``prefer_real=False`` always uses the built-in server.
    """
    external = os.environ.get("TOXIPROXY_URL") if prefer_real else None
    binary = shutil.which("toxiproxy-server") if prefer_real else None
    if external:
        yield external.rstrip("/")
    elif binary:
        with contextlib.ExitStack() as stack:
            directory = log_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="toxiproxy-")))
            with ToxiproxyProcess(directory / "toxiproxy.log", binary=binary) as proc:
                yield proc.url
    else:
        with ToxiproxyServer() as server:
            yield server.url


def toxiproxy_client(url: str) -> Any:
    """A ``toxiproxy.Toxiproxy`` pointed at ``url``.

    toxiproxy-python keeps its server address in class attributes, so this
    re-points every client in the process.
    """
    from toxiproxy import Toxiproxy  # type: ignore[import-untyped]

    parts = urllib.parse.urlsplit(url)
    client = Toxiproxy()
    client.update_api_consumer(parts.hostname or "127.0.0.1", parts.port or 8474)
    return client


def is_builtin(url: str, timeout_s: float = 2.0) -> bool:
    """True if ``url`` is this module's server (which holds blackholed data instead of dropping it)."""
    try:
        with urllib.request.urlopen(f"{url}/version", timeout=timeout_s) as resp:
            return "scriba" in resp.read().decode(errors="replace")
    except (OSError, urllib.error.URLError, ValueError):
        return False


__all__ = [
    "FaultProxyConfig",
    "ToxiproxyProcess",
    "ToxiproxyServer",
    "is_builtin",
    "toxiproxy_client",
    "toxiproxy_url",
]
