"""The write path of one ledger: quorum bookkeeping and ensemble changes, no I/O.

States::

    OPEN --close()--> CLOSING --metadata written--> CLOSED
      |  \\--bookie error--> (change in progress, still OPEN) --metadata written--> OPEN
      \\--FENCED / metadata not OPEN / no replacement--> FAILED

Inputs (method calls): ``append(payload)`` (the one way in for an entry: the driver
and the simulation both use it), ``on_add_response(bookie, entry, status)``
(or ``on_add_responses(bookie, entries, status)`` for many answers at once),
``close()``, ``on_metadata_written(record)``, ``on_metadata_failed(error)``, ``on_timer(key)``.
Outputs: sequences of effects (``client/effects.py``): ``SendAdd`` (re-sends after an
ensemble change), ``CompleteAppends`` (a range, in order), ``FailAppends``,
``WriteMetadata``, ``StartTimer``. ``append`` returns its one send as a plain tuple
``(entry_id, packed entry, write set's bookies)`` instead of an effect object (the hot
path allocates nothing else per entry), or None when the in-flight bounds are full.

When placement finds no spare bookie, the writer waits ``replacement_retry_s``,
asks placement again, and failing that re-sends to the same bookie (a transient
failure in a cluster of exactly E bookies heals); every round counts against
``ensemble_changes_max``.

Invariants (the quorum arithmetic is ``scriba.quorum.Quorum``'s, tabled per segment):
- entry ids are consecutive from the ledger's next id; entry ``e`` goes to the bookies
  of its write set (``Quorum.write_set``) in the segment that holds it;
- ``e`` is confirmed once ``Qa`` bookies of its write set acknowledged it *and* every
  entry below it is confirmed, so confirmations leave strictly in order and the
  last-add-confirmed (``lac``) never decreases;
- an ack counts only from a bookie that holds that slot in the segment that will
  hold the entry: when a bookie is replaced, its acks for unconfirmed entries are
  dropped and those entries are re-sent to the replacement after the new segment
  (starting at the first unconfirmed entry) is in the metadata;
- with ``min_regions_for_durability = R > 1`` (the synchronous geo mode) the ack rule
  also counts regions: ``e`` is durable once its acks span ``R`` regions as well
  (``Quorum.is_acked(acks, regions)``). The regions of the current segment's slots are
  a table of region bits (``scriba.quorum.SlotRegions``, from the record's
  ``bookie_regions``), so the region count of an ack mask is a cached lookup done only
  when the count rule already holds; with ``R == 1`` the table is None and the hot
  path pays one ``is None`` test per confirmation. Every segment the writer uses keeps
  the constraint: a write set whose slots cannot span ``R`` regions is refused with
  ``NotEnoughBookiesError`` naming ``min_regions_for_durability`` (at open, and for a
  replacement, where it counts like a missing spare: wait, retry, then fail);
- every entry carries the ``lac`` known when it was packed (piggybacked LAC);
- an add refused as a request error (``scriba.errors.ADD_ANSWERS``: fenced, wrong key,
  malformed, ...) fails the writer with that status's error; any other failure
  (TIMEOUT, UNAVAILABLE, READ_ONLY, ...) from a bookie of the current ensemble starts
  a change replacing it, even when the entry was already confirmed by the rest of its
  write set (a late failure): the new segment starts at the first unconfirmed entry,
  or at the next entry id when every entry is confirmed;
- the replacement receives every entry of its new segment: entries the rest of the
  write set confirmed while the slot was failing (the change being written, or a wait
  for a spare) are held, counted in flight, and sent to it once the change is written
  (BookKeeper holds the confirmations instead; holding only the bytes keeps them flowing).

Ensemble changes are bounded (``ensemble_changes_max``); in-flight entries and bytes
are bounded: ``append`` returns None instead of going past them (the driver queues).
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import google_crc32c

from scriba.client.effects import (
    NO_EFFECTS,
    CompleteAppends,
    Effect,
    Effects,
    FailAppends,
    MetadataUpdate,
    SendAdd,
    StartTimer,
    WriteMetadata,
)
from scriba.config import require
from scriba.entry import HEADER, Crc32cDigest, Digest, pack_entry
from scriba.errors import (
    ADD_ANSWERS,
    AddAnswer,
    LedgerClosedError,
    LedgerFencedError,
    NotEnoughBookiesError,
    ScribaError,
    Status,
    UnauthorizedError,
    error_for_status,
)
from scriba.ids import BookieId, EntryId
from scriba.invariant import invariant
from scriba.meta.records import Ensemble, LedgerMetadata, LedgerState
from scriba.quorum import Quorum, SlotRegions

_pack_header: Final = HEADER.pack
_crc_value: Final = google_crc32c.value
_crc_extend: Final = google_crc32c.extend
_crc_bytes: Final = struct.Struct(">I").pack

Append = tuple[int, bytes, tuple[BookieId, ...]]
"""What ``WriteCore.append`` returns: ``(entry_id, packed entry, bookies to send it to)``."""

ChooseReplacement = Callable[[Ensemble, int, frozenset[BookieId]], BookieId]
"""``(ensemble, failed_index, exclude) -> replacement``; raises NotEnoughBookiesError."""

RegionOf = Callable[[BookieId], "str | None"]
"""``bookie -> its region`` (None when unknown); recorded for replacements when regions count."""


@dataclass(frozen=True, slots=True)
class WriteConfig:
    entries_inflight_max: int = 20_000
    bytes_inflight_max: int = 64 * 1024 * 1024
    ensemble_changes_max: int = 32
    replacement_retry_s: float = 0.5  # no spare bookie: wait this long, then retry

    def validate(self) -> WriteConfig:
        require(self.entries_inflight_max >= 1, "entries_inflight_max", "must be >= 1")
        require(self.bytes_inflight_max >= 1, "bytes_inflight_max", "must be >= 1")
        require(self.ensemble_changes_max >= 0, "ensemble_changes_max", "must be >= 0")
        require(self.replacement_retry_s > 0, "replacement_retry_s", "must be > 0")
        return self


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


class WriterState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"


# --- pure metadata transforms (run inside update_metadata's CAS loop) -----------


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


# --- the core -------------------------------------------------------------------


class WriteCore:
    """Per-ledger write state machine (see the module docstring)."""

    def __init__(
        self,
        metadata: LedgerMetadata,
        *,
        digest: Digest,
        choose_replacement: ChooseReplacement,
        config: WriteConfig | None = None,
        region_of: RegionOf | None = None,
    ) -> None:
        invariant(metadata.state is LedgerState.OPEN, f"ledger {metadata.ledger_id} is not OPEN")
        self._config = (config or WriteConfig()).validate()
        self._md = metadata
        self._ledger_id = int(metadata.ledger_id)
        self._digest = digest
        self._choose = choose_replacement
        self._region_of = region_of
        quorum = self._quorum = metadata.quorum
        self._E = metadata.ensemble_size
        self._Qa = metadata.ack_quorum_size  # the ack rule (Quorum.is_acked), inlined below
        self._partial_write_sets = metadata.write_quorum_size < self._E
        self._set_masks = quorum.write_set_masks()  # per entry_id % E: slots whose acks count
        self._regions_min = quorum.regions_min
        self._regions: SlotRegions | None = None  # the current segment's; None: not counted
        self._crc32c = type(digest) is Crc32cDigest
        self._entries_max = self._config.entries_inflight_max
        self._bytes_max = self._config.bytes_inflight_max
        self._next = int(metadata.last_entry_id) + 1
        self._lac = int(metadata.last_entry_id)
        self._length = metadata.length  # total length through the last appended entry
        self._lac_length = metadata.length  # total length through the lac (when packed is b"")
        self._lac_packed = b""  # packed entry at the lac, if confirmed by this writer
        self._masks: dict[int, int] = {}  # unconfirmed entry -> bitmask of acked slots
        self._packed: dict[int, bytes] = {}  # unconfirmed entry -> packed bytes
        # Entries confirmed while a slot was failing (so never sent to it): kept, and counted
        # in flight, until they are sent to that slot's replacement (or to it again).
        self._unreplicated: dict[int, bytes] = {}
        self._bytes_inflight = 0
        self._state = WriterState.OPEN
        self._error: ScribaError | None = None
        self._changes = 0
        self._failing: set[BookieId] = set()  # unused until replaced (or retried)
        self._failing_next: set[BookieId] = set()  # failed while a change was in progress
        self._change: tuple[int, Ensemble, frozenset[BookieId]] | None = None
        self._closing_sent = False
        self._retry_pending: frozenset[BookieId] | None = None  # waiting for a spare bookie
        self._retry_seq = 0
        self._shortage = ""  # the last reason no replacement was found
        self._new_regions: dict[str, str] = {}  # regions of the replacements being written
        self._set_ensemble(metadata.current_ensemble)
        short = self._region_shortfall(metadata.current_ensemble)
        if short:
            raise NotEnoughBookiesError(short)

    # --- read-only views ----------------------------------------------------------
    @property
    def ledger_id(self) -> int:
        return self._ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def next_entry_id(self) -> int:
        return self._next

    @property
    def length(self) -> int:
        """Total payload bytes through the last confirmed entry."""
        if self._lac_packed:
            self._lac_length = HEADER.unpack_from(self._lac_packed)[3]
            self._lac_packed = b""
        return self._lac_length

    @property
    def metadata(self) -> LedgerMetadata:
        return self._md

    @property
    def state(self) -> WriterState:
        return self._state

    @property
    def error(self) -> ScribaError | None:
        return self._error

    @property
    def ensemble(self) -> Ensemble:
        return tuple(self._ensemble)

    @property
    def fence_probe_target(self) -> tuple[Ensemble, Quorum, SlotRegions | None] | None:
        """What an unfenced probe asks (``client.fence_probe``): the current ensemble, the
        quorum and the ack rule's regions; None once the writer is not OPEN or while an
        ensemble change is being written (the record may already name the new ensemble)."""
        if self._state is not WriterState.OPEN or self._change is not None:
            return None
        return tuple(self._ensemble), self._quorum, self._regions

    @property
    def bytes_inflight(self) -> int:
        """Packed bytes held: unconfirmed entries, and confirmed ones not yet on every slot."""
        return self._bytes_inflight

    @property
    def pending(self) -> int:
        return len(self._masks)

    @property
    def changing(self) -> bool:
        return self._change is not None

    def check_appendable(self) -> None:
        """Raise the error an append would meet now (closed, fenced, failed)."""
        if self._state is WriterState.OPEN:
            return
        if self._error is not None:
            raise self._error
        raise LedgerClosedError(f"ledger {self._ledger_id} is closed; no more appends")

    # --- events ---------------------------------------------------------------------
    def append(self, payload: bytes) -> Append | None:
        """Assign the next entry id to ``payload`` and pack it (the piggybacked LAC, the
        running length, the digest); returns ``(entry_id, packed, bookies to send it to)``.

        None when the in-flight bounds (entries, bytes) have no room for it: nothing
        changed, append it again once answers free room. Raises the writer's error
        when it cannot append at all (closed, fenced, failed).
        """
        masks = self._masks
        if masks and (
            len(masks) >= self._entries_max or self._bytes_inflight + len(payload) > self._bytes_max
        ):
            self.check_appendable()
            return None
        if self._state is not WriterState.OPEN:
            self.check_appendable()
        entry_id = self._next
        length = self._length + len(payload)
        if self._crc32c:  # pack_entry with the CRC32C digest, without two calls
            header = _pack_header(self._ledger_id, entry_id, self._lac, length)
            packed = b"".join((header, _crc_bytes(_crc_extend(_crc_value(header), payload)), payload))
        else:
            packed = pack_entry(self._digest, self._ledger_id, entry_id, self._lac, length, payload)
        self._next = entry_id + 1
        self._length = length
        masks[entry_id] = 0
        self._packed[entry_id] = packed
        self._bytes_inflight += len(packed)
        return entry_id, packed, self._send_sets[entry_id % self._E]

    def on_add_response(self, bookie_id: BookieId, entry_id: int, status: int) -> Effects:
        mask = self._masks.get(entry_id)
        if mask is None:  # confirmed already, failed, or never ours
            if status == 0:
                return NO_EFFECTS
            # A late failure (the entry was confirmed by the rest of its write set)
            # still means this bookie is dead or slow: replace it, like BookKeeper,
            # so later entries do not sit on fewer replicas.
            return self._on_add_error(bookie_id, entry_id, Status(status))
        if status == 0:  # Status.OK, compared as an int on the hot path
            bit = self._ack_bits.get(bookie_id)  # bookies whose acks count now
            if bit is None:
                return NO_EFFECTS
            if self._partial_write_sets and not bit & self._set_masks[entry_id % self._E]:
                return NO_EFFECTS  # not a slot of this entry's write set
            mask |= bit
            self._masks[entry_id] = mask
            if entry_id == self._lac + 1 and mask.bit_count() >= self._Qa:
                regions = self._regions
                if regions is None or regions.count(mask) >= self._regions_min:
                    return self._advance()
            return NO_EFFECTS
        return self._on_add_error(bookie_id, entry_id, Status(status))

    def on_add_responses(self, bookie_id: BookieId, entry_ids: Iterable[int], status: int) -> Effects:
        """Many answers of one bookie with one status (a batched transport answer).

        The same outcome as ``on_add_response`` for each id in turn; the LAC advances
        once, at the end (one ``CompleteAppends`` for the whole advance)."""
        if status != 0:
            effects: list[Effect] = []
            for entry_id in entry_ids:
                effects.extend(self.on_add_response(bookie_id, entry_id, status))
            return effects
        bit = self._ack_bits.get(bookie_id)  # bookies whose acks count now
        if bit is None:
            return NO_EFFECTS
        masks = self._masks
        get = masks.get
        if self._partial_write_sets:
            size, set_masks = self._E, self._set_masks
            for entry_id in entry_ids:
                mask = get(entry_id)
                if mask is not None and bit & set_masks[entry_id % size]:
                    masks[entry_id] = mask | bit
        else:
            for entry_id in entry_ids:
                mask = get(entry_id)
                if mask is not None:
                    masks[entry_id] = mask | bit
        mask = get(self._lac + 1)
        if mask is not None and mask.bit_count() >= self._Qa:
            regions = self._regions
            if regions is None or regions.count(mask) >= self._regions_min:
                return self._advance()
        return NO_EFFECTS

    def close(self) -> Effects:
        """Begin closing: once every pending entry is settled, CAS the metadata to CLOSED."""
        if self._state is WriterState.CLOSED:
            return NO_EFFECTS
        if self._state is WriterState.FAILED:
            invariant(self._error is not None, "failed writer without an error")
            if isinstance(self._error, LedgerFencedError | LedgerClosedError | UnauthorizedError):
                raise self._error
            # Appends past the lac failed (indeterminate); close at the lac.
            self._state = WriterState.CLOSING
            return self._maybe_send_close()
        self._state = WriterState.CLOSING
        return self._maybe_send_close()

    def on_metadata_written(self, record: LedgerMetadata) -> Effects:
        if self._state is WriterState.CLOSING and self._closing_sent and self._change is None:
            invariant(record.state is LedgerState.CLOSED, "close wrote a record that is not CLOSED")
            self._md = record
            self._state = WriterState.CLOSED
            return NO_EFFECTS
        invariant(self._change is not None, "metadata written with no change in progress")
        _first, ensemble, replaced = self._change  # type: ignore[misc]
        self._change = None
        self._md = record
        old = self._ensemble
        self._changes += 1
        self._failing -= replaced
        self._set_ensemble(ensemble)
        if self._state is WriterState.FAILED:
            return NO_EFFECTS
        # Re-send every unconfirmed entry to the new bookies of its write set.
        effects: list[Effect] = self._resend({i for i in range(self._E) if old[i] != ensemble[i]})
        if self._failing_next:
            pending_failures = self._failing_next & set(ensemble)
            self._failing_next = set()
            if pending_failures:
                effects.extend(self._start_change(pending_failures))
                return effects
        if self._state is WriterState.CLOSING:
            effects.extend(self._maybe_send_close())
        return effects

    def on_metadata_failed(self, error: ScribaError) -> Effects:
        self._change = None
        if isinstance(error, LedgerClosedError) and self._state is WriterState.CLOSING:
            error = LedgerFencedError(str(error))
        return self._fail(error)

    # --- internals ------------------------------------------------------------------
    def _set_ensemble(self, ensemble: Ensemble) -> None:
        self._ensemble = list(ensemble)
        self._index = {b: i for i, b in enumerate(ensemble)}
        invariant(len(self._index) == self._E, f"ensemble {ensemble} repeats a bookie")
        self._regions = self._md.slot_regions(ensemble)
        self._rebuild_send_sets()

    def _region_shortfall(self, ensemble: Ensemble, regions: Mapping[str, str] | None = None) -> str:
        return region_shortfall(self._md, ensemble, regions)

    def _rebuild_send_sets(self) -> None:
        ens = self._ensemble
        failing = self._failing
        self._ack_bits = {b: 1 << i for i, b in enumerate(ens) if b not in failing}
        write_set = self._quorum.write_set
        self._send_sets = [
            tuple(ens[slot] for slot in write_set(start) if ens[slot] not in failing)
            for start in range(self._E)
        ]

    def _advance(self) -> Effects:
        first = self._lac + 1
        masks = self._masks
        packed = self._packed
        entry_id = first
        quorum = self._Qa
        regions = self._regions
        regions_min = self._regions_min
        last_packed = b""
        freed = 0
        keep = self._unreplicated if self._failing else None  # a slot misses these entries
        while True:
            mask = masks.get(entry_id)
            if mask is None or mask.bit_count() < quorum:
                break
            if regions is not None and regions.count(mask) < regions_min:
                break
            del masks[entry_id]
            last_packed = packed.pop(entry_id)
            if keep is None:
                freed += len(last_packed)
            else:
                keep[entry_id] = last_packed
            entry_id += 1
        self._bytes_inflight -= freed
        self._lac = entry_id - 1
        self._lac_packed = last_packed
        done = CompleteAppends(EntryId(first), EntryId(self._lac))
        if self._state is WriterState.CLOSING and not masks:
            return (done, *self._maybe_send_close())
        return (done,)

    def _on_add_error(self, bookie_id: BookieId, entry_id: int, status: Status) -> Effects:
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

    def _start_change(self, failed: set[BookieId]) -> Effects:
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

    def _stop_using(self, failed: Collection[BookieId]) -> None:
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

    def _replacements(self, failed: Collection[BookieId]) -> Ensemble:
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

    def _write_change(self, failed: Collection[BookieId], new_ensemble: Ensemble) -> Effects:
        # The new segment starts at the first entry a failing slot has not received: entries
        # confirmed since the slot began failing (a wait for a spare) belong to it too.
        first = min(self._unreplicated, default=self._lac + 1)
        self._change = (first, new_ensemble, frozenset(failed))
        needs_update, transform = ensemble_change_transform(
            first, new_ensemble, self._new_regions if self._regions_min > 1 else None
        )
        return (WriteMetadata("ensemble_change", needs_update, transform),)

    def on_timer(self, key: object) -> Effects:
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

    def _resend(self, slots: set[int]) -> list[Effect]:
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

    def _maybe_send_close(self) -> Effects:
        if (
            self._closing_sent
            or self._masks
            or self._change is not None
            or self._retry_pending is not None
        ):
            return NO_EFFECTS
        self._closing_sent = True
        needs_update, transform = close_transform(self._lac, self.length)
        return (WriteMetadata("close", needs_update, transform),)

    def _fail(self, error: ScribaError) -> Effects:
        if self._state is WriterState.FAILED:
            return NO_EFFECTS
        self._state = WriterState.FAILED
        self._error = error
        self._retry_pending = None
        self._failing_next = set()
        first = self._lac + 1
        last = self._next - 1
        self._masks.clear()
        self._packed.clear()
        self._unreplicated.clear()
        self._bytes_inflight = 0
        if last < first:
            return NO_EFFECTS
        return (FailAppends(EntryId(first), EntryId(last), error),)

