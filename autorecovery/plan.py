"""The repair of one fragment: what to copy, from where, to whom, and the metadata change.

Inputs: the ledger's metadata, the first entry of the segment to repair, the bookies
whose replicas must move off it, the placement topology and the ledger's own placement
policy (``scriba.placement``, built from the policy name and options recorded in the
metadata), the bookies no replacement may be (lost, draining), and, for the last
segment of a ledger still being written, a last-add-confirmed read from its bookies.

Output: a :class:`RepairPlan` (frozen): the entries to copy (those whose write set
holds a moved slot — ``scriba.quorum``'s rule), for each the replicas to read in order
(surviving ones first, the moved bookie last: a draining bookie still serves), the new
bookies to write, and :func:`ensemble_change`, the ``needs_update``/``transform`` pair
for ``scriba.meta.update_metadata`` that puts the new ensemble into the ledger's
metadata once every copy is durable.

Invariants the change keeps, whatever happened to the record since the plan was made
(a writer's ensemble change or close, a recovery, another worker's repair):

- it only ever claims entries that were copied: a segment is replaced whole only when
  the copied range reaches the segment's current end; otherwise it is split at the
  first entry not copied, the old ensemble keeping the rest (a writer still appending
  to its current segment keeps doing so on the bookies it writes to);
- it applies only to the ensemble it was planned against: the segment holds the old
  ensemble (apply), the new one (done already: no write), or anything else
  (:class:`StalePlanError`: read again and plan again);
- in the synchronous geo mode (``min_regions_for_durability = R > 1``, regions counted
  by the ack rule and by recovery from the record's ``bookie_regions``) it keeps that
  rule by the record, not only by the topology the policy saw: each replacement's
  region (from the topology) is recorded in ``bookie_regions`` with the change, the
  moved bookies that no segment uses any more leave it (so it names exactly the bookies
  of the ledger's ensembles), and a replacement after which some write set would span
  fewer than ``R`` recorded regions is refused (``NotEnoughBookiesError`` naming
  ``min_regions_for_durability``; its slot keeps its bookie and its mark) unless that
  segment broke the rule already (then moving off a lost bookie cannot make it worse
  and is not held back). Without this a repaired segment's new bookie counts toward no
  region, so a later recovery of the ledger could not prove its entries durable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scriba.autorecovery.fragments import Fragment, entries_on_slots, fragment_at, repairable_last
from scriba.client.write_metadata import region_shortfall
from scriba.errors import NotEnoughBookiesError, ScribaError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.invariant import InvariantViolation, invariant
from scriba.meta.records import Ensemble, LedgerMetadata


class StalePlanError(ScribaError):
    """The ledger's metadata changed under the plan: read it again and plan again."""

    retriable = True


ReadOrder = Callable[[Sequence[BookieId], Collection[BookieId]], list[BookieId]]
"""``(write_set, failed) -> bookies in the order to try`` (placement's ``read_order``)."""


@dataclass(frozen=True, slots=True)
class RepairPlan:
    ledger_id: LedgerId
    segment_first: EntryId  # the segment's key in ``ensembles``
    last_entry_id: EntryId  # copy ``segment_first..last_entry_id``; below the first: nothing
    old_ensemble: Ensemble
    new_ensemble: Ensemble
    slots: tuple[int, ...]  # the slots whose bookie is replaced
    reasons: tuple[str, ...] = ()
    regions: tuple[tuple[BookieId, str], ...] = ()  # the added bookies' regions, when regions count

    @property
    def copies_anything(self) -> bool:
        return self.last_entry_id >= self.segment_first

    @property
    def moved(self) -> tuple[BookieId, ...]:
        return tuple(self.old_ensemble[s] for s in self.slots)

    @property
    def added(self) -> tuple[BookieId, ...]:
        return tuple(self.new_ensemble[s] for s in self.slots)

    def entries(self, md: LedgerMetadata) -> Iterator[EntryId]:
        """The entries to copy, in order."""
        return entries_on_slots(md, self.segment_first, self.last_entry_id, self.slots)

    def targets(self, md: LedgerMetadata, entry_id: int) -> tuple[BookieId, ...]:
        """The new bookies that must receive ``entry_id``."""
        quorum = md.quorum
        return tuple(self.new_ensemble[s] for s in self.slots if quorum.in_write_set(s, entry_id))

    def sources(self, md: LedgerMetadata, entry_id: int, order: ReadOrder) -> list[BookieId]:
        """The replicas of ``entry_id`` to read from, in order (moved bookies last)."""
        write_set = [self.old_ensemble[s] for s in md.quorum.write_set(entry_id)]
        return order(write_set, self.moved)

    def describe(self) -> str:
        pairs = ", ".join(f"{a}->{b}" for a, b in zip(self.moved, self.added, strict=True))
        return (f"ledger {self.ledger_id} segment {self.segment_first}: entries "
                f"{self.segment_first}..{self.last_entry_id}, {pairs}")


def plan_repair(
    md: LedgerMetadata,
    segment_first: int,
    move: Collection[BookieId],
    *,
    topology: Any,
    policy: Any,
    exclude: Collection[BookieId] = (),
    lac: int | None = None,
) -> RepairPlan | None:
    """The repair of the segment starting at ``segment_first``; None if none is needed.

    ``policy.replace_bookie`` picks each replacement, keeping the ledger's placement
    constraints. A bookie that cannot be replaced now stays in the plan's ensemble (its
    mark stays in the record for a later pass) while the others move: a lost bookie is not
    kept waiting on a live one's replacement. ``NotEnoughBookiesError`` when none can
    move. ``lac`` is needed for the last segment of a ledger still being written.
    """
    fragment = fragment_at(md, segment_first)
    if fragment is None or fragment.is_empty:
        return None
    slots = fragment.slots_of(move)
    if not slots:
        return None
    last = _copy_bound(fragment, lac)
    ensemble = list(fragment.ensemble)
    excluded = set(exclude) | set(ensemble) | set(move)
    reasons: list[str] = []
    replaced: list[int] = []
    unplaced: list[NotEnoughBookiesError] = []
    regions: dict[str, str] = {}
    counted = md.min_regions_for_durability > 1
    kept_rule = counted and not region_shortfall(md, fragment.ensemble)
    for slot in slots:
        try:
            result = policy.replace_bookie(
                topology, tuple(ensemble), slot, md.write_quorum_size, md.ack_quorum_size,
                exclude=frozenset(excluded),
            )
        except NotEnoughBookiesError as exc:  # move the others now; this one waits for a bookie
            unplaced.append(exc)
            continue
        chosen = BookieId(result.bookies[slot])
        invariant(chosen not in excluded, f"placement chose excluded bookie {chosen}")
        if counted:
            region = region_of(topology, chosen)
            trial = (*ensemble[:slot], chosen, *ensemble[slot + 1:])
            short = region_shortfall(md, trial, {**regions, chosen: region} if region else regions)
            if short and kept_rule:  # by the record, not by the policy's view of the topology
                unplaced.append(NotEnoughBookiesError(
                    f"cannot replace {ensemble[slot]} with {chosen}@{region or '?'}: {short}"))
                continue
            if region:
                regions[chosen] = region
        ensemble[slot] = chosen
        excluded.add(chosen)
        replaced.append(slot)
        reasons.extend(result.reasons[:1])
    if not replaced:
        raise unplaced[0]
    return RepairPlan(
        ledger_id=md.ledger_id, segment_first=fragment.first_entry_id, last_entry_id=last,
        old_ensemble=fragment.ensemble, new_ensemble=tuple(ensemble), slots=tuple(replaced),
        reasons=tuple(reasons), regions=tuple((BookieId(b), r) for b, r in sorted(regions.items())),
    )


def region_of(topology: Any, bookie_id: BookieId) -> str | None:
    """The region a registered bookie is in (None when it is not in the topology)."""
    node = topology.nodes.get(bookie_id)
    return None if node is None else str(node.location.region)


def _regions_after(md: LedgerMetadata, plan: RepairPlan,
                   segments: Sequence[tuple[EntryId, tuple[BookieId, ...]]]) -> Mapping[str, str]:
    """``bookie_regions`` once ``plan`` is applied: its additions in, moved bookies that no
    segment uses any more out (the map names exactly the bookies of the ensembles)."""
    if md.min_regions_for_durability == 1:
        return md.bookie_regions
    used = {b for _first, ensemble in segments for b in ensemble}
    known = {b: r for b, r in md.bookie_regions.items() if b in used or b not in plan.moved}
    known.update(plan.regions)
    return known


def _copy_bound(fragment: Fragment, lac: int | None) -> EntryId:
    if fragment.is_open:
        invariant(lac is not None, f"ledger {fragment.ledger_id}: open segment needs a LAC")
        return repairable_last(fragment, lac if lac is not None else -1)
    return repairable_last(fragment, -1)


def ensemble_change(
    plan: RepairPlan,
) -> tuple[Callable[[LedgerMetadata], bool], Callable[[LedgerMetadata], LedgerMetadata]]:
    """``needs_update``/``transform`` for ``update_metadata`` (see the module docstring)."""
    def needs_update(md: LedgerMetadata) -> bool:
        fragment = fragment_at(md, plan.segment_first)
        if fragment is None:
            raise StalePlanError(
                f"ledger {plan.ledger_id}: no segment starts at {plan.segment_first} any more"
            )
        if fragment.ensemble == plan.new_ensemble:
            return False
        if fragment.ensemble != plan.old_ensemble:
            raise StalePlanError(
                f"ledger {plan.ledger_id} segment {plan.segment_first}: ensemble is now "
                f"{list(fragment.ensemble)}, planned against {list(plan.old_ensemble)}"
            )
        return True

    def transform(md: LedgerMetadata) -> LedgerMetadata:
        fragment = fragment_at(md, plan.segment_first)
        if fragment is None or fragment.ensemble != plan.old_ensemble:
            raise InvariantViolation(f"ledger {plan.ledger_id}: transform without needs_update")
        segments = list(md.ensembles)
        i = fragment.index
        whole = fragment.last_entry_id is not None and plan.last_entry_id >= fragment.last_entry_id
        if whole:
            segments[i] = (fragment.first_entry_id, plan.new_ensemble)
        else:
            invariant(plan.copies_anything, f"ledger {plan.ledger_id}: nothing copied to claim")
            rest = EntryId(plan.last_entry_id + 1)
            segments[i:i + 1] = [(fragment.first_entry_id, plan.new_ensemble), (rest, plan.old_ensemble)]
        return dataclasses.replace(md, ensembles=tuple(segments),
                                   bookie_regions=_regions_after(md, plan, segments))

    return needs_update, transform
