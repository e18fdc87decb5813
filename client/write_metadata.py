"""The writer's metadata changes: pure functions over ledger records, no I/O.

``ensemble_change_transform`` and ``close_transform`` return the ``(needs_update,
transform)`` pair that ``update_metadata``'s compare-and-set loop runs (``WriteMetadata``
effects of ``WriteCore`` carry them): ``needs_update`` tells from the record read whether
the change is still to be made (a recovery that closed the ledger at the writer's own
point counts as done), ``transform`` derives the new record or raises when the ledger is
no longer the writer's (closed elsewhere: ``LedgerClosedError``; being recovered:
``LedgerFencedError``). A new segment that starts where the last one starts replaces
it (no entry was confirmed since the previous change) instead of following it empty.

``region_shortfall`` is the rule of ``min_regions_for_durability = R``: an ensemble is
usable only when every write set's slots span ``R`` known regions; the writer checks it
at open and for each replacement, recovery and the auditor's repair plans too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from scriba.client.effects import MetadataUpdate
from scriba.errors import LedgerClosedError, LedgerFencedError, ScribaError
from scriba.ids import EntryId
from scriba.invariant import invariant
from scriba.meta.records import Ensemble, LedgerMetadata, LedgerState
from scriba.quorum import SlotRegions

__all__ = ["close_transform", "ensemble_change_transform", "region_shortfall"]


def region_shortfall(
    md: LedgerMetadata, ensemble: Ensemble, regions: Mapping[str, str] | None = None
) -> str:
    """Why ``ensemble`` cannot keep the record's ``min_regions_for_durability`` ("" when
    it can): some write set's slots do not span that many known regions (``regions``:
    the replacements' regions, beside the record's ``bookie_regions``)."""
    regions_min = md.min_regions_for_durability
    if regions_min == 1:
        return ""
    known = {**md.bookie_regions, **(regions or {})}
    slot_regions = SlotRegions.of([known.get(b) for b in ensemble])
    for slots in md.quorum.write_sets():
        spanned = slot_regions.count_slots(slots)
        if spanned < regions_min:
            where = ", ".join(f"{ensemble[i]}@{known.get(ensemble[i], '?')}" for i in slots)
            return (
                f"ledger {md.ledger_id}: constraint min_regions_for_durability={regions_min} "
                f"cannot be met: write set {where} spans {spanned} region(s)"
            )
    return ""


def _not_open_error(md: LedgerMetadata) -> ScribaError:
    if md.state is LedgerState.IN_RECOVERY:
        return LedgerFencedError(f"ledger {md.ledger_id} is being recovered by another client")
    return LedgerClosedError(f"ledger {md.ledger_id} is closed (last entry {md.last_entry_id})")


def ensemble_change_transform(
    first_entry_id: int, ensemble: Ensemble, regions: Mapping[str, str] | None = None
) -> MetadataUpdate:
    """needs_update/transform that make ``ensemble`` the segment from ``first_entry_id``.

    If the last segment already starts at ``first_entry_id`` (no entry confirmed since
    the previous change) it is replaced rather than followed by an empty one.
    ``regions`` (the replacements' regions) are added to the record's ``bookie_regions``.
    """

    def needs_update(md: LedgerMetadata) -> bool:
        return md.state is not LedgerState.OPEN or md.ensembles[-1] != (first_entry_id, ensemble)

    def transform(md: LedgerMetadata) -> LedgerMetadata:
        if md.state is not LedgerState.OPEN:
            raise _not_open_error(md)
        segments = md.ensembles
        if segments[-1][0] == first_entry_id:
            segments = segments[:-1]
        invariant(
            not segments or segments[-1][0] < first_entry_id,
            f"ledger {md.ledger_id}: new segment at {first_entry_id} is not after the last one",
        )
        known = {**md.bookie_regions, **regions} if regions else md.bookie_regions
        return dataclasses.replace(
            md, ensembles=(*segments, (EntryId(first_entry_id), ensemble)), bookie_regions=known
        )

    return needs_update, transform


def close_transform(
    last_entry_id: int, length: int, *, fenced_error: bool = True
) -> MetadataUpdate:
    """needs_update/transform for the writer's close at ``last_entry_id``.

    Already CLOSED at the same point (a recovery got there first) counts as done;
    closed elsewhere or being recovered raises.
    """

    def needs_update(md: LedgerMetadata) -> bool:
        if md.state is LedgerState.CLOSED:
            if md.last_entry_id == last_entry_id and md.length == length:
                return False
            raise LedgerFencedError(
                f"ledger {md.ledger_id} was closed at entry {md.last_entry_id} by another "
                f"client; this writer confirmed up to {last_entry_id}"
            )
        return True

    def transform(md: LedgerMetadata) -> LedgerMetadata:
        if md.state is not LedgerState.OPEN:
            raise _not_open_error(md)
        return dataclasses.replace(
            md,
            state=LedgerState.CLOSED,
            last_entry_id=EntryId(last_entry_id),
            length=length,
        )

    return needs_update, transform


