"""The replica service over TCP (``wire``): a server per replica, a multiplexed client.

:class:`ReplicaServer` serves each connection from a :class:`PeerConnection`, an
``asyncio.BufferedProtocol`` reading into the thread's one reused buffer
(``scriba.frame_read``); ``wire.FrameReader`` cuts the frames. Each request is started
at once, inside the ``data_received`` that read it (``scriba.eager``): one that need not
wait (a status, a sequential read) is answered before the next frame is read, one that
waits (a proposal waits for its append) goes on in a task of its own from that await,
so requests are answered concurrently and out of order, as before. Nothing on a
request's path may use ``asyncio.timeout`` before its first wait (there is no current
task): the replica bounds its waits with timers (``scriba.eager.within`` /
``wait_until``). A handler's :class:`ScribaError` becomes an error response of the same
type; any other exception an ``InternalError`` response (and a log line). Connections
are bounded by ``connections_max`` (one more is closed at once). A frame longer than
``wire.FRAME_BYTES_MAX`` (refused from its length, before its body is buffered) or one
that does not parse closes its connection (``rsm_peer_frame_rejected``); the server and
its other connections go on. A connection closed cancels its requests still waiting.

:class:`PeerClient` keeps one connection per address (a :class:`PeerLink` protocol of
the same kind: an answer resolves its caller's future inside the read), matches
responses to requests by id, and turns a lost connection into ``UnavailableError`` for
every request waiting on it (for a proposal: outcome unknown to the caller; a session
retry is safe). Its deadline is a timer too: a follower forwards from an eager step.

TLS (``scriba.tls``): with a ``LoadedTls`` the server speaks only TLS and the client
verifies the replica's certificate and name; with mutual TLS a peer whose certificate
is on no allow-list (any role admits it: clients, peer replicas, operators) gets every
request answered ``UnauthorizedError``, and nothing it sends reaches the handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from typing import cast

from scriba import tcp
from scriba.config import parse_host_port
from scriba.eager import start_eagerly, within
from scriba.errors import (
    BadRequestError,
    ConfigError,
    DeadlineExceededError,
    InternalError,
    ScribaError,
    UnauthorizedError,
    UnavailableError,
)
from scriba.frame_read import BufferedFrames
from scriba.log import get_logger
from scriba.rsm import wire
from scriba.tls import LoadedTls, Role, refusal

HANDSHAKE_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5.0

log = get_logger(__name__)

Handler = Callable[[wire.Op, int, bytes], Awaitable[bytes]]


class PeerConnection(BufferedFrames):
    """One connection to a :class:`ReplicaServer` (module docstring)."""

    def __init__(self, server: ReplicaServer) -> None:
        self._server = server
        self._frames = wire.FrameReader()
        self._transport: asyncio.Transport | None = None
        self._refusal: UnauthorizedError | None = None
        self._admin_refusal: UnauthorizedError | None = None
        self.inflight: set[asyncio.Task[None]] = set()
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        server = self._server
        if len(server.connections) >= server.connections_max:
            self.close()
            return
        server.connections.add(self)
        peercert = transport.get_extra_info("peercert")
        self._refusal = refusal(server.tls, peercert, tuple(Role))
        if self._refusal is not None:
            log.warning("rsm_peer_refused", reason=str(self._refusal))
        self._admin_refusal = refusal(server.tls, peercert, (Role.ADMIN,))  # operator ops (TRANSFER): admins only

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._server.connections.discard(self)
        for handling in list(self.inflight):
            handling.cancel()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            for payload in self._frames.feed(data):
                request_id, op, flags, body = wire.parse_request(payload)
                refused = self._admin_refusal if op in wire.ADMIN_OPS else self._refusal
                if refused is not None:
                    self.write(wire.error(request_id, refused))
                    continue
                self._start(request_id, op, flags, body)
                if self.closed:
                    return
        except BadRequestError as exc:  # garbage: this connection ends, the server goes on
            log.warning("rsm_peer_frame_rejected", reason=str(exc))
            self.close()

    def _start(self, request_id: int, op: wire.Op, flags: int, body: bytes) -> None:
        """Serve it now (``scriba.eager``); a request that waits goes on in a task."""
        handling = start_eagerly(self._answer(request_id, op, flags, body), name=op.name)
        if handling is not None:
            self.inflight.add(handling)
            handling.add_done_callback(self.inflight.discard)

    async def _answer(self, request_id: int, op: wire.Op, flags: int, body: bytes) -> None:
        try:
            out = wire.ok(request_id, await self._server.handler(op, flags, body))
        except ScribaError as exc:
            out = wire.error(request_id, exc)
        except Exception as exc:  # a bug: answer it rather than leave the caller hanging
            log.exception("rsm_request_failed", op=op.name)
            out = wire.error(request_id, InternalError(f"{type(exc).__name__}: {exc}"))
        self.write(out)

    def write(self, data: bytes) -> None:
        if not self.closed and self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()


class ReplicaServer:
    def __init__(self, address: str, handler: Handler, connections_max: int, tls: LoadedTls | None = None) -> None:
        self.host, self.port = parse_host_port(address)
        self.handler = handler
        self.tls = tls
        self.connections_max = connections_max
        self.connections: set[PeerConnection] = set()
        self._server: tcp.Listener | None = None

    async def start(self) -> None:
        try:
            ssl = self.tls.server_ssl_context() if self.tls is not None else None
            self._server = await tcp.listen(lambda: PeerConnection(self), self.host, self.port, ssl_context=ssl,
                                            handshake_timeout_s=HANDSHAKE_TIMEOUT_S)
        except OSError as exc:
            raise ConfigError(f"rsm replica address {self.host}:{self.port}: cannot listen ({exc.strerror})") from None

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        handling = [task for conn in list(self.connections) for task in conn.inflight]
        for conn in list(self.connections):
            conn.close()
        for task in handling:
            task.cancel()
        for task in handling:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()


class PeerLink(BufferedFrames):
    """A :class:`PeerClient`'s connection: an answer resolves its caller's future inside the
    read that brings it; the connection lost fails every request still waiting on it."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._frames = wire.FrameReader()
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, asyncio.Future[tuple[bool, bytes]]] = {}

    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            for payload in self._frames.feed(data):
                request_id, ok, body = wire.parse_response(payload)
                future = self.pending.pop(request_id, None)
                if future is not None and not future.done():
                    future.set_result((ok, body))
        except BadRequestError:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        for future in self.pending.values():
            if not future.done():
                future.set_exception(UnavailableError(f"rsm replica {self.address}: connection lost"))
        self.pending.clear()


class PeerClient:
    """One connection to a replica; ``call`` sends a request and waits for its answer."""

    def __init__(self, address: str, tls: LoadedTls | None = None) -> None:
        self.address = address
        self._ssl = tls.client_ssl_context() if tls is not None else None
        self._ids = itertools.count(1)
        self._link: PeerLink | None = None
        self._lock = asyncio.Lock()

    @property
    def waiting(self) -> int:
        """Requests sent on the current connection and not yet answered."""
        return len(self._link.pending) if self._link is not None else 0

    async def _connect(self) -> PeerLink:
        link = self._link
        if link is not None and link.usable:
            return link
        async with self._lock:
            link = self._link
            if link is not None and link.usable:
                return link
            host, port = parse_host_port(self.address)
            try:
                _, opened = await asyncio.wait_for(
                    tcp.dial(lambda: PeerLink(self.address), host, port, ssl_context=self._ssl,
                             handshake_timeout_s=HANDSHAKE_TIMEOUT_S), CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError) as exc:
                tls = "TLS " if self._ssl is not None else ""
                raise UnavailableError(f"rsm replica {self.address} unreachable over {tls}TCP: {exc!r}") from None
            self._link = opened
            return opened

    async def call(self, op: wire.Op, body: bytes, timeout_s: float, flags: int = 0) -> bytes:
        link = await self._connect()
        assert link.transport is not None
        request_id = next(self._ids)
        future: asyncio.Future[tuple[bool, bytes]] = asyncio.get_running_loop().create_future()
        link.pending[request_id] = future
        try:
            link.transport.write(wire.request(request_id, op, body, flags))
            ok, answer = await within(future, timeout_s)  # a timer: no task needed (a follower forwards eagerly)
        except TimeoutError:
            raise DeadlineExceededError(f"rsm replica {self.address}: no answer to {op.name} within {timeout_s} s") from None
        finally:
            link.pending.pop(request_id, None)
        if not ok:
            raise wire.error_from(answer)
        return answer

    async def close(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.close()


class PeerPool:
    def __init__(self, tls: LoadedTls | None = None) -> None:
        self._tls = tls
        self._clients: dict[str, PeerClient] = {}

    def get(self, address: str) -> PeerClient:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = PeerClient(address, self._tls)
        return client

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
