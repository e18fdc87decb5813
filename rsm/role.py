"""A replica's role: follower, candidate, catching up, leader, stopped.

    FOLLOWER --elected(t)--> CANDIDATE --writer_opened(t, end)--> CATCHING_UP --applied >= end--> LEADER
        ^                        |                                    |                            |
        +-------------------- deposed(t) (fence, lost session or record, resign) -----------------+
    any --fatal--> STOPPED

Inputs are method calls; outputs are effects (frozen dataclasses) the shell carries out:
:class:`OpenWriter` (take the stream: fences the previous writer), :class:`CatchUp`
(apply the stream up to ``end``, the last record before our first segment),
:class:`Serve` (accept proposals), :class:`StepDown` (drop the writer, fail every
proposal in flight as indeterminate, tail the stream again), :class:`Stop`.

The rule that keeps a deposed leader harmless: :meth:`RoleCore.accepts` is true only
while LEADER under the token the confirmation was appended with. The shell asks it
before it applies or acknowledges any of its own confirmed appends; after
``deposed`` nothing it appended is applied or acknowledged by this path (records
that did reach the stream are applied later by the tail, in stream order, like
any follower's; their callers learn only "outcome unknown").

Invariants: tokens of successive terms strictly increase; LEADER only after catching
up to ``end``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from scriba.invariant import invariant
from scriba.stream import Position


class Role(enum.Enum):
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    CATCHING_UP = "catching_up"
    LEADER = "leader"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class OpenWriter:
    token: int


@dataclass(frozen=True, slots=True)
class CatchUp:
    token: int
    end: Position


@dataclass(frozen=True, slots=True)
class Serve:
    token: int


@dataclass(frozen=True, slots=True)
class StepDown:
    token: int
    reason: str


@dataclass(frozen=True, slots=True)
class Stop:
    reason: str


Effect = OpenWriter | CatchUp | Serve | StepDown | Stop

_TERM_ROLES = frozenset({Role.CANDIDATE, Role.CATCHING_UP, Role.LEADER})


class RoleCore:
    def __init__(self) -> None:
        self.role = Role.FOLLOWER
        self.token = 0  # the current (or last) term's token
        self.end: Position | None = None  # CATCHING_UP: apply up to here first
        self.applied: Position | None = None
        self.stop_reason = ""

    @property
    def in_term(self) -> bool:
        return self.role in _TERM_ROLES

    def accepts(self, token: int) -> bool:
        """May a confirmation of an append made under ``token`` be applied and acknowledged?"""
        return self.role is Role.LEADER and token == self.token

    def elected(self, token: int) -> list[Effect]:
        if self.role is Role.STOPPED:
            return []
        invariant(not self.in_term, f"elected with token {token} while {self.role.value} under {self.token}")
        invariant(token > self.token, f"new term's token {token} is not above the last one {self.token}")
        self.role, self.token, self.end = Role.CANDIDATE, token, None
        return [OpenWriter(token)]

    def writer_opened(self, token: int, end: Position | None) -> list[Effect]:
        """The writer is open; ``end`` is the last record before its first segment (None: none)."""
        if self.role is not Role.CANDIDATE or token != self.token:
            return []  # deposed meanwhile: the shell closes that writer
        if end is None or (self.applied is not None and self.applied >= end):
            self.role = Role.LEADER
            return [Serve(token)]
        self.role, self.end = Role.CATCHING_UP, end
        return [CatchUp(token, end)]

    def applied_to(self, position: Position) -> list[Effect]:
        invariant(self.applied is None or position > self.applied,
                  f"applied position went from {self.applied} to {position}")
        self.applied = position
        if self.role is Role.CATCHING_UP and self.end is not None and position >= self.end:
            self.role, self.end = Role.LEADER, None
            return [Serve(self.token)]
        return []

    def restored_to(self, position: Position) -> None:
        """A snapshot replaced the state (follower only): the applied position jumps."""
        invariant(not self.in_term or self.role is Role.CANDIDATE, f"restore while {self.role.value}")
        self.applied = position

    def deposed(self, token: int, reason: str) -> list[Effect]:
        if not self.in_term or token != self.token:
            return []
        self.role, self.end = Role.FOLLOWER, None
        return [StepDown(token, reason)]

    def fatal(self, reason: str) -> list[Effect]:
        if self.role is Role.STOPPED:
            return []
        self.role, self.stop_reason = Role.STOPPED, reason
        return [Stop(reason)]
