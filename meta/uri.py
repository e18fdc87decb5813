"""Metadata URIs.

``memory://NAME`` | ``etcd[+tls]://HOST:PORT[,...]/PREFIX[?OPTIONS]`` | ``zk[+tls]://HOST:PORT[,...]/CHROOT[?OPTIONS]``

Options (query parameters) carry security settings, never secrets: secrets are named by
a file or an environment variable, so a URI can sit on a command line, in a log line or
in a bookie's registration without giving anything away.

- etcd: ``ca``, ``cert``, ``key`` (PEM paths; ``etcd+tls`` only), ``user`` and
  ``password_file`` or ``password_env`` (etcd's user/password authentication; only
  over ``etcd+tls``, so a password never crosses the network in clear).
- zk: ``ca``, ``cert``, ``key`` (``zk+tls`` only: ZooKeeper's secure client port, which
  asks for a client certificate by default), ``digest_file`` or ``digest_env`` (``USER:PASSWORD``): SASL-less digest
  authentication, and every znode Scriba creates gets an ACL that admits only that
  user (see ``scriba.meta.zk_security``).

``password=``, ``digest=`` and the like are refused with a message that says where the
secret belongs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qsl

from scriba.config import parse_host_port
from scriba.errors import ConfigError

SCHEMES = ("memory", "etcd", "etcd+tls", "zk", "zk+tls")
OPTIONS: Final = {
    "etcd": frozenset({"ca", "cert", "key", "user", "password_file", "password_env"}),
    "zk": frozenset({"ca", "cert", "key", "digest_file", "digest_env"}),
    "memory": frozenset(),
}
_SECRETS: Final = frozenset({"password", "pass", "passwd", "secret", "digest", "token"})


@dataclass(frozen=True, slots=True)
class MetadataUri:
    scheme: str  # memory, etcd or zk (etcd+tls: scheme etcd with tls set)
    hosts: tuple[tuple[str, int], ...]  # empty for memory://
    path: str  # memory: the store name; etcd: key prefix; zk: chroot (no leading/trailing /)
    text: str
    tls: bool = False
    options: tuple[tuple[str, str], ...] = ()

    @property
    def hosts_text(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.hosts)

    def option(self, name: str) -> str | None:
        return dict(self.options).get(name)


def parse_uri(uri: str) -> MetadataUri:
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise ConfigError(f"{uri!r}: expected SCHEME://..., one of {', '.join(SCHEMES)}")
    if scheme not in SCHEMES:
        raise ConfigError(f"{uri!r}: unknown metadata scheme {scheme!r} (one of {', '.join(SCHEMES)})")
    tls = scheme.endswith("+tls")
    scheme = scheme.removesuffix("+tls")
    rest, _, query = rest.partition("?")
    options = _options(uri, scheme, query, tls)
    if scheme == "memory":
        name = rest.strip("/")
        if not name:
            raise ConfigError(f"{uri!r}: memory:// needs a name, e.g. memory://test")
        return MetadataUri(scheme, (), name, uri)
    hosts_text, _, path = rest.partition("/")
    if not hosts_text:
        raise ConfigError(f"{uri!r}: no host given")
    default_port = 2379 if scheme == "etcd" else 2181
    hosts = tuple(parse_host_port(h, default_port=default_port) for h in hosts_text.split(","))
    path = path.strip("/")
    if not path:
        raise ConfigError(f"{uri!r}: needs a prefix/chroot, e.g. {scheme}://{hosts_text}/scriba")
    if any(not part for part in path.split("/")):
        raise ConfigError(f"{uri!r}: empty path segment in {path!r}")
    return MetadataUri(scheme, hosts, path, uri, tls, options)


def _options(uri: str, scheme: str, query: str, tls: bool) -> tuple[tuple[str, str], ...]:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ConfigError(f"{uri.partition('?')[0]!r}: malformed options (NAME=VALUE&...)") from None
    names = [name for name, _ in pairs]
    for name in names:
        if name in _SECRETS:
            where = "password_file= or password_env=" if scheme == "etcd" else "digest_file= or digest_env="
            raise ConfigError(f"{uri.partition('?')[0]!r}: option {name!r} would put a secret in the URI; "
                              f"name a file or an environment variable instead ({where})")
        if name not in OPTIONS[scheme]:
            allowed = ", ".join(sorted(OPTIONS[scheme])) or "none"
            raise ConfigError(f"{uri!r}: unknown option {name!r} for {scheme}:// (allowed: {allowed})")
        if names.count(name) > 1:
            raise ConfigError(f"{uri!r}: option {name!r} given twice")
    given = set(names)
    if given & {"ca", "cert", "key"} and not tls:
        raise ConfigError(f"{uri!r}: ca/cert/key need {scheme}+tls://")
    if ("cert" in given) != ("key" in given):
        raise ConfigError(f"{uri!r}: cert= and key= go together")
    if scheme == "etcd":
        if given & {"password_file", "password_env"} and not tls:
            raise ConfigError(f"{uri!r}: a password goes only over TLS: use etcd+tls://")
        if ("user" in given) != bool(given & {"password_file", "password_env"}):
            raise ConfigError(f"{uri!r}: user= needs password_file= or password_env= (and the reverse)")
        if {"password_file", "password_env"} <= given:
            raise ConfigError(f"{uri!r}: give password_file= or password_env=, not both")
    if scheme == "zk" and {"digest_file", "digest_env"} <= given:
        raise ConfigError(f"{uri!r}: give digest_file= or digest_env=, not both")
    return tuple(pairs)
