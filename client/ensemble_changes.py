"""Ensemble changes of ``WriteCore``: replacing a failed bookie of the current ensemble.

A mixin of ``WriteCore`` (``write_core.py``; its methods run on the core, its fields are
the core's). It is the path of bookie failures, off the add path: an add failure that is
not a request error (TIMEOUT, UNAVAILABLE, READ_ONLY, ...) from a bookie of the current
ensemble, even for an entry the rest of its write set already confirmed, starts a change.

A change (``_start_change``): the failed bookies' acks for unconfirmed entries stop
counting and nothing more is sent to them (``_stop_using``); placement chooses a
replacement for each (``_replacements``, which refuses an ensemble that breaks
``min_regions_for_durability``); the new segment, from the first entry a failing slot has
not received, is written as metadata (``WriteMetadata("ensemble_change")``); once it is
written the core re-sends (``_resend``) the held confirmed entries and every unconfirmed
one to the new bookies of their write sets. Failures during a change wait for it
(``_failing_next``). No spare bookie: wait ``replacement_retry_s`` (``StartTimer``), ask
placement again (``on_timer``), and failing that re-send to the same bookies; every round
counts against ``ensemble_changes_max``, past which the writer fails.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from scriba.client.effects import NO_EFFECTS, Effect, Effects, SendAdd, StartTimer, WriteMetadata
from scriba.client.write_metadata import ensemble_change_transform
from scriba.client.writer_state import WriterState
from scriba.errors import (
    ADD_ANSWERS,
    AddAnswer,
    LedgerFencedError,
    NotEnoughBookiesError,
    ScribaError,
    Status,
    UnauthorizedError,
    error_for_status,
)
from scriba.ids import BookieId, EntryId
from scriba.invariant import invariant
from scriba.meta.records import Ensemble

if TYPE_CHECKING:
    from scriba.client.write_core import WriteCore

__all__ = ["EnsembleChanges"]


class EnsembleChanges:
    """The ensemble-change methods of ``WriteCore`` (see the module docstring)."""

    # The core's fields these methods set besides counters (first values: WriteCore.__init__).
    _change: tuple[int, Ensemble, frozenset[BookieId]] | None
    _retry_pending: frozenset[BookieId] | None
    _failing_next: set[BookieId]
    _new_regions: dict[str, str]
    _shortage: str

    def _on_add_error(self: WriteCore, bookie_id: BookieId, entry_id: int, status: Status) -> Effects:  # type: ignore[misc]  # a mixin method of WriteCore
        if self._state is WriterState.CLOSED or self._error is not None:
            # A late answer after the close, or after a failure (also while a failed writer
            # closes): every append past the lac is failed already, nothing is left to protect.
            return NO_EFFECTS
        if ADD_ANSWERS[status] is AddAnswer.REQUEST_ERROR:  # any bookie would refuse it
            if status is Status.FENCED:
                error: ScribaError = LedgerFencedError(
                    f"ledger {self._ledger_id}: bookie {bookie_id} is fenced (another client "
                    f"recovered the ledger); entry {entry_id} is indeterminate"
                )
            elif status is Status.UNAUTHORIZED:
                error = UnauthorizedError(f"bookie {bookie_id} rejected the master key")
            else:
                error = error_for_status(
                    status, f"ledger {self._ledger_id}: bookie {bookie_id} refused entry {entry_id}"
                )
            return self._fail(error)
        if self._state is WriterState.CLOSING and self._closing_sent:
            return NO_EFFECTS  # every entry is settled and the close is being written
        if bookie_id not in self._index or bookie_id in self._failing:
            return NO_EFFECTS  # replaced already, or being replaced
        if self._change is not None or self._retry_pending is not None:
            self._failing_next.add(bookie_id)
            return NO_EFFECTS
        return self._start_change({bookie_id})

    def _start_change(self: WriteCore, failed: set[BookieId]) -> Effects:  # type: ignore[misc]  # a mixin method of WriteCore
        if self._changes >= self._config.ensemble_changes_max:
            return self._fail(
                NotEnoughBookiesError(
                    f"ledger {self._ledger_id}: {self._changes} ensemble changes, the "
                    f"limit (ensemble_changes_max); bookies {sorted(failed)} failed"
                    + (f"; last refusal: {self._shortage}" if self._shortage else "")
                )
            )
        self._stop_using(failed)
        try:
            new_ensemble = self._replacements(failed)
        except NotEnoughBookiesError as exc:
            self._shortage = str(exc)
            # No spare bookie now: wait, then try placement again, else retry the same ones.
            self._changes += 1
            self._retry_seq += 1
            self._retry_pending = frozenset(failed)
            return (StartTimer(("replace", self._retry_seq), self._config.replacement_retry_s),)
        except ScribaError as exc:
            return self._fail(exc)
        return self._write_change(failed, new_ensemble)

    def _stop_using(self: WriteCore, failed: Collection[BookieId]) -> None:  # type: ignore[misc]  # a mixin method of WriteCore
        """Acks of ``failed`` no longer count for unconfirmed entries, and nothing more
        is sent to them until they are replaced (or retried when no spare exists)."""
        clear = 0
        for bookie_id in failed:
            clear |= 1 << self._index[bookie_id]
        keep = ~clear
        masks = self._masks
        for entry_id in masks:
            masks[entry_id] &= keep
        self._failing |= set(failed)
        self._rebuild_send_sets()

    def _replacements(self: WriteCore, failed: Collection[BookieId]) -> Ensemble:  # type: ignore[misc]  # a mixin method of WriteCore
        """The ensemble with ``failed`` replaced; NotEnoughBookiesError when placement
        finds no spare or the result would break ``min_regions_for_durability``."""
        ensemble = list(self._ensemble)
        exclude = set(ensemble) | set(failed)
        regions: dict[str, str] = {}
        for bookie_id in sorted(failed):
            index = self._index[bookie_id]
            replacement = self._choose(tuple(ensemble), index, frozenset(exclude))
            invariant(replacement not in exclude, f"placement chose excluded {replacement}")
            ensemble[index] = replacement
            exclude.add(replacement)
            region = self._region_of(replacement) if self._region_of and self._regions_min > 1 else None
            if region:
                regions[replacement] = region
        result = tuple(ensemble)
        short = self._region_shortfall(result, regions)
        if short:
            raise NotEnoughBookiesError(short)
        self._new_regions = regions
        return result

    def _write_change(self: WriteCore, failed: Collection[BookieId], new_ensemble: Ensemble) -> Effects:  # type: ignore[misc]  # a mixin method of WriteCore
        # The new segment starts at the first entry a failing slot has not received: entries
        # confirmed since the slot began failing (a wait for a spare) belong to it too.
        first = min(self._unreplicated, default=self._lac + 1)
        self._change = (first, new_ensemble, frozenset(failed))
        needs_update, transform = ensemble_change_transform(
            first, new_ensemble, self._new_regions if self._regions_min > 1 else None
        )
        return (WriteMetadata("ensemble_change", needs_update, transform),)

    def on_timer(self: WriteCore, key: object) -> Effects:  # type: ignore[misc]  # a mixin method of WriteCore
        """A replacement retry is due (``StartTimer(("replace", n), ...)``)."""
        if (
            not isinstance(key, tuple)
            or key != ("replace", self._retry_seq)
            or self._retry_pending is None
            or self._state not in (WriterState.OPEN, WriterState.CLOSING)
        ):
            return NO_EFFECTS
        failed = set(self._retry_pending) | (self._failing_next & set(self._ensemble))
        self._retry_pending = None
        self._failing_next = set()
        self._stop_using(failed)
        try:
            new_ensemble = self._replacements(failed)
        except NotEnoughBookiesError as exc:
            self._shortage = str(exc)
            # Still no spare: try the same bookies again (a bookie that is really gone
            # fails again, and each round counts against ensemble_changes_max).
            self._failing -= failed
            self._rebuild_send_sets()
            effects: list[Effect] = list(self._resend({self._index[b] for b in failed}))
            if self._state is WriterState.CLOSING:
                effects.extend(self._maybe_send_close())
            return effects
        except ScribaError as exc:
            return self._fail(exc)
        return self._write_change(failed, new_ensemble)

    def _resend(self: WriteCore, slots: set[int]) -> list[Effect]:  # type: ignore[misc]  # a mixin method of WriteCore
        """SendAdd to the bookies in ``slots`` of every entry their write sets miss: the
        confirmed ones held while a slot was failing, then every unconfirmed one."""
        effects: list[Effect] = []
        ensemble = self._ensemble
        write_set = self._quorum.write_set
        held = self._unreplicated
        for entry_id in sorted(held):
            targets = tuple(ensemble[slot] for slot in write_set(entry_id) if slot in slots)
            if targets:
                effects.append(SendAdd(EntryId(entry_id), held[entry_id], targets))
        if not self._failing:  # every slot is served again: nothing left to hold
            self._bytes_inflight -= sum(map(len, held.values()))
            held.clear()
        for entry_id in range(self._lac + 1, self._next):
            packed = self._packed.get(entry_id)
            if packed is None:
                continue
            targets = tuple(ensemble[slot] for slot in write_set(entry_id) if slot in slots)
            if targets:
                effects.append(SendAdd(EntryId(entry_id), packed, targets))
        return effects

