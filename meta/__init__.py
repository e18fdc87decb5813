"""Metadata store: one async interface, drivers ``memory://``, ``etcd://``, ``zk://``.

    store = await scriba.meta.connect("etcd://127.0.0.1:2379/scriba")
    async with await scriba.meta.connect(uri) as store: ...
"""

from scriba.meta.connect import connect
from scriba.meta.store import (
    Check,
    Delete,
    EventKind,
    MetadataStore,
    Put,
    Session,
    SessionState,
    Versioned,
    WatchEvent,
)
from scriba.meta.update import read_record, update_metadata

__all__ = [
    "Check",
    "Delete",
    "EventKind",
    "MetadataStore",
    "Put",
    "Session",
    "SessionState",
    "Versioned",
    "WatchEvent",
    "connect",
    "read_record",
    "update_metadata",
]
