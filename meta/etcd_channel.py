"""The gRPC channel an ``etcd://`` / ``etcd+tls://`` URI asks for: endpoints, TLS, token credentials.

One ``grpc.aio`` channel over every endpoint of the URI (:func:`grpc_target` names them
all; pick-first: a dead member's calls move to the next; host names are resolved once,
at open, and the endpoints must share one address family). Keep-alive pings and short
reconnect back-offs notice a dead member quickly; messages may be as large as
``MESSAGE_BYTES_MAX``.

Security (URI options, ``scriba.meta.uri``): ``etcd+tls://`` dials TLS and verifies the
server's certificate and name (``ca=``; ``cert=``/``key=`` for etcd's client-certificate
authentication, where etcd takes the certificate's CN as the user); the name checked in
every member's certificate is the URI's first host. With ``user=`` the channel also
carries :class:`TokenAuth` call credentials: etcd's auth token on every call (gRPC call
credentials, so only over TLS). Logging in, and renewing a token etcd forgot, is
``scriba.meta.etcd_rpc``'s. Never a fallback to plaintext or to no authentication.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import grpc
import grpc.aio

from scriba.errors import BadRequestError, MetadataUnavailableError
from scriba.meta.uri import MetadataUri
from scriba.tls import TlsConfig

MESSAGE_BYTES_MAX: Final = 512 * 1024 * 1024

_CHANNEL_OPTIONS: Final = [
    ("grpc.lb_policy_name", "pick_first"),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 3_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
    ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
]


async def grpc_target(hosts: Sequence[tuple[str, int]]) -> str:
    """A gRPC target naming every endpoint (``ipv4:a:p,b:p`` / ``ipv6:[a]:p,...``)."""
    loop = asyncio.get_running_loop()
    v4: list[str] = []
    v6: list[str] = []
    for host, port in hosts:
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            try:
                infos = await loop.getaddrinfo(host, port, type=1)  # SOCK_STREAM
            except OSError as exc:
                raise MetadataUnavailableError(f"etcd at {host}:{port}: cannot resolve {host!r}: {exc}") from None
            addr = ipaddress.ip_address(infos[0][4][0])
        if addr.version == 4:
            v4.append(f"{addr}:{port}")
        else:
            v6.append(f"[{addr}]:{port}")
    if v4 and v6:
        raise BadRequestError("etcd endpoints mix IPv4 and IPv6 addresses; use one family")
    return "ipv4:" + ",".join(v4) if v4 else "ipv6:" + ",".join(v6)


class TokenAuth(grpc.AuthMetadataPlugin):
    """Call credentials: etcd's auth token on every call (empty until authenticated)."""

    def __init__(self) -> None:
        self.token = ""
        self.stale = False

    def __call__(self, context: Any, callback: Any) -> None:
        callback((("token", self.token),) if self.token else (), None)


def open_channel(parsed: MetadataUri, target: str) -> tuple[grpc.aio.Channel, TokenAuth | None]:
    """The channel the URI asks for: plaintext, or TLS (+ token call credentials)."""
    if not parsed.tls:
        return grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS), None
    def path(name: str) -> Any:
        value = parsed.option(name)
        return None if value is None else Path(value)

    loaded = TlsConfig(cert=path("cert"), key=path("key"), ca=path("ca")).load()
    creds = loaded.grpc_channel_credentials()
    auth = TokenAuth() if parsed.option("user") is not None else None
    if auth is not None:
        creds = grpc.composite_channel_credentials(creds, grpc.metadata_call_credentials(auth))
    host = parsed.hosts[0][0]  # the name checked in every member's certificate
    options = [*_CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", host), ("grpc.default_authority", host)]
    return grpc.aio.secure_channel(target, creds, options=options), auth
