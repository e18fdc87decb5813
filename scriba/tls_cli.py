"""Command-line and config-file form of :class:`scriba.tls.TlsConfig` (only CLIs read files).

Flags: ``--tls-cert``, ``--tls-key``, ``--tls-ca``, ``--tls-require-client-cert``,
``--tls-allow ROLE=IDENTITY`` (repeatable), ``--tls-server-name``, and ``--tls-config
FILE``: a YAML (or JSON) mapping with the same keys::

    cert: /etc/scriba/bookie.crt
    key: /etc/scriba/bookie.key
    ca: /etc/scriba/ca.crt
    require_client_cert: true
    allow: {client: [writer-1, writer-2], bookie: ["*"], admin: [ops]}

Flags given on the command line override the file's values. Relative paths in the
file are taken from the file's directory. No flag and no file: None (plaintext).

A process that both serves (an HTTP ``/metrics`` endpoint) and dials (bookies) takes
both halves (``server=True, client=True``): one certificate, key and CA for both;
:func:`client_tls_from_args` is the config it dials with (no allow-lists, the
``--tls-server-name`` kept).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from scriba.errors import ConfigError
from scriba.tls import TlsConfig, as_client, parse_allow

_KEYS = frozenset({"cert", "key", "ca", "require_client_cert", "allow", "server_name"})


def add_tls_arguments(parser: argparse.ArgumentParser, *, server: bool = True, client: bool | None = None) -> None:
    """The TLS flags of a server (mutual TLS, allow-lists), a client (the checked server
    name) or, with ``server=True, client=True``, of a process that is both."""
    client = not server if client is None else client
    group = parser.add_argument_group("TLS")
    group.add_argument("--tls-config", type=Path, default=None, metavar="FILE",
                       help="YAML/JSON file with cert, key, ca, require_client_cert, allow")
    group.add_argument("--tls-cert", type=Path, default=None, help="PEM certificate (chain) of this process")
    group.add_argument("--tls-key", type=Path, default=None, help="PEM private key of --tls-cert")
    group.add_argument("--tls-ca", type=Path, default=None, help="PEM CA bundle that verifies peers")
    if server:
        group.add_argument("--tls-require-client-cert", action="store_true", default=None,
                           help="mutual TLS: refuse peers without a certificate signed by --tls-ca")
        group.add_argument("--tls-allow", action="append", default=[], metavar="ROLE=IDENTITY",
                           help="admit certificate CN/SAN IDENTITY as ROLE (client, bookie, admin; '*': any)")
    if client:
        group.add_argument("--tls-server-name", default=None, help="name to verify in the server certificate")


def tls_from_args(args: argparse.Namespace) -> TlsConfig | None:
    """The TLS config the flags (and ``--tls-config``) describe, validated; None if none."""
    values: dict[str, Any] = _read_file(args.tls_config) if getattr(args, "tls_config", None) else {}
    for key in ("cert", "key", "ca"):
        flag = getattr(args, f"tls_{key}", None)
        if flag is not None:
            values[key] = flag
    if getattr(args, "tls_require_client_cert", None):
        values["require_client_cert"] = True
    allow_flags = getattr(args, "tls_allow", None) or []
    if allow_flags:
        merged = dict(values.get("allow", {}))
        for role, ids in parse_allow(allow_flags).items():
            merged[role] = merged.get(role, frozenset()) | ids
        values["allow"] = MappingProxyType(merged)
    if getattr(args, "tls_server_name", None):
        values["server_name"] = args.tls_server_name
    if not values:
        return None
    return TlsConfig(**values).validate()


def client_tls_from_args(args: argparse.Namespace) -> TlsConfig | None:
    """The config a process that also serves dials with: its certificate and CA (and
    ``--tls-server-name``), without the server's allow-lists; None if no TLS flag."""
    config = tls_from_args(args)
    client = as_client(config)
    if config is None or client is None:
        return None
    return replace(client, server_name=config.server_name).validate()


def _read_file(path: Path) -> dict[str, Any]:
    import yaml

    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"--tls-config {path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--tls-config {path}: not YAML/JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"--tls-config {path}: expected a mapping of {', '.join(sorted(_KEYS))}")
    unknown = set(raw) - _KEYS
    if unknown:
        raise ConfigError(f"--tls-config {path}: unknown keys {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    for key in ("cert", "key", "ca"):
        if raw.get(key) is not None:
            p = Path(str(raw[key]))
            values[key] = p if p.is_absolute() else path.parent / p
    if "require_client_cert" in raw:
        if not isinstance(raw["require_client_cert"], bool):
            raise ConfigError(f"--tls-config {path}: require_client_cert must be true or false")
        values["require_client_cert"] = raw["require_client_cert"]
    if raw.get("allow") is not None:
        allow = raw["allow"]
        if not isinstance(allow, dict) or not all(isinstance(v, list) for v in allow.values()):
            raise ConfigError(f"--tls-config {path}: allow must map roles to lists of identities")
        values["allow"] = parse_allow(f"{role}={ident}" for role, ids in allow.items() for ident in ids)
    if raw.get("server_name") is not None:
        values["server_name"] = str(raw["server_name"])
    return values
