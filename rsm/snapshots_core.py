"""Snapshot rules without I/O: when to take one, the catalog record, what to keep.

:class:`SnapshotSchedule`: a snapshot is due once ``every_commands`` records or
``every_bytes`` bytes were applied since the last one started (and none is running);
``on_demand`` makes one due now. ``started`` / ``finished`` bracket one snapshot.

:class:`SnapshotCatalog` is the versioned metadata record that references the
snapshots, newest last: each :class:`SnapshotInfo` names its ledger, the position it
covers (every record up to and including it), its size, chunk count and SHA-256
digest. :func:`add_snapshot` appends one and keeps the ``kept`` newest; the rest
are returned for deletion. The stream may be truncated before the oldest kept
snapshot's position (:func:`truncation_point`): a replica can always restore one of
the kept snapshots and replay the tail after it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from scriba.config import require
from scriba.errors import ConfigError
from scriba.invariant import invariant
from scriba.stream import Position


class SnapshotSchedule:
    def __init__(self, every_commands: int | None, every_bytes: int | None) -> None:
        require(every_commands is None or every_commands >= 1, "snapshot_every_commands", ">= 1 or None")
        require(every_bytes is None or every_bytes >= 1, "snapshot_every_bytes", ">= 1 or None")
        self.every_commands = every_commands
        self.every_bytes = every_bytes
        self.records_since = 0
        self.bytes_since = 0
        self.running = False
        self.requested = False
        self.last_position: Position | None = None

    def on_applied(self, records: int, size_bytes: int) -> None:
        self.records_since += records
        self.bytes_since += size_bytes

    def on_demand(self) -> None:
        self.requested = True

    def due(self) -> bool:
        if self.running:
            return False
        return (
            self.requested
            or (self.every_commands is not None and self.records_since >= self.every_commands)
            or (self.every_bytes is not None and self.bytes_since >= self.every_bytes)
        )

    def started(self) -> None:
        invariant(not self.running, "a snapshot started while another runs")
        self.running = True
        self.requested = False
        self.records_since = 0
        self.bytes_since = 0

    def restored(self, position: Position) -> None:
        """A snapshot was restored: count from it (the records it covers need no new snapshot)."""
        self.records_since = 0
        self.bytes_since = 0
        if self.last_position is None or position > self.last_position:
            self.last_position = position

    def finished(self, position: Position | None) -> None:
        """``position``: the snapshot stored, or None if it failed (it becomes due again)."""
        invariant(self.running, "snapshot finished that was not started")
        self.running = False
        if position is None:
            self.requested = True
        else:
            self.last_position = position


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    ledger_id: int
    position: Position
    records_applied: int
    size_bytes: int
    chunks: int
    digest: str  # sha256 hex of the chunks, in order
    created_ms: int
    token: int

    def to_json(self) -> dict[str, Any]:
        return {"ledger_id": self.ledger_id, "position": str(self.position), "records_applied": self.records_applied,
                "size_bytes": self.size_bytes, "chunks": self.chunks, "digest": self.digest,
                "created_ms": self.created_ms, "token": self.token}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SnapshotInfo:
        return cls(int(doc["ledger_id"]), Position.parse(doc["position"]), int(doc["records_applied"]),
                   int(doc["size_bytes"]), int(doc["chunks"]), str(doc["digest"]), int(doc["created_ms"]),
                   int(doc["token"]))


@dataclass(frozen=True, slots=True)
class SnapshotCatalog:
    snapshots: tuple[SnapshotInfo, ...] = ()  # oldest first
    deleting: tuple[int, ...] = ()  # ledgers dropped from the list, not yet deleted

    @property
    def newest(self) -> SnapshotInfo | None:
        return self.snapshots[-1] if self.snapshots else None

    def to_bytes(self) -> bytes:
        doc = {"snapshots": [s.to_json() for s in self.snapshots], "deleting": list(self.deleting)}
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> SnapshotCatalog:
        try:
            doc = json.loads(data)
            return cls(tuple(SnapshotInfo.from_json(s) for s in doc["snapshots"]),
                       tuple(int(x) for x in doc.get("deleting", [])))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"snapshot catalog record does not decode: {exc}") from None


class _CatalogCodec:
    def to_bytes(self, value: SnapshotCatalog) -> bytes:
        return value.to_bytes()

    def from_bytes(self, data: bytes) -> SnapshotCatalog:
        return SnapshotCatalog.from_bytes(data)


CATALOG_CODEC = _CatalogCodec()


def add_snapshot(catalog: SnapshotCatalog, info: SnapshotInfo, kept: int) -> SnapshotCatalog:
    """``info`` appended (if newer than the newest), keeping the ``kept`` newest; dropped ledgers
    move to ``deleting``."""
    require(kept >= 1, "snapshots_kept", "must be >= 1")
    newest = catalog.newest
    if newest is not None and info.position <= newest.position:
        return replace(catalog, deleting=(*catalog.deleting, info.ledger_id))
    snapshots = (*catalog.snapshots, info)
    dropped = snapshots[:-kept] if len(snapshots) > kept else ()
    return SnapshotCatalog(snapshots[len(dropped):], (*catalog.deleting, *(s.ledger_id for s in dropped)))


def finish_deletes(catalog: SnapshotCatalog, done: set[int]) -> SnapshotCatalog:
    return replace(catalog, deleting=tuple(x for x in catalog.deleting if x not in done))


def truncation_point(catalog: SnapshotCatalog, kept: int) -> Position | None:
    """Truncate the stream before this (the oldest kept snapshot's position), once ``kept`` exist.

    With fewer than ``kept`` snapshots nothing is truncated: a fallback must still be
    able to replay from the stream's start.
    """
    if len(catalog.snapshots) < kept:
        return None
    return catalog.snapshots[0].position
