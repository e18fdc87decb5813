"""TLS for aiohttp servers (the console, the namenode example's WebHDFS): the site's
``ssl.SSLContext`` and a middleware that admits only allow-listed certificates.

With mutual TLS, :func:`identity_middleware` answers 403 (with the reason) to a request
whose connection's certificate is on none of ``roles``' allow-lists, before any handler
runs; without mutual TLS it lets everything through (``scriba.tls.refusal``).
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

from scriba.log import get_logger
from scriba.tls import LoadedTls, Role, refusal

log = get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def identity_middleware(tls: LoadedTls | None, roles: Iterable[Role]) -> Callable[..., Awaitable[web.StreamResponse]]:
    wanted = tuple(roles)

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        peercert = request.transport.get_extra_info("peercert") if request.transport is not None else None
        refused = refusal(tls, peercert, wanted)
        if refused is not None:
            log.warning("http_request_refused", path=request.path, reason=str(refused))
            return web.Response(status=403, text=f"forbidden: {refused}\n")
        return await handler(request)

    return check


def site_ssl(tls: LoadedTls | None) -> ssl.SSLContext | None:
    """The ``ssl_context`` of a ``web.TCPSite`` (None: plaintext)."""
    return tls.server_ssl_context() if tls is not None else None
