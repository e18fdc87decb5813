"""The states of a ledger's writer (``WriteCore``, ``write_core.py``, makes the moves)::

    OPEN --close()--> CLOSING --metadata written--> CLOSED
      \\--FENCED / metadata not OPEN / no replacement / too many changes--> FAILED

Only OPEN takes appends; CLOSING settles the pending entries, then writes the close; a
FAILED writer has failed every append past its LAC (a failed writer may still close at
that LAC unless the ledger is fenced or closed elsewhere). CLOSED and FAILED are final.
"""

from __future__ import annotations

import enum

__all__ = ["WriterState"]


class WriterState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"
