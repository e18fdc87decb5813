"""Effects: what the ledger cores ask their driver to do.

The cores (``write_core``, ``recovery_core``, ``read_core``) take events as method
calls and return a sequence of these frozen values; they never do I/O. A driver
(the asyncio ones in ``writer.py`` and ``operation.py``, or the simulation kit's
``scriba.testing.sim.SimDriver``) carries each effect out and feeds the outcome back
as another event.

Effects are cheap on purpose: ``WriteCore.append`` returns its one send as a plain
tuple (no effect object per entry), and the write path returns one ``CompleteAppends``
per advance of the last-add-confirmed, however many entries that advance confirms.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Final

from scriba.errors import ScribaError
from scriba.ids import BookieId, EntryId
from scriba.meta.records import LedgerMetadata


@dataclass(frozen=True, slots=True)
class SendAdd:
    """Send the packed ``entry`` to each of ``bookies`` (one add each)."""

    entry_id: EntryId
    entry: bytes
    bookies: tuple[BookieId, ...]
    recovery: bool = False


@dataclass(frozen=True, slots=True)
class CompleteAppends:
    """Entries ``first``..``last`` (inclusive) are confirmed, in this order."""

    first: EntryId
    last: EntryId


@dataclass(frozen=True, slots=True)
class FailAppends:
    """Every append not yet confirmed, ``first``..``last``, fails with ``error``.

    With ``LedgerFencedError`` or a timeout the outcome is indeterminate: the entry
    may still be in the ledger (a recovery may have kept it).
    """

    first: EntryId
    last: EntryId
    error: ScribaError


MetadataUpdate = tuple[Callable[[LedgerMetadata], bool], Callable[[LedgerMetadata], LedgerMetadata]]
"""``(needs_update, transform)`` for ``update_metadata``."""


@dataclass(frozen=True, slots=True)
class WriteMetadata:
    """Run ``update_metadata(store, ledger_key, LEDGER_CODEC, needs_update, transform)``.

    ``transform`` may raise a ``ScribaError`` to abort (the ledger is no longer
    OPEN, ...). Feed back ``on_metadata_written(record)`` or ``on_metadata_failed(err)``.
    """

    purpose: str  # "ensemble_change" | "close" | "recovery_start" | "recovery_close"
    needs_update: Callable[[LedgerMetadata], bool]
    transform: Callable[[LedgerMetadata], LedgerMetadata]


@dataclass(frozen=True, slots=True)
class ReadLac:
    """Read a bookie's last-add-confirmed; ``fence`` fences the ledger there first."""

    bookie_id: BookieId
    fence: bool = False


@dataclass(frozen=True, slots=True)
class ReadEntries:
    """Read ``entry_ids`` from one bookie (a range read when they are consecutive).

    Feed back one ``on_entry(bookie_id, entry_id, data, status)`` per id.
    """

    bookie_id: BookieId
    entry_ids: tuple[EntryId, ...]
    fence: bool = False


@dataclass(frozen=True, slots=True)
class StartTimer:
    """Call ``on_timer(key)`` after ``delay_s`` (stale timers are ignored by the core)."""

    key: Hashable
    delay_s: float


@dataclass(frozen=True, slots=True)
class DeliverEntries:
    """Verified entries, consecutive and in order, ready for the reader."""

    entries: tuple[object, ...]  # scriba.entry.Entry values


@dataclass(frozen=True, slots=True)
class OperationDone:
    """A recovery / read / LAC read finished; ``value`` is its result."""

    value: object


@dataclass(frozen=True, slots=True)
class OperationFailed:
    """A recovery / read / LAC read failed with ``error``."""

    error: ScribaError


Effect = (
    SendAdd
    | CompleteAppends
    | FailAppends
    | WriteMetadata
    | ReadLac
    | ReadEntries
    | StartTimer
    | DeliverEntries
    | OperationDone
    | OperationFailed
)
Effects = Sequence[Effect]
NO_EFFECTS: Final[tuple[Effect, ...]] = ()
