"""What a ``zk://`` URI's security options become for kazoo: digest credentials and ACL, TLS.

Authentication (URI options ``digest_file=`` / ``digest_env=``, ``USER:PASSWORD``):
the session adds digest credentials, and every znode Scriba creates (the chroot, its
containers, records, ephemerals, transaction creates) gets one ACL: that digest user,
all permissions; nobody else, not even readers (:func:`digest_auth`). A request the
ACLs refuse is an ``UnauthorizedError`` (``scriba.meta.zk_requests``; a wrong password
shows as that: ZooKeeper accepts any digest credentials and refuses at each znode). A
chroot someone else created world-open is logged (``zookeeper_chroot_world_open``): its
ACL is not ours to change.

TLS (``zk+tls://``, ``ca=``, ``cert=``, ``key=``; :func:`tls_options`): kazoo dials the
server's secure client port and verifies its certificate and host name; ZooKeeper asks
for a client certificate by default (``ssl.clientAuth=need``). The Debian ZooKeeper 3.8
serves TLS with ``serverCnxnFactory=NettyServerCnxnFactory``, PEM key and trust stores
and the Debian Netty jars on its classpath (``scriba.embedded.zookeeper`` does this).
"""

from __future__ import annotations

import socket
import ssl
from pathlib import Path
from typing import Any

from kazoo.security import ACL, make_digest_acl

from scriba.errors import ConfigError
from scriba.meta.credentials import secret
from scriba.meta.uri import MetadataUri
from scriba.meta.zk_connect import BoundedConnectHandler
from scriba.tls import TlsConfig


def tls_options(parsed: MetadataUri) -> dict[str, Any]:
    """kazoo's arguments for ``zk+tls://``: a handler dialing with Scriba's client context
    (chain and host name verified; files checked first: a clear ConfigError)."""
    if not parsed.tls:
        return {}
    ca, cert, key = (parsed.option(name) for name in ("ca", "cert", "key"))
    loaded = TlsConfig(cert=Path(cert) if cert else None, key=Path(key) if key else None,
                       ca=Path(ca) if ca else None).load()
    return {"use_ssl": True, "handler": _TlsHandler(loaded.client_ssl_context())}


class _TlsHandler(BoundedConnectHandler):
    """kazoo's threading handler, dialing TLS with our context (the dial and the handshake
    bounded as every connect attempt is). Unlike kazoo 2.11's own TLS dialer it closes the
    socket of a failed handshake (a client retrying against a server it must refuse would
    otherwise leak one descriptor per attempt)."""

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__()
        self._context = context

    def create_connection(self, address: tuple[str, int], hostname: str | None = None,
                          timeout: float | None = None, **_kazoo_tls_args: Any) -> ssl.SSLSocket:
        sock = socket.create_connection(address, self.bound(timeout))
        try:
            conn = self._context.wrap_socket(sock, server_hostname=hostname or address[0])
        except BaseException:
            sock.close()
            raise
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn


def digest_auth(parsed: MetadataUri) -> tuple[list[tuple[str, str]], list[ACL] | None]:
    """kazoo's ``auth_data`` and ``default_acl`` for the URI's digest credentials (or none)."""
    digest = secret(parsed, "digest_file", "digest_env")
    if digest is None:
        return [], None
    user, sep, password = digest.partition(":")
    if not sep or not user or not password:
        where = parsed.option("digest_file") or parsed.option("digest_env")
        raise ConfigError(f"ZooKeeper digest from {where}: expected USER:PASSWORD")
    return [("digest", digest)], [make_digest_acl(user, password, all=True)]
