"""The listening side of :mod:`scriba.tls_socket`: :func:`start_server` listens, and every
accepted connection shakes hands (within ``handshake_timeout_s``) before its protocol
sees it, as ``loop.create_server(..., ssl=...)`` does. A handshake that fails is logged
(``tls_handshake_failed``) and refused without a reset (:func:`_refuse`); the server goes
on. Each connection then runs on a :class:`scriba.tls_socket.TlsSocketTransport`.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from typing import Any, Final

from scriba.log import get_logger
from scriba.tls_read_ahead import enable_read_ahead
from scriba.tls_socket import (
    HANDSHAKE_TIMEOUT_S,
    TlsSocketTransport,
    address,
    handshake,
    until_ready,
)

log = get_logger(__name__)

__all__ = ["TlsServer", "start_server"]

ACCEPTS_PER_CALL: Final = 64
REFUSE_LINGER_S: Final = 1.0  # after a failed handshake: how long its bytes are drained
REFUSE_DRAIN_BYTES: Final = 1024 * 1024


class TlsServer:
    """Listening sockets whose accepted connections shake hands before their protocol starts."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sockets: list[socket.socket],
                 protocol_factory: Callable[[], asyncio.BaseProtocol], context: ssl.SSLContext,
                 handshake_timeout_s: float) -> None:
        self._loop = loop
        self.sockets = sockets
        self._factory = protocol_factory
        self._context = context
        enable_read_ahead(context)
        self._handshake_timeout_s = handshake_timeout_s
        self._handshakes: set[asyncio.Task[None]] = set()
        self._closed = False
        for lsock in sockets:
            loop.add_reader(lsock.fileno(), self._accept_ready, lsock)

    def _accept_ready(self, lsock: socket.socket) -> None:
        for _ in range(ACCEPTS_PER_CALL):
            try:
                raw, _address = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: logged, the listener stays
                log.warning("tls_accept_failed", error=repr(exc))
                return
            raw.setblocking(False)
            task = self._loop.create_task(self._serve(raw), name="tls-handshake")
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _serve(self, raw: socket.socket) -> None:
        peer = address(raw.getpeername)
        if raw.family in (socket.AF_INET, socket.AF_INET6):
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock = self._context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError) as exc:
            raw.close()
            log.info("tls_handshake_failed", peer=str(peer), error=repr(exc))
            return
        try:
            async with asyncio.timeout(self._handshake_timeout_s):
                await handshake(self._loop, sock)
        except TimeoutError as exc:
            sock.close()
            log.info("tls_handshake_failed", peer=str(peer), error=repr(exc))
            return
        except OSError as exc:
            log.info("tls_handshake_failed", peer=str(peer), error=repr(exc))
            await _refuse(self._loop, sock)
            return
        except BaseException:
            sock.close()
            raise
        if self._closed:
            sock.close()
            return
        try:
            protocol = self._factory()
        except Exception as exc:  # the server's bug: this connection ends, the listener stays
            sock.close()
            log.exception("tls_protocol_factory_failed", peer=str(peer), error=repr(exc))
            return
        TlsSocketTransport(self._loop, sock, protocol, self._context)

    def close(self) -> None:
        """Stop listening and drop handshakes under way (connections already made stay)."""
        if self._closed:
            return
        self._closed = True
        for lsock in self.sockets:
            self._loop.remove_reader(lsock.fileno())
            lsock.close()
        for task in list(self._handshakes):
            task.cancel()

    async def wait_closed(self) -> None:
        if self._handshakes:
            await asyncio.gather(*self._handshakes, return_exceptions=True)


async def start_server(protocol_factory: Callable[[], asyncio.BaseProtocol], host: str, port: int, *,
                       ssl_context: ssl.SSLContext, handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
                       backlog: int = 128) -> TlsServer:
    """Listen on every address of ``host`` at ``port`` (0: one free port, the same on each)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, type_, proto, _, address in _unique(infos):
            lsock = socket.socket(family, type_, proto)
            sockets.append(lsock)
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                lsock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            lsock.bind(address)
            lsock.listen(backlog)
            lsock.setblocking(False)
    except BaseException:
        for lsock in sockets:
            lsock.close()
        raise
    return TlsServer(loop, sockets, protocol_factory, ssl_context, handshake_timeout_s)


def _unique(infos: list[Any]) -> list[Any]:
    seen: set[Any] = set()
    out = []
    for info in infos:
        if info[4] not in seen:
            seen.add(info[4])
            out.append(info)
    return out


async def _refuse(loop: asyncio.AbstractEventLoop, sock: ssl.SSLSocket) -> None:
    """Close a connection whose handshake failed without resetting it: OpenSSL's alert and
    a FIN go out, and what the client sent meanwhile is read and dropped (closing with
    unread bytes would send a reset, which can destroy the alert before the client reads
    it), for at most ``REFUSE_LINGER_S`` and ``REFUSE_DRAIN_BYTES``."""
    try:
        sock.shutdown(socket.SHUT_WR)  # also drops the TLS layer: recv reads the socket itself
        drained = 0
        async with asyncio.timeout(REFUSE_LINGER_S):
            while drained < REFUSE_DRAIN_BYTES:
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    await until_ready(loop, sock.fileno(), readable=True)
                    continue
                if not data:
                    break
                drained += len(data)
    except (OSError, TimeoutError):
        pass
    finally:
        sock.close()
