"""Dialing and listening for Scriba's own binary protocols (the data path, the RSM peers):
plain TCP without an ``ssl.SSLContext``; with one, TLS on ``scriba.tls_socket``, or on
asyncio's ``sslproto`` when ``SCRIBA_TLS_TRANSPORT=asyncio`` (``use_tls_socket``).

Callers name what they need (a context or None, a handshake deadline) and never pick
the TLS transport themselves, so the choice and its fallback live here once.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any, TypeVar

from scriba import tls_server, tls_socket
from scriba.tls_server import TlsServer
from scriba.tls_socket import HANDSHAKE_TIMEOUT_S, use_tls_socket

__all__ = ["Listener", "dial", "listen"]

P = TypeVar("P", bound=asyncio.BaseProtocol)
Listener = asyncio.Server | TlsServer


async def dial(protocol_factory: Callable[[], P], host: str, port: int, *, ssl_context: ssl.SSLContext | None,
               server_hostname: str | None = None,
               handshake_timeout_s: float | None = None) -> tuple[asyncio.BaseTransport, P]:
    """Connect to ``host:port`` and start the protocol; over TLS the server's name is
    ``server_hostname`` (default ``host``) and the handshake ends within
    ``handshake_timeout_s`` (None: the caller's own deadline bounds it)."""
    loop = asyncio.get_running_loop()
    if ssl_context is None:
        return await loop.create_connection(protocol_factory, host, port)
    name = server_hostname or host
    if use_tls_socket():
        async with asyncio.timeout(handshake_timeout_s):
            return await tls_socket.open_connection(protocol_factory, host, port, ssl_context=ssl_context,
                                                    server_hostname=name)
    options: dict[str, Any] = {} if handshake_timeout_s is None else {"ssl_handshake_timeout": handshake_timeout_s}
    return await loop.create_connection(protocol_factory, host, port, ssl=ssl_context, server_hostname=name,
                                        **options)


async def listen(protocol_factory: Callable[[], asyncio.BaseProtocol], host: str, port: int, *,
                 ssl_context: ssl.SSLContext | None, handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S) -> Listener:
    """Listen on ``host:port`` (0: a free port); over TLS each accepted connection shakes
    hands within ``handshake_timeout_s`` before its protocol starts."""
    if ssl_context is not None and use_tls_socket():
        return await tls_server.start_server(protocol_factory, host, port, ssl_context=ssl_context,
                                             handshake_timeout_s=handshake_timeout_s)
    return await asyncio.get_running_loop().create_server(
        protocol_factory, host, port, ssl=ssl_context, reuse_address=True,
        ssl_handshake_timeout=handshake_timeout_s if ssl_context is not None else None)
