"""TLS and mutual TLS for every Scriba port: one configuration, loaded once, checked early.

Theory of operation. A component that serves or dials over TLS holds a frozen
:class:`TlsConfig` (paths, never key bytes; ``validate()`` names a bad field). Before
it binds or dials it calls :meth:`TlsConfig.load`, which reads and parses every file
(:class:`LoadedTls`) and raises :class:`~scriba.errors.ConfigError` naming the file and
what is wrong with it. A server with a TLS config that does not load therefore refuses
to start with that message; nothing here ever falls back to plaintext (a component
with a ``TlsConfig`` has no plaintext code path to fall back to).

From a ``LoadedTls`` come the credentials of each transport:
- ``ssl.SSLContext`` for asyncio streams and aiohttp (:meth:`LoadedTls.server_ssl_context`,
  :meth:`LoadedTls.client_ssl_context`; the client context verifies the server's
  certificate chain *and* its name), also for the binary data path's listener and
  connections;
- gRPC server and channel credentials (:meth:`LoadedTls.grpc_server_credentials`,
  :meth:`LoadedTls.grpc_channel_credentials`; gRPC checks the target name itself,
  ``server_name`` overrides the name checked).

Mutual TLS: with ``require_client_cert`` a server asks every peer for a certificate
signed by ``ca`` and refuses the handshake without one. Authorisation then follows
the allow-lists (``allow``): a role (client, bookie, admin) maps to the identities it
admits; an identity is the certificate's subject common name or any of its subject
alternative names (DNS, IP, URI, e-mail values, compared exactly); ``*`` admits every
certificate the CA signed. An endpoint names the roles it serves; a peer whose
identities meet none of their lists is refused (:func:`authorize`). No allow-list at
all means any certificate the CA signed is admitted.

Nothing here imports gRPC at module load (``scriba.grpc_runtime`` must act first).
"""

from __future__ import annotations

import enum
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from scriba.config import require
from scriba.errors import ConfigError, UnauthorizedError

ANY_IDENTITY: Final = "*"
TLS_MINIMUM_VERSION: Final = ssl.TLSVersion.TLSv1_2


class Role(enum.StrEnum):
    """Who may call an endpoint (a certificate's identity is admitted per role)."""

    CLIENT = "client"  # ledger clients: adds, reads
    BOOKIE = "bookie"  # bookie to bookie (autorecovery copies entries)
    ADMIN = "admin"  # HTTP admin and metrics, shell tools acting as an operator


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Where the PEM files are and whom to admit (paths only; see the module docstring).

    ``cert``/``key``: this process's certificate chain and private key (a server needs
    both; a client needs both only for mutual TLS). ``ca``: the roots that verify the
    peer (None: the system's roots). ``server_name``: the name a client checks in the
    server's certificate instead of the host it dials (None: the host).
    """

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    require_client_cert: bool = False
    allow: Mapping[Role, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))
    server_name: str | None = None

    def validate(self) -> TlsConfig:
        require(self.cert is None or self.key is not None, "tls.key", "required with tls.cert")
        require(self.key is None or self.cert is not None, "tls.cert", "required with tls.key")
        if self.require_client_cert:
            require(self.ca is not None, "tls.ca", "required with require_client_cert (the CA that signs clients)")
        for role, identities in self.allow.items():
            require(isinstance(role, Role), "tls.allow", f"unknown role {role!r} (client, bookie, admin)")
            require(all(isinstance(i, str) and i for i in identities), f"tls.allow.{role}",
                    "identities must be non-empty strings")
        if any(self.allow.values()):
            require(self.require_client_cert, "tls.require_client_cert",
                    "must be set with an allow-list (identities come from client certificates)")
        require(self.server_name is None or bool(self.server_name), "tls.server_name", "must not be empty")
        return self

    @property
    def mutual(self) -> bool:
        return self.require_client_cert

    def load(self) -> LoadedTls:
        """Read and check every file now (ConfigError naming the file and the reason)."""
        self.validate()
        cert = _read_pem(self.cert, "tls.cert")
        key = _read_pem(self.key, "tls.key")
        ca = _read_pem(self.ca, "tls.ca")
        loaded = LoadedTls(self, cert, key, ca)
        if cert is not None:
            loaded.server_ssl_context()  # parses cert and key and checks that they match
        if ca is not None:
            loaded.client_ssl_context()  # parses the CA bundle
        return loaded

    def server_ssl_context(self) -> ssl.SSLContext:
        """Shorthand for ``load().server_ssl_context()`` (the binary data path's listener)."""
        return self.load().server_ssl_context()

    def client_ssl_context(self) -> ssl.SSLContext:
        """Shorthand for ``load().client_ssl_context()`` (the binary data path's dialer)."""
        return self.load().client_ssl_context()


@dataclass(frozen=True, slots=True)
class LoadedTls:
    """A checked :class:`TlsConfig` with its PEM bytes (never logged, never repr'd)."""

    config: TlsConfig
    cert_pem: bytes | None = field(repr=False)
    key_pem: bytes | None = field(repr=False)
    ca_pem: bytes | None = field(repr=False)

    def server_ssl_context(self) -> ssl.SSLContext:
        cfg = self.config
        if cfg.cert is None or cfg.key is None:
            raise ConfigError("tls.cert: a TLS server needs a certificate and a key")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = TLS_MINIMUM_VERSION
        _load_chain(ctx, cfg)
        if cfg.ca is not None:
            _load_ca(ctx, cfg.ca)
            ctx.verify_mode = ssl.CERT_REQUIRED if cfg.require_client_cert else ssl.CERT_OPTIONAL
        return ctx

    def client_ssl_context(self) -> ssl.SSLContext:
        cfg = self.config
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname on
        ctx.minimum_version = TLS_MINIMUM_VERSION
        if cfg.ca is not None:
            _load_ca(ctx, cfg.ca)
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
        if cfg.cert is not None:
            _load_chain(ctx, cfg)
        return ctx

    def grpc_server_credentials(self) -> Any:
        import grpc

        if self.cert_pem is None or self.key_pem is None:
            raise ConfigError("tls.cert: a TLS server needs a certificate and a key")
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)],
            root_certificates=self.ca_pem,
            require_client_auth=self.config.require_client_cert,
        )

    def grpc_channel_credentials(self) -> Any:
        import grpc

        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem, private_key=self.key_pem, certificate_chain=self.cert_pem
        )

    def grpc_channel_options(self) -> list[tuple[str, Any]]:
        """Channel options a TLS channel adds (the checked server name, when overridden)."""
        name = self.config.server_name
        return [("grpc.ssl_target_name_override", name)] if name else []


def as_client(config: TlsConfig | None) -> TlsConfig | None:
    """A server's config turned into the client config of the same process (its own
    certificate, its CA; no allow-lists): how a server dials the servers it depends on."""
    if config is None:
        return None
    return TlsConfig(cert=config.cert, key=config.key, ca=config.ca)


# --- identities and allow-lists ---------------------------------------------------------


def identities_from_peercert(peercert: Mapping[str, Any] | None) -> frozenset[str]:
    """Subject CN and SAN values of a certificate as ``ssl`` reports it (``getpeercert()``)."""
    if not peercert:
        return frozenset()
    names: set[str] = set()
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                names.add(str(value))
    for _kind, value in peercert.get("subjectAltName", ()):
        names.add(str(value))
    return frozenset(names)


def identities_from_grpc(auth_context: Mapping[str, Iterable[bytes]]) -> frozenset[str]:
    """Subject CN and SAN values of the peer's certificate from gRPC's auth context."""
    names: set[str] = set()
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for value in auth_context.get(key, ()):
            names.add(value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value))
    return frozenset(names)


def admitted(config: TlsConfig, identities: frozenset[str], roles: Iterable[Role]) -> bool:
    """Whether a verified peer with these identities may act in one of ``roles``."""
    if not any(config.allow.values()):
        return True  # mutual TLS without allow-lists: every certificate the CA signed
    for role in roles:
        allowed = config.allow.get(role, frozenset())
        if ANY_IDENTITY in allowed and identities:
            return True
        if identities & allowed:
            return True
    return False


def is_admin(config: TlsConfig, identities: frozenset[str]) -> bool:
    """Whether a verified peer is on the admin allow-list itself (strict: unlike
    :func:`admitted`, no allow-list at all admits nobody). What lets an operator's tools
    read a password-protected ledger without its password."""
    allowed = config.allow.get(Role.ADMIN, frozenset())
    if not config.require_client_cert or not identities or not allowed:
        return False
    return ANY_IDENTITY in allowed or bool(identities & allowed)


def authorize(config: TlsConfig, identities: frozenset[str], roles: Iterable[Role]) -> None:
    """UnauthorizedError unless a peer with these identities may act in one of ``roles``."""
    roles = tuple(roles)
    if config.require_client_cert and not identities:
        raise UnauthorizedError("no client certificate (this endpoint requires mutual TLS)")
    if not admitted(config, identities, roles):
        names = ", ".join(sorted(identities)) or "none"
        wanted = "/".join(str(r) for r in roles)
        raise UnauthorizedError(f"certificate identities [{names}] are not on the {wanted} allow-list")


def refusal(tls: LoadedTls | None, peercert: Mapping[str, Any] | None, roles: Iterable[Role]) -> UnauthorizedError | None:
    """Why a connection with this peer certificate (``ssl``'s ``getpeercert()``) may not act
    in ``roles`` on a server serving ``tls``; None when it may (or when the server does not
    ask for client certificates)."""
    if tls is None or not tls.config.require_client_cert:
        return None
    try:
        authorize(tls.config, identities_from_peercert(peercert), roles)
    except UnauthorizedError as exc:
        return exc
    return None


def parse_allow(entries: Iterable[str]) -> Mapping[Role, frozenset[str]]:
    """``ROLE=IDENTITY`` strings (``--tls-allow client=writer-1``) into allow-lists."""
    lists: dict[Role, set[str]] = {}
    for entry in entries:
        role_text, sep, identity = entry.partition("=")
        if not sep or not identity:
            raise ConfigError(f"tls.allow {entry!r}: expected ROLE=IDENTITY (role: client, bookie, admin)")
        try:
            role = Role(role_text.strip().lower())
        except ValueError:
            raise ConfigError(f"tls.allow {entry!r}: unknown role {role_text!r} (client, bookie, admin)") from None
        lists.setdefault(role, set()).add(identity.strip())
    return MappingProxyType({role: frozenset(ids) for role, ids in lists.items()})


# --- file loading -----------------------------------------------------------------------


def _read_pem(path: Path | None, name: str) -> bytes | None:
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{name} {path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{name} {path}: is a directory, expected a PEM file") from None
    except OSError as exc:
        raise ConfigError(f"{name} {path}: cannot read ({exc.strerror})") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{name} {path}: not a PEM file (no -----BEGIN line)")
    return data


def _load_chain(ctx: ssl.SSLContext, cfg: TlsConfig) -> None:
    try:
        ctx.load_cert_chain(str(cfg.cert), str(cfg.key))
    except ssl.SSLError as exc:
        raise ConfigError(f"tls.cert {cfg.cert} / tls.key {cfg.key}: cannot load ({_ssl_reason(exc)})") from None
    except OSError as exc:
        raise ConfigError(f"tls.cert {cfg.cert} / tls.key {cfg.key}: cannot read ({exc.strerror})") from None


def _load_ca(ctx: ssl.SSLContext, ca: Path) -> None:
    try:
        ctx.load_verify_locations(cafile=str(ca))
    except ssl.SSLError as exc:
        raise ConfigError(f"tls.ca {ca}: cannot load ({_ssl_reason(exc)})") from None
    except OSError as exc:
        raise ConfigError(f"tls.ca {ca}: cannot read ({exc.strerror})") from None


def _ssl_reason(exc: ssl.SSLError) -> str:
    reason = getattr(exc, "reason", None)
    if reason == "KEY_VALUES_MISMATCH":
        return "the key does not match the certificate"
    return str(reason or exc).lower().replace("_", " ")
