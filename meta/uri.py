"""Metadata URIs."""

from __future__ import annotations

from dataclasses import dataclass

from scriba.config import parse_host_port
from scriba.errors import ConfigError

SCHEMES = ("memory", "etcd", "zk")


@dataclass(frozen=True, slots=True)
class MetadataUri:
    scheme: str
    hosts: tuple[tuple[str, int], ...]  # empty for memory://
    path: str  # memory: the store name; etcd: key prefix; zk: chroot (no leading/trailing /)
    text: str

    @property
    def hosts_text(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.hosts)


def parse_uri(uri: str) -> MetadataUri:
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise ConfigError(f"{uri!r}: expected SCHEME://..., one of {', '.join(SCHEMES)}")
    if scheme not in SCHEMES:
        raise ConfigError(f"{uri!r}: unknown metadata scheme {scheme!r} (one of {', '.join(SCHEMES)})")
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
    return MetadataUri(scheme, hosts, path, uri)
