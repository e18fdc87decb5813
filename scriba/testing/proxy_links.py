"""The fault proxy's data path: proxies, their connections, and each connection's links.

States: a proxy is *enabled* (listening, forwarding) or *disabled* (listener
closed, every connection dropped). Each accepted connection has two links:
``upstream`` (client -> server) and ``downstream`` (server -> client). A link is
a reader task (socket -> bounded chunk queue) and a writer task (queue -> toxics
-> socket). The writer passes each chunk through the link's toxics (``toxics.py``)
in a fixed order: hold (``timeout``, a triggered ``reset_peer``) -> ``latency`` ->
``limit_data`` -> ``slicer`` -> ``bandwidth`` -> write; ``slow_close`` delays the
half-close that follows EOF. A change of a proxy's toxics reaches its live links at once.

Bounds: connections per proxy and buffered chunks per link (a held link stops reading,
so TCP pushes back on the sender), from ``FaultProxyConfig``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scriba.config import parse_host_port
from scriba.log import get_logger
from scriba.testing.toxics import ApiError, Toxic

if TYPE_CHECKING:
    from scriba.testing.faults import FaultProxyConfig

__all__ = ["Proxy", "run_handler"]

log = get_logger(__name__)


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

    def __init__(self, proxy: Proxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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


class Proxy:
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
        await run_handler(self.handlers, _Conn(self, reader, writer).run())


async def run_handler(handlers: set[asyncio.Task[Any]], work: Coroutine[Any, Any, None]) -> None:
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


