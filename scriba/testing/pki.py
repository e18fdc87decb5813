"""Certificates for TLS tests: one CA, a server, allowed and unlisted clients, and the bad ones.

``TestPki.create(dir)`` writes (under ``dir``): the CA; ``server`` (SANs localhost and
127.0.0.1); ``client`` and ``admin`` (identities meant for allow-lists); ``intruder``
(signed by the same CA, on no allow-list); ``wrong-name`` (a server certificate for
another host only); ``expired``; and ``stranger`` (signed by a second, unrelated CA).
:meth:`TestPki.server_tls` / :meth:`TestPki.client_tls` build the matching configs.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from scriba.certs import CertificateAuthority, Issued, issue, make_ca
from scriba.tls import Role, TlsConfig

if TYPE_CHECKING:
    from scriba.client import ClientConfig

CLIENT_IDENTITY = "scriba-client"
ADMIN_IDENTITY = "scriba-admin"
BOOKIE_IDENTITY = "scriba-bookie"


@dataclass(frozen=True, slots=True)
class TestPki:
    __test__ = False  # not a pytest class

    ca: CertificateAuthority
    server: Issued
    client: Issued
    admin: Issued
    intruder: Issued
    wrong_name: Issued
    expired: Issued
    stranger: Issued  # signed by another CA

    @classmethod
    def create(cls, directory: Path) -> TestPki:
        ca = make_ca(directory / "ca", "scriba-test-ca")
        other = make_ca(directory / "other-ca", "other-ca")
        long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10)
        return cls(
            ca=ca,
            server=issue(ca, directory, BOOKIE_IDENTITY),
            client=issue(ca, directory, CLIENT_IDENTITY, dns=(), ips=()),
            admin=issue(ca, directory, ADMIN_IDENTITY, dns=(), ips=()),
            intruder=issue(ca, directory, "intruder", dns=(), ips=()),
            wrong_name=issue(ca, directory, "elsewhere", dns=("elsewhere.example",), ips=("10.9.9.9",)),
            expired=issue(ca, directory, "expired", days=1, not_before=long_ago),
            stranger=issue(other, directory, "stranger"),
        )

    def allow(self) -> Mapping[Role, frozenset[str]]:
        """Allow-lists: the client and bookie identities as clients, the admin as admin."""
        return {
            Role.CLIENT: frozenset({CLIENT_IDENTITY}),
            Role.BOOKIE: frozenset({BOOKIE_IDENTITY}),
            Role.ADMIN: frozenset({ADMIN_IDENTITY}),
        }

    def server_tls(self, *, mutual: bool = True, cert: Issued | None = None) -> TlsConfig:
        own = cert or self.server
        return TlsConfig(cert=own.cert, key=own.key, ca=self.ca.cert, require_client_cert=mutual,
                         allow=self.allow() if mutual else {})

    def client_tls(self, who: Issued | None = None, *, ca: Path | None = None) -> TlsConfig:
        """A client trusting the test CA (or ``ca``), presenting ``who``'s certificate if given."""
        return TlsConfig(cert=who.cert if who else None, key=who.key if who else None, ca=ca or self.ca.cert)


def tls_client_config(tls: TlsConfig | None, deadline_s: float) -> ClientConfig:
    """A client for a test cluster: ``tls`` on every bookie link, every add and read
    bounded by ``deadline_s`` (a refusal must come as an error, never as a hang)."""
    from scriba.client import ClientConfig
    from scriba.client.driver import DriverConfig

    return ClientConfig(add_timeout_s=deadline_s, bookie_wait_s=20.0, tls=tls,
                        driver=DriverConfig(read_timeout_s=deadline_s, metadata_timeout_s=10.0))


async def https_get(url: str, tls: TlsConfig, timeout_s: float = 10.0) -> tuple[int, str]:
    """GET ``url`` over HTTPS with ``tls``'s client context: (status, body text)."""
    import aiohttp

    ctx = tls.load().client_ssl_context()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s),
                                     connector=aiohttp.TCPConnector(ssl=ctx)) as http:
        async with http.get(url) as reply:
            return reply.status, await reply.text()
