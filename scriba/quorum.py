"""The quorum rules of a ledger, in one place: write sets, acks, fencing, recoverability.

A ledger stripes its entries over an ensemble of ``E`` bookies (slots ``0..E-1``)
with a write quorum ``Qw`` and an ack quorum ``Qa``, ``E >= Qw >= Qa >= 1``
(BookKeeper's ``RoundRobinDistributionSchedule``; etcd-raft keeps its ``quorum/``
package the same way). Every layer that needs one of these rules asks this module;
none writes the arithmetic again. Pure: no I/O, no state.

- **Write set.** Entry ``e`` is written to the ``Qw`` slots ``(e + i) % E`` for
  ``i < Qw`` (round-robin striping). There is one rotation per ``e % E``; when
  ``Qw == E`` every rotation holds the same slots (one distinct write set).
- **Ack rule.** ``e`` is durable once ``Qa`` distinct slots *of its write set*
  acknowledged it; an ack from any other slot never counts. (The writer confirms
  ``e`` only once every entry below it is durable as well.)
- **Fence quorum.** ``Qw - Qa + 1`` answers in a write set leave at most ``Qa - 1``
  slots that could still take an old writer's add, so it can never again reach
  ``Qa``. Fencing, and a LAC read that must not miss a confirmed entry, are complete
  once the answering slots hold a fence quorum of *every* write set, and have failed
  once the failed slots leave some write set unable to reach one.
- **Unfenced proof** (the converse question, a leader's cheap leadership check). If the
  slots that answered "not fenced" to a plain LAC read hold ``Qa`` slots of *one*
  write set (and span ``regions_min`` regions), no fencing was complete before the
  earliest of those answers: a complete fence leaves each write set's unfenced slots
  unable to confirm anything, and a fenced bookie stays fenced. It has failed once the
  slots that did not fail could not confirm anything in any write set.
- **Recoverability.** In recovery an entry is *present* when any replica returned a
  valid copy; *absent* only when a fence quorum of its write set said it has no such
  entry (then at most ``Qa - 1`` replicas could hold it: it was never confirmed);
  *unknown* when every replica asked has answered and neither holds (a corrupt copy,
  a wrong header or a failed read is never taken for absent); otherwise *pending*.
  Re-replicating it succeeds at ``Qa`` acks and has failed once more than
  ``Qw - Qa`` replicas of its write set failed.

- **Regions** (the synchronous geo mode, ``regions_min > 1``; BookKeeper's
  ``minRegionsForDurability`` checked in the ack rule as ``areAckedBookiesAdheringTo
  PlacementPolicy`` does). A segment's :class:`SlotRegions` gives each slot a region bit
  (a slot whose region is unknown has none and never counts). Then ``e`` is durable
  once its ``Qa`` acks *also* span ``regions_min`` regions. Every rule above that
  reasons "the other slots could still have confirmed it" reasons with the same
  predicate: a set of slots *could confirm* when it holds ``Qa`` slots and spans
  ``regions_min`` regions. Fencing is complete once the slots that have not answered
  could not confirm anything in any write set (so losing a whole region of a
  two-region write set still lets recovery fence), an entry is absent once the slots
  that did not deny it could not have confirmed it, and re-replication has failed once
  the slots that did not fail could not confirm it. With ``regions_min == 1`` each
  rule is exactly the count rule (``Qw - Qa + 1`` answers etc.).

Hot paths take the precomputed tables (``write_set``, ``write_set_masks``) once per
segment and keep only an index and a bit test per answer.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from scriba.invariant import invariant


@lru_cache(maxsize=256)
def _rotations(ensemble_size: int, write_quorum_size: int) -> tuple[tuple[int, ...], ...]:
    # The round-robin rule itself; everything else in this module derives from it.
    return tuple(
        tuple((start + i) % ensemble_size for i in range(write_quorum_size))
        for start in range(ensemble_size)
    )


@lru_cache(maxsize=256)
def write_sets(ensemble_size: int, write_quorum_size: int) -> tuple[tuple[int, ...], ...]:
    """The distinct write sets as slot tuples in write order (one when ``E == W``)."""
    seen: set[frozenset[int]] = set()
    out: list[tuple[int, ...]] = []
    for slots in _rotations(ensemble_size, write_quorum_size):
        if frozenset(slots) not in seen:
            seen.add(frozenset(slots))
            out.append(slots)
    return tuple(out)


@lru_cache(maxsize=256)
def _masks(ensemble_size: int, write_quorum_size: int) -> tuple[int, ...]:
    return tuple(
        sum(1 << slot for slot in slots) for slots in _rotations(ensemble_size, write_quorum_size)
    )


def _bits(slots: Collection[int]) -> int:
    mask = 0
    for slot in slots:
        mask |= 1 << slot
    return mask


@dataclass(frozen=True, slots=True)
class SlotRegions:
    """The regions of one segment's slots, as bits: ``bits[slot]`` is its region's bit.
    A slot whose region is unknown spans no region (``unknown_distinct=False``: its acks
    never make up a missing region) or a region of its own (``unknown_distinct=True``:
    the worst case when asking whether slots *could* have confirmed something, for
    fencing and absence). Pure and cached."""

    bits: tuple[int, ...]
    _cache: dict[int, int] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, regions: Sequence[str | None], *, unknown_distinct: bool = False) -> SlotRegions:
        """From each slot's region name (None or "" for unknown)."""
        index: dict[str, int] = {}
        bits = []
        for slot, region in enumerate(regions):
            if not region:
                if not unknown_distinct:
                    bits.append(0)
                    continue
                region = f"\0unknown-{slot}"  # no real region name holds a NUL
            bits.append(1 << index.setdefault(region, len(index)))
        return cls(tuple(bits))

    def count(self, slot_mask: int) -> int:
        """The number of distinct regions among the slots set in ``slot_mask``."""
        cached = self._cache.get(slot_mask)
        if cached is not None:
            return cached
        regions = 0
        bits = self.bits
        mask = slot_mask
        while mask:
            low = mask & -mask
            regions |= bits[low.bit_length() - 1]
            mask ^= low
        n = self._cache[slot_mask] = regions.bit_count()
        return n

    def count_slots(self, slots: Collection[int]) -> int:
        return self.count(_bits(slots))


class EntryState(enum.Enum):
    """What recovery knows about one entry from its replicas' answers."""

    PRESENT = "present"  # a replica returned a valid copy
    ABSENT = "absent"  # a fence quorum of its write set lacks it: never confirmed
    UNKNOWN = "unknown"  # every replica answered, neither present nor absent
    PENDING = "pending"  # answers still outstanding


@dataclass(frozen=True, slots=True)
class Quorum:
    """The sizes of one ledger and the rules they imply (see the module docstring)."""

    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    regions_min: int = 1  # regions an ack quorum must span (min_regions_for_durability)

    def __post_init__(self) -> None:
        invariant(
            self.ensemble_size >= self.write_quorum_size >= self.ack_quorum_size >= 1,
            f"quorum E{self.ensemble_size}/W{self.write_quorum_size}/A{self.ack_quorum_size}: "
            "need ensemble >= write quorum >= ack quorum >= 1",
        )
        invariant(
            1 <= self.regions_min <= self.ack_quorum_size,
            f"quorum A{self.ack_quorum_size}: regions_min {self.regions_min} must be between 1 "
            "and the ack quorum (each region needs an ack)",
        )

    @property
    def counts_regions(self) -> bool:
        """Whether the ack rule counts regions too (``regions_min > 1``)."""
        return self.regions_min > 1

    def could_confirm(self, slots: Collection[int], regions: SlotRegions | None) -> bool:
        """Whether acks from exactly ``slots`` would make an entry durable (see the
        module docstring): ``Qa`` of them, spanning ``regions_min`` regions."""
        if len(slots) < self.ack_quorum_size:
            return False
        if self.regions_min == 1:
            return True
        return regions is not None and regions.count_slots(slots) >= self.regions_min

    # --- write sets ---------------------------------------------------------------
    def write_set(self, entry_id: int) -> tuple[int, ...]:
        """The slots ``entry_id`` is written to, in write order."""
        return _rotations(self.ensemble_size, self.write_quorum_size)[entry_id % self.ensemble_size]

    def write_sets(self) -> tuple[tuple[int, ...], ...]:
        """The distinct write sets (one when ``E == W``)."""
        return write_sets(self.ensemble_size, self.write_quorum_size)

    def write_set_masks(self) -> tuple[int, ...]:
        """Per ``entry_id % E``: the write set as a bitmask of slots (bit ``s`` = slot ``s``)."""
        return _masks(self.ensemble_size, self.write_quorum_size)

    def in_write_set(self, slot: int, entry_id: int) -> bool:
        """Whether ``slot`` holds a replica of ``entry_id`` (its ack may count)."""
        return bool(self.write_set_masks()[entry_id % self.ensemble_size] >> slot & 1)

    # --- acks ---------------------------------------------------------------------
    def is_acked(self, acks: int, regions: int = 1) -> bool:
        """Whether ``acks`` distinct write-set slots spanning ``regions`` regions make an
        entry durable (``regions`` matters only when ``regions_min > 1``)."""
        return acks >= self.ack_quorum_size and regions >= self.regions_min

    def can_still_ack(self, failed: int, regions_left: int | None = None) -> bool:
        """Whether an entry whose write set has ``failed`` failures can still be acked:
        ``Qa`` slots are left and (when regions count) the slots left span
        ``regions_left >= regions_min`` regions."""
        if self.write_quorum_size - failed < self.ack_quorum_size:
            return False
        return self.regions_min == 1 or (regions_left or 0) >= self.regions_min

    # --- fencing and the answer sets it needs --------------------------------------
    @property
    def fence_quorum(self) -> int:
        """Answers needed in one write set: ``(Qw - Qa) + 1``."""
        return self.write_quorum_size - self.ack_quorum_size + 1

    def covers_every_write_set(
        self, answered: Collection[int], regions: SlotRegions | None = None
    ) -> bool:
        """Whether the ``answered`` slots hold a fence quorum of every write set: the
        slots of each write set that did not answer could not confirm an entry."""
        if self.regions_min == 1:
            need = self.fence_quorum
            return all(
                sum(1 for slot in slots if slot in answered) >= need for slots in self.write_sets()
            )
        return not any(
            self.could_confirm([slot for slot in slots if slot not in answered], regions)
            for slots in self.write_sets()
        )

    def can_still_cover(self, failed: Collection[int], regions: SlotRegions | None = None) -> bool:
        """Whether every write set can still reach a fence quorum despite ``failed`` slots
        (the failed slots alone could not confirm an entry)."""
        if self.regions_min == 1:
            need = self.fence_quorum
            return all(
                self.write_quorum_size - sum(1 for slot in slots if slot in failed) >= need
                for slots in self.write_sets()
            )
        return not any(
            self.could_confirm([slot for slot in slots if slot in failed], regions)
            for slots in self.write_sets()
        )

    def proves_unfenced(self, not_fenced: Collection[int], regions: SlotRegions | None = None) -> bool:
        """Whether the ``not_fenced`` slots (each answered "not fenced") hold, in one write
        set, slots that could confirm an entry: then no fencing of the ledger was complete
        before the earliest of those answers (see the module docstring). ``regions``: the
        ack rule's (an unknown region spans none), so a proof here is one for fencing too."""
        for slots in self.write_sets():
            inside = [slot for slot in slots if slot in not_fenced]
            if self.could_confirm(inside, regions):
                return True
        return False

    def can_still_prove_unfenced(self, failed: Collection[int], regions: SlotRegions | None = None) -> bool:
        """Whether some write set's slots that did not fail (answered "fenced", an error,
        or nothing) could still prove it unfenced."""
        return any(
            self.could_confirm([slot for slot in slots if slot not in failed], regions)
            for slots in self.write_sets()
        )

    # --- recovery -----------------------------------------------------------------
    def entry_state(
        self, *, present: bool, missing: int, answered: int, asked: int,
        could_have_confirmed: bool = True,
    ) -> EntryState:
        """One entry's state from its replicas' answers so far.

        ``present``: a replica returned a valid copy of this very entry; ``missing``:
        replicas that said NO_SUCH_ENTRY; ``answered``: replicas that answered at all
        (missing, corrupt, wrong header and failed reads included); ``asked``: replicas
        asked; ``could_have_confirmed``: when regions count, whether the replicas that
        did not say NO_SUCH_ENTRY could together have confirmed it (``could_confirm``).
        """
        if present:
            return EntryState.PRESENT
        if missing >= self.fence_quorum or not could_have_confirmed:
            return EntryState.ABSENT
        if answered >= asked:
            return EntryState.UNKNOWN
        return EntryState.PENDING
