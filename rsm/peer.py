"""The replica service over TCP (``wire``): a server per replica, a multiplexed client.

:class:`ReplicaServer` answers requests concurrently (each in its own task, bounded
by ``connections_max`` connections); a handler's :class:`ScribaError` becomes an
error response of the same type. :class:`PeerClient` keeps one connection per
address, matches responses to requests by id, and turns a lost connection into
``UnavailableError`` for every request waiting on it (for a proposal: outcome
unknown to the caller; a session retry is safe).

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
from typing import Any

from scriba.config import parse_host_port
from scriba.errors import (
    BadRequestError,
    ConfigError,
    InternalError,
    ScribaError,
    UnauthorizedError,
    UnavailableError,
)
from scriba.log import get_logger
from scriba.rsm import wire
from scriba.tls import LoadedTls, Role, refusal

HANDSHAKE_TIMEOUT_S = 5.0

log = get_logger(__name__)

Handler = Callable[[wire.Op, int, bytes], Awaitable[bytes]]


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    header = await reader.readexactly(wire.LENGTH.size)
    (length,) = wire.LENGTH.unpack(header)
    if length > wire.FRAME_BYTES_MAX:
        raise BadRequestError(f"frame of {length} bytes exceeds {wire.FRAME_BYTES_MAX}")
    return await reader.readexactly(length)


class ReplicaServer:
    def __init__(self, address: str, handler: Handler, connections_max: int, tls: LoadedTls | None = None) -> None:
        self.host, self.port = parse_host_port(address)
        self._handler = handler
        self._tls = tls
        self._connections_max = connections_max
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        try:
            ssl = self._tls.server_ssl_context() if self._tls is not None else None
            self._server = await asyncio.start_server(
                self._serve, self.host, self.port, ssl=ssl,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if ssl is not None else None)
        except OSError as exc:
            raise ConfigError(f"rsm replica address {self.host}:{self.port}: cannot listen ({exc.strerror})") from None

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= self._connections_max:
            writer.close()
            return
        self._connections.add(task)
        inflight: set[asyncio.Task[None]] = set()
        refusal = self._refusal(writer)
        try:
            while True:
                payload = await _read_frame(reader)
                request_id, op, flags, body = wire.parse_request(payload)
                if refusal is not None:
                    writer.write(wire.error(request_id, refusal))
                    continue
                handling = asyncio.get_running_loop().create_task(self._answer(writer, request_id, op, flags, body))
                inflight.add(handling)
                handling.add_done_callback(inflight.discard)
        except (asyncio.IncompleteReadError, ConnectionError, BadRequestError):
            pass
        finally:
            for handling in inflight:
                handling.cancel()
            self._connections.discard(task)
            writer.close()

    def _refusal(self, writer: asyncio.StreamWriter) -> UnauthorizedError | None:
        refused = refusal(self._tls, writer.get_extra_info("peercert"), tuple(Role))
        if refused is not None:
            log.warning("rsm_peer_refused", reason=str(refused))
        return refused

    async def _answer(self, writer: asyncio.StreamWriter, request_id: int, op: wire.Op, flags: int,
                      body: bytes) -> None:
        try:
            out = wire.ok(request_id, await self._handler(op, flags, body))
        except ScribaError as exc:
            out = wire.error(request_id, exc)
        except Exception as exc:  # a bug: answer it rather than leave the caller hanging
            log.exception("rsm_request_failed", op=op.name)
            out = wire.error(request_id, InternalError(f"{type(exc).__name__}: {exc}"))
        with contextlib.suppress(ConnectionError):
            writer.write(out)


class PeerClient:
    """One connection to a replica; ``call`` sends a request and waits for its answer."""

    def __init__(self, address: str, tls: LoadedTls | None = None) -> None:
        self.address = address
        self._ssl = tls.client_ssl_context() if tls is not None else None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[bool, bytes]]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def _connect(self) -> asyncio.StreamWriter:
        async with self._lock:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            host, port = parse_host_port(self.address)
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(
                    host, port, ssl=self._ssl, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if self._ssl else None), 5.0)
            except (OSError, TimeoutError) as exc:
                tls = "TLS " if self._ssl is not None else ""
                raise UnavailableError(f"rsm replica {self.address} unreachable over {tls}TCP: {exc!r}") from None
            self._writer = writer
            self._reader_task = asyncio.get_running_loop().create_task(self._read(reader, writer))
            return writer

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request_id, ok, body = wire.parse_response(await _read_frame(reader))
                future = self._pending.pop(request_id, None)
                if future is not None and not future.done():
                    future.set_result((ok, body))
        except (asyncio.IncompleteReadError, ConnectionError, BadRequestError, OSError):
            pass
        finally:
            writer.close()
            if self._writer is writer:
                self._writer = None
            for future in list(self._pending.values()):
                if not future.done():
                    future.set_exception(UnavailableError(f"rsm replica {self.address}: connection lost"))
            self._pending.clear()

    async def call(self, op: wire.Op, body: bytes, timeout_s: float, flags: int = 0) -> bytes:
        writer = await self._connect()
        request_id = next(self._ids)
        future: asyncio.Future[tuple[bool, bytes]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            writer.write(wire.request(request_id, op, body, flags))
            async with asyncio.timeout(timeout_s):
                ok, answer = await future
        except TimeoutError:
            from scriba.errors import DeadlineExceededError

            raise DeadlineExceededError(f"rsm replica {self.address}: no answer to {op.name} within {timeout_s} s") from None
        finally:
            self._pending.pop(request_id, None)
        if not ok:
            raise wire.error_from(answer)
        return answer

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task


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
