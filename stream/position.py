"""Positions in a stream: ``(segment_seq, entry_id, slot)``.

A record's position never changes: ``segment_seq`` numbers the stream's segments
from 0 (never reused, also after truncation), ``entry_id`` is the ledger entry of
that segment that holds the record's record set, ``slot`` its index in the set.
Positions are totally ordered (tuple order), hashable, printable as
``"3:1200:0"`` and parsed back by :meth:`Position.parse`. A ``Position`` is a named
tuple (cheap to make: a reader makes one per record), checked when built from
outside; :func:`trusted` skips the checks for parts a writer or reader counted itself.

A reader started at position ``p`` returns the records whose positions are
``>= p``; so ``p.successor()`` (the next slot) is the position to resume after
``p``, whether or not that slot exists.
"""

from __future__ import annotations

import re
from typing import Any, Final, NamedTuple

from scriba.errors import InvalidPositionError

POSITION_PART_MAX: Final = (1 << 63) - 1
_new_tuple: Final[Any] = tuple.__new__
_TEXT = re.compile(r"(\d{1,19}):(\d{1,19}):(\d{1,19})")


class _Parts(NamedTuple):
    segment_seq: int
    entry_id: int
    slot: int


class Position(_Parts):
    """A record's position (see the module docstring): an immutable, ordered triple."""

    __slots__ = ()

    def __new__(cls, segment_seq: int, entry_id: int, slot: int = 0) -> Position:
        if not (type(segment_seq) is int and type(entry_id) is int and type(slot) is int
                and 0 <= segment_seq <= POSITION_PART_MAX and 0 <= entry_id <= POSITION_PART_MAX
                and 0 <= slot <= POSITION_PART_MAX):
            for name, value in (("segment_seq", segment_seq), ("entry_id", entry_id), ("slot", slot)):
                if type(value) is not int or not 0 <= value <= POSITION_PART_MAX:
                    raise InvalidPositionError(f"position {name} must be an int in [0, 2**63), got {value!r}")
        return _new_tuple(cls, (segment_seq, entry_id, slot))

    def __str__(self) -> str:
        return f"{self.segment_seq}:{self.entry_id}:{self.slot}"

    @classmethod
    def parse(cls, text: str | Position) -> Position:
        """``"SEG:ENTRY:SLOT"`` (three decimal integers) -> ``Position``."""
        if isinstance(text, Position):
            return text
        if not isinstance(text, str):
            raise InvalidPositionError(f"position must be 'SEG:ENTRY:SLOT', got {text!r}")
        match = _TEXT.fullmatch(text.strip())
        if match is None:
            raise InvalidPositionError(
                f"position {text!r} does not parse: expected SEG:ENTRY:SLOT, e.g. '3:1200:0'"
            )
        return cls(*(int(g) for g in match.groups()))

    def successor(self) -> Position:
        """The next slot: where a reader resumes after this record."""
        return Position(self.segment_seq, self.entry_id, self.slot + 1)

    def segment_start(self) -> Position:
        return Position(self.segment_seq, 0, 0)

    @staticmethod
    def start_of(segment_seq: int) -> Position:
        return Position(segment_seq, 0, 0)


ZERO: Final = Position(0, 0, 0)


def trusted(segment_seq: int, entry_id: int, slot: int) -> Position:
    """A position from parts known to be valid (ledger entry ids, slots counted from 0):
    the writer's and the reader's per-record path, without the checks."""
    return _new_tuple(Position, (segment_seq, entry_id, slot))
