"""Ledger recovery: fence, find the last entry, re-replicate the tail, close. No I/O.

Phases::

    MARKING --IN_RECOVERY written--> FENCING --every write set covered--> READING
    READING --first absent entry--> WRITING --each entry on Qa bookies--> CLOSING --> DONE
    (any phase) --error--> FAILED          (already CLOSED at start or at close) --> DONE

Inputs: ``start()``, ``on_metadata_written(record)``, ``on_metadata_failed(err)``,
``on_lac_response(bookie, result, status)``, ``on_entry(bookie, entry, data, status)``,
``on_add_response(bookie, entry, status)``.
Outputs: ``WriteMetadata``, ``ReadLac(fence=True)``, ``ReadEntries(fence=True)``,
``SendAdd(recovery=True)``, and finally ``OperationDone(closed record)`` or
``OperationFailed(error)``.

Rules (BookKeeper's; the quorum arithmetic is ``scriba.quorum.Quorum``'s):
- fenced once ``(Qw - Qa) + 1`` bookies of *every* write set of the last segment
  answered the fencing LAC read: no old-writer add can then reach ``Qa`` acks;
- reading goes forward from ``max(LAC)`` with the fence flag; an entry is *present*
  if any replica returns it with a valid digest, *absent* only when ``Qw - Qa + 1``
  replicas of its write set say NO_SUCH_ENTRY; a corrupt copy, a valid copy whose
  header names another ledger or entry, or a failed read is *unknown*, never absent; an entry neither present nor absent fails the recovery
  (retriable), so the close is never below a confirmed entry;
- every recovered entry is re-written, unchanged, to its full write set with the
  recovery flag (done when ``Qa`` acknowledged), then the record is CAS-closed at the
  last recovered entry. A recoverer that finds the record CLOSED adopts it, so two
  concurrent recoverers end with the same record.
- with ``min_regions_for_durability > 1`` (regions count in the ack rule) "a quorum"
  above means ``Quorum.could_confirm``: ``Qa`` slots spanning that many regions of the
  record's ``bookie_regions``. Fencing is complete once the slots that did not answer
  could not confirm anything; an entry is absent once the replicas that did not deny it
  could not have confirmed it; a re-replicated entry is done at ``Qa`` acks spanning
  the regions, and has failed once the replicas left could not. So a ledger whose
  writer confirmed only entries held in two regions recovers, without loss, after a
  whole region is gone.
- a re-replication that can no longer succeed on its write set (failed slots, e.g. a
  lost region) is moved, when the recovery was given a ``choose_replacement``, to a new
  segment of the IN_RECOVERY record (BookKeeper's recovery adds through a handle that
  changes ensembles too): it starts at the first entry still being re-written (later
  segments are dropped: every entry from there to the recovered end is re-written to
  the new one before the close), its ensemble is the last one with every bookie that
  failed a re-write replaced, keeping ``min_regions_for_durability`` (else the recovery
  fails naming the constraint), and all those entries are re-sent to their new write
  sets. One change per round of failures, at most ``ensemble_changes_max``.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from scriba.client.effects import (
    NO_EFFECTS,
    Effect,
    Effects,
    MetadataUpdate,
    OperationDone,
    OperationFailed,
    ReadEntries,
    ReadLac,
    SendAdd,
    WriteMetadata,
)
from scriba.client.transport import LacResult
from scriba.client.write_core import ChooseReplacement, RegionOf
from scriba.client.write_metadata import region_shortfall
from scriba.config import require
from scriba.entry import Digest, unpack_entry
from scriba.errors import (
    DigestMismatchError,
    InternalError,
    LedgerClosedError,
    NotEnoughBookiesError,
    ScribaError,
    Status,
    UnauthorizedError,
    UnavailableError,
)
from scriba.ids import BookieId, EntryId
from scriba.invariant import invariant
from scriba.meta.records import LedgerMetadata, LedgerState
from scriba.quorum import EntryState


@dataclass(frozen=True, slots=True)
class RecoveryConfig:
    read_window: int = 16  # entries read ahead at once
    ensemble_changes_max: int = 4  # replacements while re-replicating the tail

    def validate(self) -> RecoveryConfig:
        require(self.read_window >= 1, "read_window", "must be >= 1")
        require(self.ensemble_changes_max >= 0, "ensemble_changes_max", "must be >= 0")
        return self


class RecoveryPhase(enum.Enum):
    MARKING = "marking"
    FENCING = "fencing"
    READING = "reading"
    WRITING = "writing"
    CLOSING = "closing"
    DONE = "done"
    FAILED = "failed"


@dataclass(slots=True)
class _EntryRead:
    expected: int  # replicas asked
    data: bytes | None = None
    length: int = 0
    no: int = 0
    no_slots: int = 0  # bit mask of the slots that said NO_SUCH_ENTRY
    unknown: int = 0
    statuses: list[str] = dataclasses.field(default_factory=list)

    @property
    def answered(self) -> int:
        return self.no + self.unknown + (1 if self.data is not None else 0)


@dataclass(slots=True)
class _EntryWrite:
    ok_slots: int = 0  # bit masks of the slots of its segment that acked / failed
    failed_slots: int = 0


def recovery_start_transform() -> MetadataUpdate:
    def needs_update(md: LedgerMetadata) -> bool:
        return md.state is LedgerState.OPEN

    def transform(md: LedgerMetadata) -> LedgerMetadata:
        return dataclasses.replace(md, state=LedgerState.IN_RECOVERY)

    return needs_update, transform


def recovery_segment_transform(
    first_entry_id: int, ensemble: tuple[BookieId, ...], regions: dict[str, str]
) -> MetadataUpdate:
    """needs_update/transform for a recovery's new segment from ``first_entry_id`` (the
    record must still be IN_RECOVERY; segments from there on are replaced)."""

    def needs_update(md: LedgerMetadata) -> bool:
        return md.state is not LedgerState.IN_RECOVERY or md.ensembles[-1] != (first_entry_id, ensemble)

    def transform(md: LedgerMetadata) -> LedgerMetadata:
        if md.state is not LedgerState.IN_RECOVERY:
            raise LedgerClosedError(f"ledger {md.ledger_id} is {md.state.value}, no longer in recovery")
        kept = tuple(seg for seg in md.ensembles if seg[0] < first_entry_id)
        return dataclasses.replace(
            md, ensembles=(*kept, (EntryId(first_entry_id), ensemble)),
            bookie_regions={**md.bookie_regions, **regions} if regions else md.bookie_regions,
        )

    return needs_update, transform


def recovery_close_transform(last_entry_id: int, length: int) -> MetadataUpdate:
    def needs_update(md: LedgerMetadata) -> bool:
        return md.state is not LedgerState.CLOSED  # already closed: adopt that record

    def transform(md: LedgerMetadata) -> LedgerMetadata:
        return dataclasses.replace(
            md, state=LedgerState.CLOSED, last_entry_id=EntryId(last_entry_id), length=length
        )

    return needs_update, transform


class RecoveryCore:
    """One recovery of one ledger (see the module docstring)."""

    def __init__(
        self,
        metadata: LedgerMetadata,
        *,
        digest: Digest,
        config: RecoveryConfig | None = None,
        choose_replacement: ChooseReplacement | None = None,
        region_of: RegionOf | None = None,
    ) -> None:
        self._config = (config or RecoveryConfig()).validate()
        self._choose = choose_replacement
        self._region_of = region_of
        self._md = metadata
        self._digest = digest
        self._ledger_id = int(metadata.ledger_id)
        self._quorum = metadata.quorum
        self._phase = RecoveryPhase.MARKING
        self._error: ScribaError | None = None
        # fencing
        self._fence_ok: set[int] = set()
        self._fence_failed: set[int] = set()
        self._fence_errors: list[str] = []
        self._fence_complete = False  # every write set covered (not: a recovery that failed fencing)
        self._max_lac = -1
        # reading
        self._start = 0
        self._base_length = 0
        self._reads: dict[int, _EntryRead] = {}
        self._next_read = 0
        self._next_decide = 0
        self._found: dict[int, tuple[bytes, int]] = {}  # entry -> (packed, total length)
        self._last = -1
        self._last_length = 0
        self._end_found = False
        # writing
        self._writes: dict[int, _EntryWrite] = {}
        self._write_data: dict[int, bytes] = {}  # every entry re-written, by id
        self._write_failed: set[BookieId] = set()  # bookies that failed a re-write
        self._changing = False
        self._changes = 0
        self._change_first = 0

    # --- views ------------------------------------------------------------------------
    @property
    def phase(self) -> RecoveryPhase:
        return self._phase

    @property
    def fenced(self) -> bool:
        """True once fencing reached every write set (the old writer can confirm nothing new),
        or the ledger was found closed; a recovery that failed while fencing never was."""
        return self._fence_complete or self._phase is RecoveryPhase.DONE

    @property
    def metadata(self) -> LedgerMetadata:
        return self._md

    @property
    def last_entry_id(self) -> int:
        return self._last

    # --- events -----------------------------------------------------------------------
    def start(self) -> Effects:
        if self._md.is_closed:
            self._phase = RecoveryPhase.DONE
            return (OperationDone(self._md),)
        needs_update, transform = recovery_start_transform()
        return (WriteMetadata("recovery_start", needs_update, transform),)

    def on_metadata_written(self, record: LedgerMetadata) -> Effects:
        self._md = record
        if self._phase is RecoveryPhase.MARKING:
            if record.is_closed:
                self._phase = RecoveryPhase.DONE
                return (OperationDone(record),)
            self._phase = RecoveryPhase.FENCING
            return tuple(ReadLac(b, fence=True) for b in record.current_ensemble)
        if self._phase is RecoveryPhase.WRITING and self._changing:
            return self._after_change()
        if self._phase is RecoveryPhase.CLOSING:
            invariant(record.is_closed, "recovery close wrote a record that is not CLOSED")
            self._phase = RecoveryPhase.DONE
            return (OperationDone(record),)
        return NO_EFFECTS

    def on_metadata_failed(self, error: ScribaError) -> Effects:
        return self._fail(error)

    def on_lac_response(
        self, bookie_id: BookieId, result: LacResult | None, status: int
    ) -> Effects:
        if self._phase is not RecoveryPhase.FENCING:
            return NO_EFFECTS
        ensemble = self._md.current_ensemble
        if bookie_id not in ensemble:
            return NO_EFFECTS
        index = ensemble.index(bookie_id)
        if status == Status.OK or status == Status.NO_SUCH_LEDGER:
            self._fence_ok.add(index)
            if result is not None:
                self._max_lac = max(self._max_lac, int(result.lac))
        else:
            if status == Status.UNAUTHORIZED:
                return self._fail(UnauthorizedError(f"bookie {bookie_id} rejected the master key"))
            self._fence_failed.add(index)
            self._fence_errors.append(f"{bookie_id}: {Status(status).name}")
        # Worst case for a bookie of unknown region: a region of its own (it could have
        # helped confirm something), so fencing never completes too early.
        regions = self._md.slot_regions(ensemble, unknown_distinct=True)
        if self._quorum.covers_every_write_set(self._fence_ok, regions):
            return self._begin_reading()
        if not self._quorum.can_still_cover(self._fence_failed, regions):
            return self._fail(
                UnavailableError(
                    f"ledger {self._ledger_id}: could not fence a quorum of every write set "
                    f"({'; '.join(self._fence_errors)})"
                )
            )
        return NO_EFFECTS

    def on_entry(
        self, bookie_id: BookieId, entry_id: int, data: bytes | None, status: int
    ) -> Effects:
        if self._phase is not RecoveryPhase.READING:
            return NO_EFFECTS
        read = self._reads.get(entry_id)
        if read is None or read.data is not None:
            return NO_EFFECTS
        if status == Status.OK and data is not None:
            try:
                entry = unpack_entry(self._digest, data)
            except DigestMismatchError:
                read.unknown += 1
                read.statuses.append(f"{bookie_id}: digest mismatch")
            else:
                if entry.ledger_id == self._ledger_id and entry.entry_id == entry_id:
                    read.data = data
                    read.length = entry.length
                else:
                    read.unknown += 1
                    read.statuses.append(f"{bookie_id}: wrong entry header")
        elif status == Status.NO_SUCH_ENTRY or status == Status.NO_SUCH_LEDGER:
            read.no += 1
            read.no_slots |= self._slot_bit(bookie_id, entry_id)
        elif status == Status.UNAUTHORIZED:
            return self._fail(UnauthorizedError(f"bookie {bookie_id} rejected the master key"))
        else:
            read.unknown += 1
            read.statuses.append(f"{bookie_id}: {Status(status).name}")
        return self._decide()

    def on_add_response(self, bookie_id: BookieId, entry_id: int, status: int) -> Effects:
        if self._phase is not RecoveryPhase.WRITING:
            return NO_EFFECTS
        write = self._writes.get(entry_id)
        if write is None:
            return NO_EFFECTS
        regions = self._md.slot_regions(self._md.ensemble_at(entry_id))
        bit = self._slot_bit(bookie_id, entry_id)
        if not bit:
            return NO_EFFECTS  # not (any longer) a bookie of its write set
        if status == Status.OK:
            write.ok_slots |= bit
            write.failed_slots &= ~bit
            acked_regions = regions.count(write.ok_slots) if regions is not None else 1
            if self._quorum.is_acked(write.ok_slots.bit_count(), acked_regions):
                del self._writes[entry_id]
                if not self._writes and not self._changing:
                    return self._begin_closing()
            return NO_EFFECTS
        if write.ok_slots & bit:
            return NO_EFFECTS  # a late failure of a copy it already holds
        write.failed_slots |= bit
        self._write_failed.add(bookie_id)
        left = None
        if regions is not None:
            left = regions.count(self._write_set_mask(entry_id) & ~write.failed_slots)
        if not self._quorum.can_still_ack(write.failed_slots.bit_count(), left):
            if self._changing:
                return NO_EFFECTS  # the change in progress re-sends it
            if self._choose is not None and self._changes < self._config.ensemble_changes_max:
                return self._change_ensemble(entry_id, status)
            return self._fail(
                UnavailableError(
                    f"ledger {self._ledger_id}: could not re-replicate entry {entry_id} to "
                    f"{self._quorum.ack_quorum_size} bookies"
                    + (
                        f" in {self._quorum.regions_min} regions (min_regions_for_durability)"
                        if regions is not None else ""
                    )
                    + " (last error "
                    f"{Status(status).name} from {bookie_id})"
                )
            )
        return NO_EFFECTS

    # --- internals --------------------------------------------------------------------
    def _slot_bit(self, bookie_id: BookieId, entry_id: int) -> int:
        """The slot bit of ``bookie_id`` in the write set of ``entry_id`` (0 if none)."""
        ensemble = self._md.ensemble_at(entry_id)
        for slot in self._quorum.write_set(entry_id):
            if ensemble[slot] == bookie_id:
                return 1 << slot
        return 0

    def _change_ensemble(self, entry_id: int, status: int) -> Effects:
        """Move the entries still being re-written to a new segment without the failed
        bookies (see the module docstring)."""
        first = min(self._writes)
        ensemble = self._md.current_ensemble
        failed = [slot for slot, b in enumerate(ensemble) if b in self._write_failed]
        new = list(ensemble)
        exclude = set(ensemble) | self._write_failed
        regions: dict[str, str] = {}
        invariant(self._choose is not None, "change without a chooser")
        try:
            for slot in failed:
                chosen = self._choose(tuple(new), slot, frozenset(exclude))  # type: ignore[misc]
                new[slot] = chosen
                exclude.add(chosen)
                region = self._region_of(chosen) if self._region_of else None
                if region:
                    regions[chosen] = region
            short = region_shortfall(self._md, tuple(new), regions)
            if short:
                raise NotEnoughBookiesError(short)
        except NotEnoughBookiesError as exc:
            return self._fail(
                NotEnoughBookiesError(
                    f"ledger {self._ledger_id}: recovery could not replace the bookies that "
                    f"failed re-replication: {exc}"
                )
            )
        self._changing = True
        self._changes += 1
        self._change_first = first
        needs_update, transform = recovery_segment_transform(first, tuple(new), regions)
        return (WriteMetadata("recovery_ensemble_change", needs_update, transform),)

    def _after_change(self) -> Effects:
        """The new segment is written: re-send every entry still being re-written."""
        self._changing = False
        effects: list[Effect] = []
        for entry_id in sorted(e for e in self._write_data if e >= self._change_first):
            self._writes[entry_id] = _EntryWrite()
            effects.append(
                SendAdd(EntryId(entry_id), self._write_data[entry_id], self._md.write_set(entry_id),
                        recovery=True)
            )
        if not self._writes:
            return self._begin_closing()
        return effects

    def _write_set_mask(self, entry_id: int) -> int:
        return self._quorum.write_set_masks()[entry_id % self._quorum.ensemble_size]

    def _could_have_confirmed(self, entry_id: int, read: _EntryRead) -> bool:
        """Whether the replicas of ``entry_id`` that did not deny it could have confirmed it."""
        regions = self._md.slot_regions(self._md.ensemble_at(entry_id), unknown_distinct=True)
        if regions is None:
            return True
        others = self._write_set_mask(entry_id) & ~read.no_slots
        return self._quorum.could_confirm([s for s in range(others.bit_length()) if others >> s & 1], regions)

    def _begin_reading(self) -> Effects:
        self._phase = RecoveryPhase.READING
        self._fence_complete = True
        # Read the LAC entry too: it is confirmed, and its header gives the length.
        self._start = max(self._max_lac, 0)
        self._next_read = self._start
        self._next_decide = self._start
        self._last = self._max_lac
        return self._issue_reads()

    def _issue_reads(self) -> Effects:
        by_bookie: dict[BookieId, list[EntryId]] = {}
        while not self._end_found and self._next_read < self._next_decide + self._config.read_window:
            entry_id = self._next_read
            self._next_read += 1
            write_set = self._md.write_set(entry_id)
            self._reads[entry_id] = _EntryRead(expected=len(write_set))
            for bookie_id in write_set:
                by_bookie.setdefault(bookie_id, []).append(EntryId(entry_id))
        return tuple(ReadEntries(b, tuple(ids), fence=True) for b, ids in by_bookie.items())

    def _decide(self) -> Effects:
        entry_state = self._quorum.entry_state
        while not self._end_found:
            read = self._reads.get(self._next_decide)
            if read is None:
                break
            entry_id = self._next_decide
            state = entry_state(
                present=read.data is not None, missing=read.no, answered=read.answered,
                asked=read.expected,
                could_have_confirmed=not read.no or self._could_have_confirmed(entry_id, read),
            )
            if state is EntryState.PRESENT and read.data is not None:
                self._found[entry_id] = (read.data, read.length)
                self._last = entry_id
                self._last_length = read.length
                del self._reads[entry_id]
                self._next_decide += 1
                continue
            if state is EntryState.ABSENT:
                if entry_id <= self._max_lac:
                    return self._fail(
                        InternalError(
                            f"ledger {self._ledger_id}: entry {entry_id} is at or below a "
                            f"bookie's LAC ({self._max_lac}) yet {read.no} replicas lack it"
                        )
                    )
                self._end_found = True
                self._reads.clear()
                break
            if state is EntryState.UNKNOWN:
                return self._fail(
                    UnavailableError(
                        f"ledger {self._ledger_id}: cannot tell whether entry {entry_id} exists "
                        f"({read.no} replicas lack it, need {self._quorum.fence_quorum}; "
                        f"unknown: {', '.join(read.statuses)})"
                    )
                )
            break
        if self._end_found:
            return self._begin_writing()
        return self._issue_reads()

    def _begin_writing(self) -> Effects:
        self._phase = RecoveryPhase.WRITING
        if self._last < 0:
            self._last_length = 0
        effects: list[Effect] = []
        for entry_id in sorted(self._found):
            if entry_id <= self._max_lac:
                continue  # confirmed by the writer: already on an ack quorum
            data, _ = self._found[entry_id]
            self._writes[entry_id] = _EntryWrite()
            self._write_data[entry_id] = data
            effects.append(
                SendAdd(EntryId(entry_id), data, self._md.write_set(entry_id), recovery=True)
            )
        self._found.clear()
        if not self._writes:
            return self._begin_closing()
        return effects

    def _begin_closing(self) -> Effects:
        self._phase = RecoveryPhase.CLOSING
        needs_update, transform = recovery_close_transform(self._last, self._last_length)
        return (WriteMetadata("recovery_close", needs_update, transform),)

    def _fail(self, error: ScribaError) -> Effects:
        if self._phase in (RecoveryPhase.DONE, RecoveryPhase.FAILED):
            return NO_EFFECTS
        self._phase = RecoveryPhase.FAILED
        self._error = error
        return (OperationFailed(error),)
