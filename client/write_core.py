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

Parts: this module holds the add path (append, acks, the in-order advance of the LAC)
and the close; replacing a failed bookie is ``ensemble_changes.py`` (a mixin of
``WriteCore``: when placement finds no spare bookie, the writer waits
``replacement_retry_s``, asks placement again, and failing that re-sends to the same
bookie; every round counts against ``ensemble_changes_max``); the metadata changes it
asks for and the region rule are the pure functions of ``write_metadata.py``; its
states are ``writer_state.WriterState``.

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

import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import google_crc32c

from scriba.client.effects import (
    NO_EFFECTS,
    CompleteAppends,
    Effect,
    Effects,
    FailAppends,
    WriteMetadata,
)
from scriba.client.ensemble_changes import EnsembleChanges
from scriba.client.write_metadata import close_transform, region_shortfall
from scriba.client.writer_state import WriterState
from scriba.config import require
from scriba.entry import HEADER, Crc32cDigest, Digest, pack_entry
from scriba.errors import (
    LedgerClosedError,
    LedgerFencedError,
    NotEnoughBookiesError,
    ScribaError,
    Status,
    UnauthorizedError,
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


# --- the core -------------------------------------------------------------------


class WriteCore(EnsembleChanges):
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

