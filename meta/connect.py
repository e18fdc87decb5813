"""``connect(uri)``: parse a metadata URI and open the matching driver.

``memory://NAME`` | ``etcd://HOST:PORT[,HOST:PORT...]/PREFIX`` | ``zk://HOST:PORT[,...]/CHROOT``
"""

from __future__ import annotations

from scriba.errors import ConfigError
from scriba.meta.store import MetadataStore
from scriba.meta.uri import parse_uri


async def connect(uri: str, *, connect_timeout_s: float = 5.0, session_timeout_s: float = 10.0) -> MetadataStore:
    parsed = parse_uri(uri)
    if parsed.scheme == "memory":
        from scriba.meta.memory import MemoryStore

        return await MemoryStore.open(parsed, session_timeout_s=session_timeout_s)
    if parsed.scheme == "etcd":
        from scriba.meta.etcd import EtcdStore

        return await EtcdStore.open(
            parsed, connect_timeout_s=connect_timeout_s, session_timeout_s=session_timeout_s
        )
    if parsed.scheme == "zk":
        from scriba.meta.zookeeper import ZooKeeperStore

        return await ZooKeeperStore.open(
            parsed, connect_timeout_s=connect_timeout_s, session_timeout_s=session_timeout_s
        )
    raise ConfigError(f"{uri!r}: unknown metadata scheme {parsed.scheme!r}")
