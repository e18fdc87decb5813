"""Which fragments of a ledger hold a replica on a given bookie, and what may be repaired.

A ledger's metadata lists its **segments**: ``(first_entry_id, ensemble)`` sorted by
first entry, each in force until the next one's first entry (the last until the
ledger's end). A **fragment** here is one segment's entries as seen by autorecovery:
its first and last entry and its ensemble. Which bookie of the ensemble holds which
entry is the write-set rule of ``scriba.quorum`` (through ``LedgerMetadata.write_set``);
nothing here re-derives it.

What is confirmed, and so may be copied (BookKeeper's ``LedgerFragment`` rules):

- a segment that is not the last ends where the next begins: the writer changed the
  ensemble at ``lac + 1`` with every earlier entry confirmed, so all of it is;
- the last segment of a CLOSED ledger ends at the ledger's last entry;
- the last segment of an OPEN (or IN_RECOVERY) ledger is still being written: only
  entries up to a last-add-confirmed read from its bookies may be copied
  (:func:`repairable_last`); the rest waits for the writer or for recovery.

A segment with no entry (a change at ``lac + 1`` followed by a close at ``lac``)
holds nothing and never needs repair.

Pure functions over records: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

from scriba.ids import INVALID_ENTRY_ID, BookieId, EntryId, LedgerId
from scriba.invariant import invariant
from scriba.meta.records import Ensemble, LedgerMetadata, LedgerState


@dataclass(frozen=True, slots=True)
class Fragment:
    """Entries ``first_entry_id..last_entry_id`` of one segment of a ledger.

    ``last_entry_id`` is None for the last segment of a ledger still being written
    (its end is not known yet). ``index`` is the segment's position in ``ensembles``.
    """

    ledger_id: LedgerId
    index: int
    first_entry_id: EntryId
    last_entry_id: EntryId | None
    ensemble: Ensemble

    @property
    def is_open(self) -> bool:
        return self.last_entry_id is None

    @property
    def is_empty(self) -> bool:
        return self.last_entry_id is not None and self.last_entry_id < self.first_entry_id

    def slots_of(self, bookies: Collection[BookieId]) -> tuple[int, ...]:
        """The ensemble slots held by any of ``bookies``."""
        return tuple(i for i, b in enumerate(self.ensemble) if b in bookies)


def fragments(md: LedgerMetadata) -> tuple[Fragment, ...]:
    """Every segment of the ledger as a fragment (empty ones included)."""
    out: list[Fragment] = []
    segments = md.ensembles
    for index, (first, ensemble) in enumerate(segments):
        last: EntryId | None
        if index + 1 < len(segments):
            last = EntryId(segments[index + 1][0] - 1)
            if md.is_closed:
                last = EntryId(min(last, md.last_entry_id))
        elif md.is_closed:
            last = md.last_entry_id
        else:
            last = None
        out.append(Fragment(md.ledger_id, index, first, last, ensemble))
    return tuple(out)


def fragments_using(md: LedgerMetadata, bookies: Collection[BookieId]) -> tuple[Fragment, ...]:
    """The non-empty fragments whose ensemble holds any of ``bookies``."""
    wanted = frozenset(bookies)
    return tuple(
        f for f in fragments(md) if not f.is_empty and any(b in wanted for b in f.ensemble)
    )


def fragment_at(md: LedgerMetadata, first_entry_id: int) -> Fragment | None:
    """The fragment whose segment starts at ``first_entry_id`` (None if no such segment)."""
    for f in fragments(md):
        if f.first_entry_id == first_entry_id:
            return f
    return None


def is_last_segment(md: LedgerMetadata, first_entry_id: int) -> bool:
    return md.ensembles[-1][0] == first_entry_id


def repairable_last(fragment: Fragment, lac: int) -> EntryId:
    """The last entry of ``fragment`` that may be copied now, given a LAC read of its ledger.

    A closed fragment: its own last entry. An open one (the writer's current segment):
    the LAC, which only confirmed entries reach; ``INVALID_ENTRY_ID``-like values below
    the fragment's first entry mean nothing may be copied yet.
    """
    if fragment.last_entry_id is not None:
        return fragment.last_entry_id
    return EntryId(max(lac, fragment.first_entry_id - 1, INVALID_ENTRY_ID))


def entries_on_slots(
    md: LedgerMetadata, first: int, last: int, slots: Collection[int]
) -> Iterator[EntryId]:
    """Entries in ``first..last`` whose write set holds any of ``slots``, in order (the
    write-set rule of ``scriba.quorum``)."""
    quorum = md.quorum
    invariant(all(0 <= s < md.ensemble_size for s in slots),
              f"slots {sorted(slots)} outside ensemble {md.ensemble_size}")
    for e in range(first, last + 1):
        if any(quorum.in_write_set(s, e) for s in slots):
            yield EntryId(e)


def writer_may_append(md: LedgerMetadata) -> bool:
    """Whether a writer (or recovery) may still add entries to the last segment."""
    return md.state is not LedgerState.CLOSED
