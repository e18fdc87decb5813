"""``ClientSession``: the caller's side of an exactly-once session.

Holds the session id (from a ``SESSION_OPEN`` record), hands out sequence numbers,
and tracks ``acked_below`` (every answer below it was received), which lets replicas
drop the results they kept for retries. ``last_position`` is where the latest answered
command landed: pass it to ``read(..., consistency="after", after=...)`` for
read-your-writes on any replica.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scriba.stream import Position


@dataclass(slots=True)
class ClientSession:
    session_id: int
    next_seq: int = 1
    acked_below: int = 1
    last_position: Position | None = None
    _answered: set[int] = field(default_factory=set)

    def allocate(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def answered(self, seq: int, position: Position | None) -> None:
        self._answered.add(seq)
        while self.acked_below in self._answered:
            self._answered.discard(self.acked_below)
            self.acked_below += 1
        if position is not None and (self.last_position is None or position > self.last_position):
            self.last_position = position


@dataclass(frozen=True, slots=True)
class Committed:
    """A proposal's answer and the position its command landed at (or a later one, for a
    retry answered from the session table)."""

    result: bytes
    position: Position
