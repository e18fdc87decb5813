"""From bookie membership and ledger metadata to marks, and from marks to work (pure).

The auditor side: :class:`Membership` turns what the bookie registry says over time
into the set of **lost** bookies — gone for at least ``lost_bookie_recovery_delay_s``
(a bookie that comes back within the delay starts over; one never seen registered by
this auditor counts as gone since the auditor started, so a newly elected auditor
waits the delay again, as BookKeeper's does). :func:`marks_for` lists, for one ledger,
a :class:`~scriba.autorecovery.records.Mark` per (fragment, bookie) to move off.
:func:`placement_marks` picks, for a fragment whose ensemble breaks its placement
policy, one bookie whose replacement makes it meet the policy again.

The worker side: :func:`work_for` turns a record's marks back into the segments to
repair now, against the ledger's *current* metadata (segments may have been split or
changed since the marks were written): a bookie-wide mark (lost, recover,
decommission) covers every non-empty segment that still holds the bookie; a
fragment-wide one (unreadable, placement) only the segment it names. A LOST mark whose
bookie is registered again is dropped: a restart within the delay race is not a loss.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scriba.autorecovery.fragments import fragment_at, fragments, fragments_using
from scriba.autorecovery.records import Mark, Reason
from scriba.errors import NotEnoughBookiesError
from scriba.ids import BookieId, EntryId
from scriba.meta.records import LedgerMetadata

BOOKIE_WIDE = frozenset({Reason.LOST, Reason.RECOVER, Reason.DECOMMISSION})


@dataclass(slots=True)
class Membership:
    """When each bookie went; which have been gone for at least ``delay_s``."""

    delay_s: float
    started_at: float
    _gone_since: dict[BookieId, float] = field(default_factory=dict)
    _registered: frozenset[BookieId] = frozenset()

    def observe(self, registered: Collection[BookieId], now: float) -> None:
        """The bookies registered at ``now``."""
        now_set = frozenset(registered)
        for bookie in self._registered - now_set:
            self._gone_since.setdefault(bookie, now)
        for bookie in now_set:
            self._gone_since.pop(bookie, None)
        self._registered = now_set

    def referenced(self, bookies: Iterable[BookieId]) -> None:
        """Bookies that ledgers use: one never seen registered is gone since the start."""
        for bookie in bookies:
            if bookie not in self._registered:
                self._gone_since.setdefault(bookie, self.started_at)

    def lost(self, now: float) -> frozenset[BookieId]:
        return frozenset(b for b, t in self._gone_since.items() if now - t >= self.delay_s)

    def pending(self, now: float) -> dict[BookieId, float]:
        """Gone bookies within the delay, with the seconds left."""
        return {b: self.delay_s - (now - t) for b, t in sorted(self._gone_since.items())
                if now - t < self.delay_s}

    @property
    def registered(self) -> frozenset[BookieId]:
        return self._registered


def marks_for(md: LedgerMetadata, moves: Mapping[BookieId, Reason]) -> list[Mark]:
    """A mark per non-empty fragment that uses a bookie of ``moves`` (with its reason)."""
    out: list[Mark] = []
    for fragment in fragments_using(md, moves):
        for bookie in fragment.ensemble:
            reason = moves.get(bookie)
            if reason is not None:
                out.append(Mark(fragment.first_entry_id, bookie, reason))
    return out


def placement_marks(md: LedgerMetadata, topology: Any, policy: Any) -> list[Mark]:
    """For each fragment whose ensemble fails its policy (every bookie known to the
    topology), a mark on the first bookie whose replacement makes it meet the policy."""
    from scriba.placement import Adherence

    out: list[Mark] = []
    W, A = md.write_quorum_size, md.ack_quorum_size
    for fragment in fragments(md):
        ensemble = fragment.ensemble
        if fragment.is_empty or any(b not in topology.nodes for b in ensemble):
            continue
        if policy.adherence(topology, ensemble, W, A) is not Adherence.FAIL:
            continue
        for slot, bookie in enumerate(ensemble):
            try:
                result = policy.replace_bookie(topology, ensemble, slot, W, A)
            except NotEnoughBookiesError:
                continue
            if result.adherence is not Adherence.FAIL:
                out.append(Mark(fragment.first_entry_id, bookie, Reason.PLACEMENT))
                break
    return out


def work_for(
    md: LedgerMetadata, marks: Iterable[Mark], *, registered: Collection[BookieId]
) -> dict[EntryId, frozenset[BookieId]]:
    """Segments to repair now (by first entry) and the bookies to move off each."""
    work: dict[EntryId, set[BookieId]] = {}
    for mark in marks:
        if mark.reason.needs_absence and mark.bookie_id in registered:
            continue
        if mark.reason in BOOKIE_WIDE:
            firsts = [f.first_entry_id for f in fragments_using(md, (mark.bookie_id,))]
        else:
            fragment = fragment_at(md, mark.first_entry_id)
            holds = fragment is not None and not fragment.is_empty and mark.bookie_id in fragment.ensemble
            firsts = [mark.first_entry_id] if holds else []
        for first in firsts:
            work.setdefault(first, set()).add(mark.bookie_id)
    return {first: frozenset(b) for first, b in sorted(work.items())}


def references(md: LedgerMetadata, bookie: BookieId) -> bool:
    """Whether any non-empty fragment of the ledger uses ``bookie``."""
    return bool(fragments_using(md, (bookie,)))
