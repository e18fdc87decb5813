"""A TCP fault proxy that speaks the Toxiproxy HTTP API.

The unmodified ``toxiproxy-python`` client (and anything else written for
Toxiproxy's API) drives it: proxies are created with ``POST /proxies``, toxics
are added per stream direction with ``POST /proxies/{name}/toxics`` and take
effect on live connections at once. No real Toxiproxy server can be installed
on the build machines; when one is present (``toxiproxy-server`` on PATH or
``TOXIPROXY_URL`` set), :func:`toxiproxy_url` hands that out instead.

States: a proxy is *enabled* (listening, forwarding) or *disabled* (listener
closed, every connection dropped). Each accepted connection has two links:
``upstream`` (client -> server) and ``downstream`` (server -> client). A link is
a reader task (socket -> bounded chunk queue) and a writer task (queue -> toxics
-> socket). The writer passes each chunk through the link's toxics in a fixed
order: hold (``timeout``, a triggered ``reset_peer``) -> ``latency`` ->
``limit_data`` -> ``slicer`` -> ``bandwidth`` -> write; ``slow_close`` delays the
half-close that follows EOF.

Toxics (Toxiproxy's names and units; ``toxicity`` is rolled once per link when
the toxic reaches it):
- ``latency {latency, jitter}`` ms, per chunk, measured from its arrival, order kept;
- ``bandwidth {rate}`` KB/s (1 KB = 1000 bytes);
- ``slow_close {delay}`` ms before the EOF is passed on;
- ``timeout {timeout}`` ms: no data passes; 0 holds data until the toxic is
  removed (a blackhole; held data is then delivered, as TCP would after a
  partition heals — real Toxiproxy drops it instead), > 0 also closes the
  connection that long after the toxic reached it;
- ``reset_peer {timeout}`` ms: the first chunk after the toxic arrived is
  swallowed and, ``timeout`` later, both sockets are reset (``SO_LINGER`` 0);
- ``slicer {average_size, size_variation, delay}`` bytes, bytes, microseconds;
- ``limit_data {bytes}``: the connection closes once that many bytes have passed.

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
import ipaddress
import json
import os
import random
import shutil
import socket
import struct
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from scriba.config import parse_host_port, require
from scriba.embedded.fault_proxy import ToxiproxyProcess
from scriba.errors import ConfigError, ScribaError
from scriba.invariant import invariant
from scriba.log import get_logger

log = get_logger(__name__)

VERSION = "2.9.0-scriba"
STREAMS = ("upstream", "downstream")
CONNECTIONS_PER_PROXY_MAX = 256
ATTRIBUTE_MAX = 3_600_000_000  # one hour in microseconds: an upper bound for every attribute
TOXIC_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "latency": ("latency", "jitter"),
    "bandwidth": ("rate",),
    "slow_close": ("delay",),
    "timeout": ("timeout",),
    "reset_peer": ("timeout",),
    "slicer": ("average_size", "size_variation", "delay"),
    "limit_data": ("bytes",),
}


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


class ApiError(ScribaError):
    """An API request the proxy refuses; ``code`` is the HTTP status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# --- API state ------------------------------------------------------------------------------


@dataclass(slots=True)
class Toxic:
    """One toxic as the API shows it. ``uid`` changes on every update (links re-arm it)."""

    name: str
    type: str
    stream: str
    toxicity: float
    attributes: dict[str, int]
    uid: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
        }


def parse_toxic(body: Any, uid: int, existing: Toxic | None = None) -> Toxic:
    """Validate a toxic body (create, or update of ``existing``); ApiError(400) on bad input."""
    if not isinstance(body, dict):
        raise ApiError(400, "toxic body must be a JSON object")
    base = existing.to_json() if existing is not None else {"stream": "downstream", "toxicity": 1.0}
    kind = body.get("type", base.get("type"))
    if kind not in TOXIC_ATTRIBUTES:
        raise ApiError(400, f"invalid toxic type {kind!r}: one of {sorted(TOXIC_ATTRIBUTES)}")
    stream = body.get("stream", base["stream"])
    if stream not in STREAMS:
        raise ApiError(400, f"invalid stream {stream!r}: upstream or downstream")
    toxicity = body.get("toxicity", base["toxicity"])
    if not isinstance(toxicity, int | float) or isinstance(toxicity, bool) or not 0.0 <= toxicity <= 1.0:
        raise ApiError(400, f"toxicity {toxicity!r} must be a number in [0, 1]")
    name = body.get("name") or (existing.name if existing else f"{kind}_{stream}")
    if not isinstance(name, str) or "/" in name or len(name) > 200:
        raise ApiError(400, f"invalid toxic name {name!r}")
    attributes = dict(existing.attributes) if existing is not None else dict.fromkeys(TOXIC_ATTRIBUTES[kind], 0)
    given = body.get("attributes") or {}
    if not isinstance(given, dict):
        raise ApiError(400, "attributes must be a JSON object")
    for key, value in given.items():
        if key not in TOXIC_ATTRIBUTES[kind]:
            raise ApiError(400, f"{kind} has no attribute {key!r}: {list(TOXIC_ATTRIBUTES[kind])}")
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= ATTRIBUTE_MAX:
            raise ApiError(400, f"{kind}.{key}={value!r}: expected an integer in [0, {ATTRIBUTE_MAX}]")
        attributes[key] = value
    if kind == "slicer":
        if attributes["average_size"] < 1:
            raise ApiError(400, "slicer.average_size must be >= 1")
        if attributes["size_variation"] >= attributes["average_size"]:
            raise ApiError(400, "slicer.size_variation must be < average_size")
    return Toxic(name, kind, stream, float(toxicity), attributes, uid)


# --- data path ------------------------------------------------------------------------------


@dataclass(slots=True)
class _LinkToxic:
    toxic: Toxic
    enabled: bool
    passed_bytes: int = 0
    triggered: bool = False
    timer: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


@dataclass(slots=True)
class _Chunk:
    data: bytes
    arrived: float


class _Link:
    """One direction of one connection: src socket -> toxics -> dst socket."""

    def __init__(
        self, conn: _Conn, direction: str, src: asyncio.StreamReader, dst: asyncio.StreamWriter
    ) -> None:
        self.conn = conn
        self.direction = direction
        self.src = src
        self.dst = dst
        self.queue: asyncio.Queue[_Chunk | None] = asyncio.Queue(conn.config.chunks_buffered_max)
        self.toxics: dict[int, _LinkToxic] = {}
        self.changed = asyncio.Event()
        self.release_at = 0.0  # latency keeps chunk order: never release before the previous one

    def set_toxics(self, toxics: list[Toxic]) -> None:
        """Apply the proxy's current toxics for this direction (new ones roll toxicity)."""
        current: dict[int, _LinkToxic] = {}
        for toxic in toxics:
            state = self.toxics.get(toxic.uid)
            if state is None:
                state = _LinkToxic(toxic, enabled=self.conn.rng.random() < toxic.toxicity)
                self._arm(state)
            current[toxic.uid] = state
        for uid, state in self.toxics.items():
            if uid not in current:
                state.cancel()
        self.toxics = current
        self.changed.set()

    def cancel_timers(self) -> None:
        for state in self.toxics.values():
            state.cancel()

    def _arm(self, state: _LinkToxic) -> None:
        toxic = state.toxic
        if state.enabled and toxic.type == "timeout" and toxic.attributes["timeout"] > 0:
            loop = asyncio.get_running_loop()
            state.timer = loop.call_later(toxic.attributes["timeout"] / 1000, self.conn.shutdown)

    def _active(self, kind: str) -> list[_LinkToxic]:
        return [s for s in self.toxics.values() if s.enabled and s.toxic.type == kind]

    def _holding(self) -> bool:
        if self._active("timeout"):
            return True
        return any(s.triggered for s in self._active("reset_peer"))

    async def _wait_while_holding(self) -> None:
        while self._holding():
            self.changed.clear()
            await self.changed.wait()

    async def pump_in(self) -> None:
        """Socket -> queue. The queue is bounded, so a held link stops reading."""
        try:
            while True:
                data = await self.src.read(self.conn.config.chunk_bytes)
                if not data:
                    break
                await self.queue.put(_Chunk(data, asyncio.get_running_loop().time()))
        except (ConnectionError, OSError):
            pass
        await self.queue.put(None)

    async def pump_out(self) -> None:
        """Queue -> toxics -> socket; EOF becomes a (possibly slow) half-close."""
        try:
            while True:
                chunk = await self.queue.get()
                if chunk is None:
                    await self._wait_while_holding()
                    delay_ms = max((s.toxic.attributes["delay"] for s in self._active("slow_close")), default=0)
                    if delay_ms:
                        await asyncio.sleep(delay_ms / 1000)
                    if self.dst.can_write_eof():
                        self.dst.write_eof()
                    return
                if not await self._deliver(chunk):
                    return
        except (ConnectionError, OSError):
            self.conn.shutdown()

    async def _deliver(self, chunk: _Chunk) -> bool:
        """Pass one chunk through the toxics; False once the connection is ending."""
        loop = asyncio.get_running_loop()
        await self._wait_while_holding()
        resets = self._active("reset_peer")
        if resets:  # none is triggered yet (else we would be holding)
            resets[0].triggered = True
            resets[0].timer = loop.call_later(resets[0].toxic.attributes["timeout"] / 1000, self.conn.reset)
            await self._wait_while_holding()
            return True  # the chunk that triggered the reset is swallowed, as Toxiproxy does
        delay_s = 0.0
        for state in self._active("latency"):
            jitter = state.toxic.attributes["jitter"]
            delay_s += (state.toxic.attributes["latency"] + self.conn.rng.uniform(-jitter, jitter)) / 1000
        self.release_at = max(chunk.arrived + max(delay_s, 0.0), self.release_at)
        if self.release_at > loop.time():
            await asyncio.sleep(self.release_at - loop.time())
        await self._wait_while_holding()
        data, close_after = self._limit(chunk.data)
        for piece, pause_s in self._slices(data):
            await self._write_paced(piece)
            if pause_s:
                await asyncio.sleep(pause_s)
        if close_after:
            self.conn.shutdown()
            return False
        return True

    def _limit(self, data: bytes) -> tuple[bytes, bool]:
        close_after = False
        for state in self._active("limit_data"):
            remaining = max(state.toxic.attributes["bytes"] - state.passed_bytes, 0)
            if len(data) >= remaining:
                data = data[:remaining]
                close_after = True
        for state in self._active("limit_data"):
            state.passed_bytes += len(data)
        return data, close_after

    def _slices(self, data: bytes) -> list[tuple[bytes, float]]:
        """(piece, seconds to sleep after it): the slicer's cut, else the chunk whole."""
        slicers = self._active("slicer")
        if not slicers:
            return [(data, 0.0)] if data else []
        attrs = slicers[0].toxic.attributes
        pieces: list[tuple[bytes, float]] = []
        offset = 0
        while offset < len(data):
            variation = attrs["size_variation"]
            size = max(1, attrs["average_size"] + self.conn.rng.randint(-variation, variation))
            pieces.append((data[offset : offset + size], attrs["delay"] / 1_000_000))
            offset += size
        return pieces

    async def _write_paced(self, piece: bytes) -> None:
        """Write one piece, paced by the slowest bandwidth toxic (100 ms worth per write)."""
        rates = [s.toxic.attributes["rate"] for s in self._active("bandwidth")]
        rate = min((r for r in rates if r > 0), default=0)
        if rate == 0:
            self.dst.write(piece)
            await self.dst.drain()
            return
        step = rate * 100
        for offset in range(0, len(piece), step):
            part = piece[offset : offset + step]
            await asyncio.sleep(len(part) / (rate * 1000))
            self.dst.write(part)
            await self.dst.drain()


class _Conn:
    """One accepted client connection and its upstream connection."""

    def __init__(self, proxy: _Proxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.config = proxy.config
        self.rng = proxy.rng
        self.client_reader = reader
        self.client_writer = writer
        self.upstream_writer: asyncio.StreamWriter | None = None
        self.links: list[_Link] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.closed = False

    async def run(self) -> None:
        self.proxy.conns.add(self)
        try:
            host, port = parse_host_port(self.proxy.upstream)
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port), self.config.upstream_connect_timeout_s
                )
            except (TimeoutError, OSError):
                return
            self.upstream_writer = up_writer
            if self.closed:
                return
            self.links = [
                _Link(self, "upstream", self.client_reader, up_writer),
                _Link(self, "downstream", up_reader, self.client_writer),
            ]
            for link in self.links:
                link.set_toxics(self.proxy.toxics_for(link.direction))
            for link in self.links:
                self.tasks.append(asyncio.create_task(link.pump_in()))
                self.tasks.append(asyncio.create_task(link.pump_out()))
            await asyncio.gather(*self.tasks, return_exceptions=True)
        except Exception as exc:  # a handler must not leak exceptions into the server loop
            log.warning("proxy_connection_failed", proxy=self.proxy.name, error=repr(exc))
        finally:
            self.shutdown()
            self.proxy.conns.discard(self)

    def toxics_changed(self) -> None:
        for link in self.links:
            link.set_toxics(self.proxy.toxics_for(link.direction))

    def reset(self) -> None:
        """Reset both sockets (RST: SO_LINGER on, 0 s) and end the connection."""
        for writer in self._writers():
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.shutdown(abort=True)

    def shutdown(self, abort: bool = False) -> None:
        """End the connection: close both sockets (flushing unless ``abort``), stop the tasks."""
        if self.closed and not abort:
            return
        self.closed = True
        for link in self.links:
            link.cancel_timers()
        for writer in self._writers():
            if abort:
                writer.transport.abort()
            else:
                writer.close()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()

    def _writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client_writer, self.upstream_writer) if w is not None]


class _Proxy:
    def __init__(self, name: str, listen: str, upstream: str, config: FaultProxyConfig, rng: random.Random) -> None:
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.config = config
        self.rng = rng
        self.enabled = False
        self.toxics: list[Toxic] = []
        self.conns: set[_Conn] = set()
        self.handlers: set[asyncio.Task[Any]] = set()
        self.server: asyncio.Server | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": [t.to_json() for t in self.toxics],
        }

    def toxics_for(self, direction: str) -> list[Toxic]:
        return [t for t in self.toxics if t.stream == direction]

    def toxics_changed(self) -> None:
        for conn in list(self.conns):
            conn.toxics_changed()

    async def enable(self) -> None:
        if self.enabled:
            return
        host, port = parse_host_port(self.listen)
        try:
            self.server = await asyncio.start_server(self._accept, host, port, limit=self.config.chunk_bytes)
        except OSError as exc:
            raise ApiError(500, f"proxy {self.name}: cannot listen on {self.listen}: {exc}") from None
        bound = self.server.sockets[0].getsockname()
        self.listen = f"{host}:{bound[1]}"
        self.enabled = True
        log.info("proxy_enabled", proxy=self.name, listen=self.listen, upstream=self.upstream)

    async def disable(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for conn in list(self.conns):
            conn.shutdown(abort=True)
        self.enabled = False
        log.info("proxy_disabled", proxy=self.name)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.enabled or len(self.conns) >= self.config.connections_per_proxy_max:
            writer.transport.abort()
            return
        with contextlib.suppress(OSError):
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await _run_handler(self.handlers, _Conn(self, reader, writer).run())


async def _run_handler(handlers: set[asyncio.Task[Any]], work: Coroutine[Any, Any, None]) -> None:
    """Run a connection handler, tracked so shutdown can wait for it to end.

    Cancellation ends the handler quietly: on Python 3.11 asyncio's stream callback
    would otherwise report a cancelled handler task as an unhandled exception.
    """
    task = asyncio.current_task()
    if task is not None:
        handlers.add(task)
    try:
        await work
    except asyncio.CancelledError:
        pass
    finally:
        if task is not None:
            handlers.discard(task)


# --- HTTP API -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Request:
    method: str
    path: tuple[str, ...]
    body: Any
    keep_alive: bool


_REASONS = {200: "OK", 201: "Created", 204: "No Content", 400: "Bad Request", 404: "Not Found",
            405: "Method Not Allowed", 409: "Conflict", 413: "Payload Too Large", 500: "Internal Server Error"}


def _response(status: int, payload: Any, keep_alive: bool) -> bytes:
    body = b"" if payload is None else json.dumps(payload).encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode() + body


async def _read_request(reader: asyncio.StreamReader, body_max: int) -> _Request | None:
    line = await reader.readline()
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ApiError(400, "malformed request line")
    method, target, version = parts
    headers: dict[str, str] = {}
    for _ in range(100):
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        key, _, value = raw.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()
    else:
        raise ApiError(400, "too many headers")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise ApiError(400, "chunked bodies are not supported; send Content-Length")
    length = int(headers.get("content-length", "0") or 0)
    if length < 0 or length > body_max:
        raise ApiError(413, f"body of {length} bytes exceeds {body_max}")
    raw_body = await reader.readexactly(length) if length else b""
    try:
        body = json.loads(raw_body) if raw_body.strip() else None
    except ValueError:
        raise ApiError(400, "body is not valid JSON") from None
    path = urllib.parse.urlsplit(target).path
    segments = tuple(urllib.parse.unquote(s) for s in path.strip("/").split("/") if s)
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    return _Request(method.upper(), segments, body, keep_alive)


@dataclass(slots=True)
class _State:
    config: FaultProxyConfig
    rng: random.Random
    proxies: dict[str, _Proxy] = field(default_factory=dict)
    next_uid: int = 1

    def uid(self) -> int:
        self.next_uid += 1
        return self.next_uid


class _Api:
    """Routes of the Toxiproxy HTTP API over :class:`_State`; runs on the server's loop."""

    def __init__(self, state: _State) -> None:
        self.state = state

    async def handle(self, req: _Request) -> tuple[int, Any]:
        p, m = req.path, req.method
        if p == ("version",) and m == "GET":
            return 200, {"version": VERSION}
        if p == ("reset",) and m == "POST":
            await self.reset()
            return 204, None
        if p == ("proxies",):
            if m == "GET":
                return 200, {n: px.to_json() for n, px in self.state.proxies.items()}
            if m == "POST":
                return 201, (await self.create_proxy(req.body)).to_json()
        if p == ("populate",) and m == "POST":
            return 201, {"proxies": await self.populate(req.body)}
        if len(p) >= 2 and p[0] == "proxies":
            return await self._proxy_routes(self._proxy(p[1]), p[2:], m, req.body)
        if p and p[0] in ("version", "reset", "proxies", "populate"):
            raise ApiError(405, f"{m} not allowed on /{'/'.join(p)}")
        raise ApiError(404, f"no route /{'/'.join(p)}")

    async def _proxy_routes(self, proxy: _Proxy, rest: tuple[str, ...], m: str, body: Any) -> tuple[int, Any]:
        if rest == ():
            if m == "GET":
                return 200, proxy.to_json()
            if m in ("POST", "PATCH"):
                return 200, (await self.update_proxy(proxy, body)).to_json()
            if m == "DELETE":
                await proxy.disable()
                del self.state.proxies[proxy.name]
                return 204, None
        elif rest == ("toxics",):
            if m == "GET":
                return 200, [t.to_json() for t in proxy.toxics]
            if m == "POST":
                return 200, self.add_toxic(proxy, body).to_json()
        elif len(rest) == 2 and rest[0] == "toxics":
            index = self._toxic_index(proxy, rest[1])
            if m == "GET":
                return 200, proxy.toxics[index].to_json()
            if m in ("POST", "PATCH"):
                old = proxy.toxics[index]
                new = parse_toxic({**(body or {}), "name": old.name, "type": old.type}, self.state.uid(), old)
                proxy.toxics[index] = new
                proxy.toxics_changed()
                return 200, new.to_json()
            if m == "DELETE":
                del proxy.toxics[index]
                proxy.toxics_changed()
                log.info("toxic_removed", proxy=proxy.name, toxic=rest[1])
                return 204, None
        else:
            raise ApiError(404, f"no route under /proxies/{proxy.name}")
        raise ApiError(405, f"{m} not allowed here")

    def _proxy(self, name: str) -> _Proxy:
        proxy = self.state.proxies.get(name)
        if proxy is None:
            raise ApiError(404, f"proxy not found: {name}")
        return proxy

    @staticmethod
    def _toxic_index(proxy: _Proxy, name: str) -> int:
        for i, toxic in enumerate(proxy.toxics):
            if toxic.name == name:
                return i
        raise ApiError(404, f"toxic not found: {name}")

    def _check_address(self, text: Any, what: str, listen: bool) -> str:
        if not isinstance(text, str):
            raise ApiError(400, f"{what} must be a HOST:PORT string")
        try:
            host, port = parse_host_port(text)
        except ConfigError as exc:
            raise ApiError(400, f"{what}: {exc}") from None
        if listen and self.state.config.loopback_only and not _is_loopback(host):
            raise ApiError(400, f"{what} {text!r}: this proxy listens on loopback addresses only")
        if not listen and port == 0:
            raise ApiError(400, f"{what} {text!r}: port 0")
        return text

    async def create_proxy(self, body: Any) -> _Proxy:
        if not isinstance(body, dict) or not isinstance(body.get("name"), str) or not body["name"]:
            raise ApiError(400, "proxy needs a name")
        name = body["name"]
        if "/" in name or len(name) > 200:
            raise ApiError(400, f"invalid proxy name {name!r}")
        if name in self.state.proxies:
            raise ApiError(409, f"proxy already exists: {name}")
        if len(self.state.proxies) >= self.state.config.proxies_max:
            raise ApiError(400, f"at most {self.state.config.proxies_max} proxies")
        upstream = self._check_address(body.get("upstream"), "upstream", listen=False)
        listen = self._check_address(body.get("listen", "127.0.0.1:0"), "listen", listen=True)
        proxy = _Proxy(name, listen, upstream, self.state.config, self.state.rng)
        if body.get("enabled", True):
            await proxy.enable()
        self.state.proxies[name] = proxy
        return proxy

    async def update_proxy(self, proxy: _Proxy, body: Any) -> _Proxy:
        if not isinstance(body, dict):
            raise ApiError(400, "proxy update must be a JSON object")
        relisten = False
        if "upstream" in body:
            proxy.upstream = self._check_address(body["upstream"], "upstream", listen=False)
        if "listen" in body and body["listen"] != proxy.listen:
            proxy.listen = self._check_address(body["listen"], "listen", listen=True)
            relisten = True
        enabled = body.get("enabled", proxy.enabled)
        if not isinstance(enabled, bool):
            raise ApiError(400, "enabled must be true or false")
        if not enabled or relisten:
            await proxy.disable()
        if enabled:
            await proxy.enable()
        return proxy

    def add_toxic(self, proxy: _Proxy, body: Any) -> Toxic:
        toxic = parse_toxic(body, self.state.uid())
        if any(t.name == toxic.name for t in proxy.toxics):
            raise ApiError(409, f"toxic already exists: {toxic.name}")
        if len(proxy.toxics) >= self.state.config.toxics_per_proxy_max:
            raise ApiError(400, f"at most {self.state.config.toxics_per_proxy_max} toxics per proxy")
        proxy.toxics.append(toxic)
        proxy.toxics_changed()
        log.info("toxic_added", proxy=proxy.name, toxic=toxic.name, type=toxic.type, stream=toxic.stream)
        return toxic

    async def populate(self, body: Any) -> list[dict[str, Any]]:
        if not isinstance(body, list):
            raise ApiError(400, "populate takes a JSON list of proxies")
        out = []
        for item in body:
            if isinstance(item, dict) and item.get("name") in self.state.proxies:
                old = self.state.proxies.pop(item["name"])
                await old.disable()
            out.append((await self.create_proxy(item)).to_json())
        return out

    async def reset(self) -> None:
        for proxy in self.state.proxies.values():
            proxy.toxics.clear()
            proxy.toxics_changed()
            await proxy.enable()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- the server -----------------------------------------------------------------------------


class ToxiproxyServer:
    """The Toxiproxy-API-compatible proxy server, in a background thread or in a caller's loop."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, config: FaultProxyConfig | None = None) -> None:
        self.config = config or FaultProxyConfig()
        self.config.validate()
        invariant(not self.config.loopback_only or _is_loopback(host), f"API host {host} is not loopback")
        self.host = host
        self.port = port
        self._state = _State(self.config, random.Random(self.config.seed))
        self._api = _Api(self._state)
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
            await _run_handler(self._handlers, self._serve_requests(reader, writer))
        except (TimeoutError, ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._api_conns.discard(writer)
            writer.close()

    async def _serve_requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        timeout_s = self.config.api_request_timeout_s
        while True:
            try:
                req = await asyncio.wait_for(_read_request(reader, self.config.api_body_bytes_max), timeout_s)
            except ApiError as exc:
                writer.write(_response(exc.code, {"error": str(exc), "status": exc.code}, False))
                await writer.drain()
                return
            except ValueError:  # a line longer than the reader's limit
                writer.write(_response(400, {"error": "request line or header too long", "status": 400}, False))
                await writer.drain()
                return
            if req is None:
                return
            try:
                status, payload = await self._api.handle(req)
            except ApiError as exc:
                status, payload = exc.code, {"error": str(exc), "status": exc.code}
            writer.write(_response(status, payload, req.keep_alive))
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
