"""``scriba sandbox --tls``: a throwaway CA and the certificates of one sandbox (``DIR/tls``).

Identities (each a certificate the CA signs, SANs localhost, 127.0.0.1 and 127.0.0.2,
the address bookies behind the inter-region latency proxy advertise):
``scriba-server`` (etcd, bookies; also what bookies present to each other),
``scriba-client`` (``scriba shell``, ``scriba bench``, applications), ``scriba-admin``
(the console: it serves HTTPS with it and probes the bookies' admin endpoints). Every
server requires client certificates and admits: clients ``scriba-client``, bookies
``scriba-server``, admins ``scriba-admin``. New certificates at every start (the CA
too): nothing here is meant to outlive the sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from scriba.certs import Issued, issue, make_ca
from scriba.tls import Role, TlsConfig

SERVER_IDENTITY = "scriba-server"
CLIENT_IDENTITY = "scriba-client"
ADMIN_IDENTITY = "scriba-admin"


@dataclass(frozen=True, slots=True)
class SandboxPki:
    ca: Path
    server: Issued
    client: Issued
    admin: Issued

    @classmethod
    def create(cls, directory: Path) -> SandboxPki:
        ca = make_ca(directory, "scriba-sandbox-ca")
        ips = ("127.0.0.1", "127.0.0.2")
        return cls(ca.cert, issue(ca, directory, SERVER_IDENTITY, ips=ips),
                   issue(ca, directory, CLIENT_IDENTITY, ips=ips), issue(ca, directory, ADMIN_IDENTITY, ips=ips))

    def server_tls(self, own: Issued | None = None) -> TlsConfig:
        """What every sandbox server serves with (``own``: another certificate, e.g. the admin's)."""
        cert = own or self.server
        allow = MappingProxyType({Role.CLIENT: frozenset({CLIENT_IDENTITY}), Role.BOOKIE: frozenset({SERVER_IDENTITY}),
                                  Role.ADMIN: frozenset({ADMIN_IDENTITY})})
        return TlsConfig(cert=cert.cert, key=cert.key, ca=self.ca, require_client_cert=True, allow=allow)

    def client_tls(self, who: Issued | None = None) -> TlsConfig:
        who = who or self.client
        return TlsConfig(cert=who.cert, key=who.key, ca=self.ca)

    def describe(self) -> dict[str, Any]:
        """sandbox.json's ``client_tls`` and ``admin_tls`` (paths; ``scriba shell`` reads the first)."""
        return {name: {"cert": str(i.cert), "key": str(i.key), "ca": str(self.ca)}
                for name, i in (("client_tls", self.client), ("admin_tls", self.admin))}
