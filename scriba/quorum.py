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
- **Recoverability.** In recovery an entry is *present* when any replica returned a
  valid copy; *absent* only when a fence quorum of its write set said it has no such
  entry (then at most ``Qa - 1`` replicas could hold it: it was never confirmed);
  *unknown* when every replica asked has answered and neither holds (a corrupt copy,
  a wrong header or a failed read is never taken for absent); otherwise *pending*.
  Re-replicating it succeeds at ``Qa`` acks and has failed once more than
  ``Qw - Qa`` replicas of its write set failed.

Hot paths take the precomputed tables (``write_set``, ``write_set_masks``) once per
segment and keep only an index and a bit test per answer.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass
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

    def __post_init__(self) -> None:
        invariant(
            self.ensemble_size >= self.write_quorum_size >= self.ack_quorum_size >= 1,
            f"quorum E{self.ensemble_size}/W{self.write_quorum_size}/A{self.ack_quorum_size}: "
            "need ensemble >= write quorum >= ack quorum >= 1",
        )

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
    def is_acked(self, acks: int) -> bool:
        """Whether ``acks`` distinct write-set slots make an entry durable."""
        return acks >= self.ack_quorum_size

    def can_still_ack(self, failed: int) -> bool:
        """Whether an entry whose write set has ``failed`` failures can still reach ``Qa``."""
        return self.write_quorum_size - failed >= self.ack_quorum_size

    # --- fencing and the answer sets it needs --------------------------------------
    @property
    def fence_quorum(self) -> int:
        """Answers needed in one write set: ``(Qw - Qa) + 1``."""
        return self.write_quorum_size - self.ack_quorum_size + 1

    def covers_every_write_set(self, answered: Collection[int]) -> bool:
        """Whether the ``answered`` slots hold a fence quorum of every write set."""
        need = self.fence_quorum
        return all(
            sum(1 for slot in slots if slot in answered) >= need for slots in self.write_sets()
        )

    def can_still_cover(self, failed: Collection[int]) -> bool:
        """Whether every write set can still reach a fence quorum despite ``failed`` slots."""
        need = self.fence_quorum
        return all(
            self.write_quorum_size - sum(1 for slot in slots if slot in failed) >= need
            for slots in self.write_sets()
        )

    # --- recovery -----------------------------------------------------------------
    def entry_state(self, *, present: bool, missing: int, answered: int, asked: int) -> EntryState:
        """One entry's state from its replicas' answers so far.

        ``present``: a replica returned a valid copy of this very entry; ``missing``:
        replicas that said NO_SUCH_ENTRY; ``answered``: replicas that answered at all
        (missing, corrupt, wrong header and failed reads included); ``asked``: replicas
        asked.
        """
        if present:
            return EntryState.PRESENT
        if missing >= self.fence_quorum:
            return EntryState.ABSENT
        if answered >= asked:
            return EntryState.UNKNOWN
        return EntryState.PENDING
