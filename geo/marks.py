"""Replication marks: the headers every replicated record carries, and who may ship what.

A record written by an application in cluster C carries no mark: its origin is C.
When a link ships a record from cluster S to cluster T it adds a mark:

- ``geo.origin``: the cluster where the record was first written (kept across hops);
- ``geo.source``: S, the cluster this hop read it from;
- ``geo.source_position``: its position in S's stream (``"SEG:ENTRY:SLOT"``);
- ``geo.source_publish_ms``: its publish time in S (for the lag in seconds).

A hop overwrites the previous hop's ``source`` fields (a record's mark describes its
last hop only), so the target of a link can find, in its own stream, the last record
that link confirmed — the link's progress (see ``progress``).

Loop prevention (active-active): a record whose origin is the target cluster is never
shipped back. With ``local_only`` a link ships only records that originated in its
source (for a full mesh, where every pair has a link; a directed ring ships everything
but the target's own records, so each record goes round once).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from scriba.errors import ConfigError
from scriba.stream import Position

ORIGIN: Final = "geo.origin"
SOURCE: Final = "geo.source"
SOURCE_POSITION: Final = "geo.source_position"
SOURCE_PUBLISH_MS: Final = "geo.source_publish_ms"
MARK_KEYS: Final = (ORIGIN, SOURCE, SOURCE_POSITION, SOURCE_PUBLISH_MS)
CLUSTER_NAME_BYTES_MAX: Final = 128


@dataclass(frozen=True, slots=True)
class Mark:
    origin: str
    source: str
    source_position: Position
    source_publish_ms: int

    def to_headers(self) -> dict[str, bytes]:
        return {
            ORIGIN: self.origin.encode(),
            SOURCE: self.source.encode(),
            SOURCE_POSITION: str(self.source_position).encode(),
            SOURCE_PUBLISH_MS: str(self.source_publish_ms).encode(),
        }

    @classmethod
    def from_headers(cls, headers: Mapping[str, bytes]) -> Mark | None:
        """The record's mark, or None for a record written locally (no ``geo.origin``)."""
        if ORIGIN not in headers:
            return None
        try:
            return cls(
                headers[ORIGIN].decode(),
                headers[SOURCE].decode(),
                Position.parse(headers[SOURCE_POSITION].decode()),
                int(headers[SOURCE_PUBLISH_MS]),
            )
        except (KeyError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"record has a malformed replication mark {dict(headers)!r}: {exc}") from None


def check_cluster_name(name: str) -> str:
    if not isinstance(name, str) or not name or len(name.encode()) > CLUSTER_NAME_BYTES_MAX:
        raise ConfigError(f"cluster name must be a non-empty str of at most {CLUSTER_NAME_BYTES_MAX} bytes, "
                          f"got {name!r}")
    return name


def origin_of(headers: Mapping[str, bytes], source: str) -> str:
    """Where a record read from cluster ``source`` was first written."""
    mark = Mark.from_headers(headers)
    return source if mark is None else mark.origin


def shippable(headers: Mapping[str, bytes], source: str, target: str, *, local_only: bool = False) -> bool:
    """May the link ``source`` → ``target`` ship this record? Never back to its origin."""
    origin = origin_of(headers, source)
    if origin == target:
        return False
    return origin == source or not local_only


def marked(headers: Mapping[str, bytes], mark: Mark) -> dict[str, bytes]:
    """The headers a shipped record carries: the application's, with this hop's mark."""
    out = {k: v for k, v in headers.items() if k not in MARK_KEYS}
    out.update(mark.to_headers())
    return out
