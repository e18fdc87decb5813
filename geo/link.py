"""One link ``source`` → ``target`` of one stream: what to ship, what is confirmed, the lag.

I/O-free. Inputs: the source records in source order (:meth:`LinkCore.on_source_record`)
and the target's confirmations in the same order (:meth:`LinkCore.on_confirmed`). Outputs: a
:class:`Ship` for each record to append to the target (with its mark), and :class:`Lag`.

Invariants: source positions strictly increase and start after the resume point (a
record at or before it is already in the target: shipping it again would duplicate it);
confirmations arrive in shipping order (the stream writer confirms in order).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from scriba.geo.marks import Mark, check_cluster_name, marked, origin_of, shippable
from scriba.invariant import invariant
from scriba.stream import Position


@dataclass(frozen=True, slots=True)
class Ship:
    """Append this record to the target stream."""

    source_position: Position
    payload: bytes
    headers: Mapping[str, bytes]
    source_publish_ms: int


@dataclass(frozen=True, slots=True)
class Lag:
    """How far the target is behind the source on one link."""

    records_behind: int  # records shipped and not yet confirmed (``scriba shell geo-status`` counts exactly)
    seconds_behind: float  # age of the oldest source record not yet confirmed in the target (0: caught up)
    confirmed: Position | None  # the last source position the target holds


class LinkCore:
    def __init__(self, source: str, target: str, resume_after: Position | None, *, local_only: bool = False) -> None:
        check_cluster_name(source)
        check_cluster_name(target)
        invariant(source != target, f"link from cluster {source!r} to itself")
        self.source = source
        self.target = target
        self.local_only = local_only
        self.confirmed = resume_after
        self._read = resume_after  # the last source position handed to on_source_record
        self._unconfirmed: deque[tuple[Position, int]] = deque()  # shipped, awaiting the target
        self.shipped = 0
        self.skipped = 0

    @property
    def start(self) -> Position | str:
        """Where the source reader starts: right after the resume point, else the beginning."""
        return "earliest" if self.confirmed is None else self.confirmed.successor()

    def on_source_record(self, position: Position, payload: bytes, headers: Mapping[str, bytes],
                         publish_ms: int) -> Ship | None:
        invariant(self._read is None or position > self._read,
                  f"link {self.source}->{self.target}: source position {position} not after {self._read}")
        self._read = position
        if not shippable(headers, self.source, self.target, local_only=self.local_only):
            self.skipped += 1
            return None
        mark = Mark(origin_of(headers, self.source), self.source, position, publish_ms)
        self._unconfirmed.append((position, publish_ms))
        self.shipped += 1
        return Ship(position, payload, marked(headers, mark), publish_ms)

    def on_confirmed(self, source_position: Position) -> None:
        invariant(bool(self._unconfirmed) and self._unconfirmed[0][0] == source_position,
                  f"link {self.source}->{self.target}: confirmation of {source_position} out of order")
        self._unconfirmed.popleft()
        self.confirmed = source_position

    def lag(self, now_ms: int) -> Lag:
        oldest = self._unconfirmed[0][1] if self._unconfirmed else None
        seconds = max(now_ms - oldest, 0) / 1000 if oldest is not None else 0.0
        return Lag(len(self._unconfirmed), seconds, self.confirmed)
