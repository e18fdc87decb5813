"""Reading entries and the last-add-confirmed of a ledger. No I/O.

``ReadCore`` reads entries ``first..last`` (already known confirmed). States per
entry: WAITING (asked one or more replicas) -> DONE (a replica returned it with a
valid digest) | FAILED (every replica tried, none valid).

Inputs: ``start()``, ``on_entry(bookie, entry, data, status)``,
``on_entries(bookie, answers)`` (one replica's answers for many entries), ``on_timer(key)``.
Outputs: ``ReadEntries`` (ids grouped per bookie; consecutive ids let the driver
use one range read), ``StartTimer`` (speculative read), ``DeliverEntries``
(verified, consecutive, in order), ``OperationDone`` / ``OperationFailed``.

Rules:
- replicas are tried in the placement policy's read order for the entry's write set;
- if a replica has not answered after ``speculative_timeout_s`` the next one is asked
  too (speculative read); an error or a bad digest moves on to the next at once;
  the entries one replica failed together are asked of the next one together (one
  ``ReadEntries`` per bookie, consecutive ids: the driver keeps using range reads);
- every entry's digest is checked; ``DigestMismatchError`` only when *every* replica
  returned a bad copy; ``NoSuchEntryError`` only when every replica lacks it;
- at most ``entries_window`` entries are outstanding (bounded memory).

``LacReadCore`` asks every bookie of the last segment for its LAC and answers
``max(LAC)`` once ``Qw - Qa + 1`` bookies of every write set answered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from scriba.client.effects import (
    NO_EFFECTS,
    DeliverEntries,
    Effect,
    Effects,
    OperationDone,
    OperationFailed,
    ReadEntries,
    ReadLac,
    StartTimer,
)
from scriba.client.transport import LacResult
from scriba.config import require
from scriba.entry import Digest, Entry, unpack_entry
from scriba.errors import (
    DigestMismatchError,
    NoSuchEntryError,
    ScribaError,
    Status,
    TimeoutError,
    UnauthorizedError,
    UnavailableError,
)
from scriba.ids import BookieId, EntryId
from scriba.invariant import invariant
from scriba.meta.records import LedgerMetadata

ReadOrder = Callable[[tuple[BookieId, ...]], Sequence[BookieId]]
"""``write_set -> the bookies to try, best first`` (placement's ``read_order``)."""


@dataclass(frozen=True, slots=True)
class ReadConfig:
    entries_window: int = 512
    batch_entries_max: int = 128
    speculative_timeout_s: float = 0.5

    def validate(self) -> ReadConfig:
        require(self.entries_window >= 1, "entries_window", "must be >= 1")
        require(self.batch_entries_max >= 1, "batch_entries_max", "must be >= 1")
        require(self.speculative_timeout_s > 0, "speculative_timeout_s", "must be > 0")
        return self


@dataclass(slots=True)
class _Pending:
    order: Sequence[BookieId]
    tried: int = 0  # replicas asked so far (order[:tried])
    outstanding: int = 0
    bad: int = 0
    missing: int = 0
    errors: list[str] = field(default_factory=list)


class ReadCore:
    """Reads ``first..last`` of one ledger (see the module docstring)."""

    def __init__(
        self,
        metadata: LedgerMetadata,
        first: int,
        last: int,
        *,
        digest: Digest,
        read_order: ReadOrder,
        config: ReadConfig | None = None,
    ) -> None:
        invariant(0 <= first, f"read: first entry {first} < 0")
        self._config = (config or ReadConfig()).validate()
        self._md = metadata
        self._digest = digest
        self._read_order = read_order
        self._ledger_id = int(metadata.ledger_id)
        self._first = first
        self._last = last
        self._next_issue = first
        self._next_deliver = first
        self._pending: dict[int, _Pending] = {}
        self._ready: dict[int, Entry] = {}
        self._order_cache: dict[tuple[int, int], Sequence[BookieId]] = {}
        self._round = 0
        self._rounds: dict[int, list[int]] = {}
        self._finished = False

    @property
    def finished(self) -> bool:
        return self._finished

    # --- events ----------------------------------------------------------------------
    def start(self) -> Effects:
        if self._first > self._last:
            self._finished = True
            return (OperationDone(None),)
        return self._issue()

    def on_entry(
        self, bookie_id: BookieId, entry_id: int, data: bytes | None, status: int
    ) -> Effects:
        return self.on_entries(bookie_id, ((entry_id, data, status),))

    def on_entries(
        self, bookie_id: BookieId, answers: Sequence[tuple[int, bytes | None, int]]
    ) -> Effects:
        """Answers of one replica for several entries (a range read, or its failure).

        The entries that need another replica are asked of it together (consecutive
        ids, so the driver keeps using range reads), with one speculative timer.
        """
        if self._finished:
            return NO_EFFECTS
        retry: dict[BookieId, list[EntryId]] = {}
        delivered = False
        for entry_id, data, status in answers:
            outcome = self._answer(bookie_id, entry_id, data, status, retry)
            if outcome is True:
                delivered = True
            elif outcome is not None:
                return outcome  # failed: nothing else matters
        effects: list[Effect] = []
        if delivered:
            effects.extend(self._deliver())
            if self._finished:
                return effects
        if retry:
            ids = [int(e) for batch in retry.values() for e in batch]
            effects.extend(self._with_timer(self._batches(retry), ids))
        return effects

    def _answer(
        self,
        bookie_id: BookieId,
        entry_id: int,
        data: bytes | None,
        status: int,
        retry: dict[BookieId, list[EntryId]],
    ) -> bool | Effects | None:
        """One replica's answer for one entry: True when it is now ready, the failure
        effects when the read failed, else None (queued in ``retry`` or waiting)."""
        pending = self._pending.get(entry_id)
        if pending is None:
            return None
        pending.outstanding -= 1
        if status == Status.OK and data is not None:
            try:
                entry = unpack_entry(self._digest, data)
            except DigestMismatchError:
                pending.bad += 1
                pending.errors.append(f"{bookie_id}: digest mismatch")
            else:
                if entry.ledger_id == self._ledger_id and entry.entry_id == entry_id:
                    del self._pending[entry_id]
                    self._ready[entry_id] = entry
                    return True
                pending.bad += 1
                pending.errors.append(f"{bookie_id}: header names another entry")
        elif status == Status.CORRUPT:
            pending.bad += 1
            pending.errors.append(f"{bookie_id}: corrupt at rest")
        elif status == Status.NO_SUCH_ENTRY or status == Status.NO_SUCH_LEDGER:
            pending.missing += 1
            pending.errors.append(f"{bookie_id}: {Status(status).name}")
        elif status == Status.UNAUTHORIZED:
            return self._fail(UnauthorizedError(f"bookie {bookie_id} rejected the read"))
        else:
            pending.errors.append(f"{bookie_id}: {Status(status).name}")
        # Try the next replica now.
        if pending.tried < len(pending.order):
            bookie = pending.order[pending.tried]
            pending.tried += 1
            pending.outstanding += 1
            retry.setdefault(bookie, []).append(EntryId(entry_id))
            return None
        if pending.outstanding > 0:
            return None
        return self._fail(self._entry_error(entry_id, pending))

    def on_timer(self, key: object) -> Effects:
        if self._finished or not isinstance(key, tuple) or key[0] != "speculative":
            return NO_EFFECTS
        entry_ids = self._rounds.pop(key[1], None)
        if not entry_ids:
            return NO_EFFECTS
        by_bookie: dict[BookieId, list[EntryId]] = {}
        retried: list[int] = []
        for entry_id in entry_ids:
            pending = self._pending.get(entry_id)
            if pending is None or pending.tried >= len(pending.order):
                continue
            bookie = pending.order[pending.tried]
            pending.tried += 1
            pending.outstanding += 1
            by_bookie.setdefault(bookie, []).append(EntryId(entry_id))
            retried.append(entry_id)
        if not retried:
            return NO_EFFECTS
        return self._with_timer(self._batches(by_bookie), retried)

    # --- internals ---------------------------------------------------------------------
    def _order_for(self, entry_id: int) -> Sequence[BookieId]:
        segment = self._md.segment_index(entry_id)
        size = self._md.ensemble_size
        # When every bookie holds every entry (Qw == E) one order serves the whole
        # segment, so consecutive entries go to one bookie as one range read.
        key = (segment, 0 if self._md.write_quorum_size == size else entry_id % size)
        order = self._order_cache.get(key)
        if order is None:
            if self._md.write_quorum_size == size:
                write_set = self._md.ensemble_at(entry_id)
            else:
                write_set = self._md.write_set(entry_id)
            order = list(self._read_order(write_set))
            invariant(set(order) == set(write_set), f"read order {order} != write set {write_set}")
            self._order_cache[key] = order
        return order

    def _issue(self) -> Effects:
        limit = min(self._last, self._next_deliver + self._config.entries_window - 1)
        if self._next_issue > limit:
            return NO_EFFECTS
        # Refill in batches, not one entry per delivered entry: wait until a whole
        # batch fits (or nothing is outstanding, or the rest of the range fits).
        room = limit - self._next_issue + 1
        batch = min(self._config.batch_entries_max, self._config.entries_window // 2 or 1)
        if self._pending and room < batch and limit < self._last:
            return NO_EFFECTS
        by_bookie: dict[BookieId, list[EntryId]] = {}
        issued: list[int] = []
        for entry_id in range(self._next_issue, limit + 1):
            order = self._order_for(entry_id)
            pending = _Pending(order=order, tried=1, outstanding=1)
            self._pending[entry_id] = pending
            by_bookie.setdefault(order[0], []).append(EntryId(entry_id))
            issued.append(entry_id)
        self._next_issue = limit + 1
        return self._with_timer(self._batches(by_bookie), issued)

    def _batches(self, by_bookie: dict[BookieId, list[EntryId]]) -> list[Effect]:
        size = self._config.batch_entries_max
        effects: list[Effect] = []
        for bookie, ids in by_bookie.items():
            for i in range(0, len(ids), size):
                effects.append(ReadEntries(bookie, tuple(ids[i : i + size])))
        return effects

    def _with_timer(self, effects: list[Effect], entry_ids: list[int]) -> Effects:
        self._round += 1
        self._rounds[self._round] = entry_ids
        effects.append(StartTimer(("speculative", self._round), self._config.speculative_timeout_s))
        return effects

    def _deliver(self) -> Effects:
        batch: list[Entry] = []
        while True:
            entry = self._ready.pop(self._next_deliver, None)
            if entry is None:
                break
            batch.append(entry)
            self._next_deliver += 1
        if not batch:
            return NO_EFFECTS
        effects: list[Effect] = [DeliverEntries(tuple(batch))]
        if self._next_deliver > self._last:
            self._finished = True
            self._rounds.clear()
            effects.append(OperationDone(None))
            return effects
        effects.extend(self._issue())
        return effects

    def _entry_error(self, entry_id: int, pending: _Pending) -> ScribaError:
        replicas = len(pending.order)
        detail = "; ".join(pending.errors)
        where = f"ledger {self._ledger_id} entry {entry_id}"
        if pending.bad == replicas:
            return DigestMismatchError(f"{where}: every replica is corrupt ({detail})")
        if pending.missing == replicas:
            return NoSuchEntryError(f"{where}: no replica has it ({detail})")
        if pending.bad + pending.missing == replicas:
            return DigestMismatchError(f"{where}: no valid replica ({detail})")
        return TimeoutError(f"{where}: no replica answered in time ({detail})")

    def _fail(self, error: ScribaError) -> Effects:
        if self._finished:
            return NO_EFFECTS
        self._finished = True
        self._pending.clear()
        self._rounds.clear()
        return (OperationFailed(error),)


class LacReadCore:
    """Reads the LAC from the last segment's bookies (quorum coverage of every write set)."""

    def __init__(self, metadata: LedgerMetadata) -> None:
        self._md = metadata
        self._ok: set[int] = set()
        self._failed: set[int] = set()
        self._lac = -1
        self._errors: list[str] = []
        self._finished = False

    def start(self) -> Effects:
        return tuple(ReadLac(b) for b in self._md.current_ensemble)

    def on_lac_response(
        self, bookie_id: BookieId, result: LacResult | None, status: int
    ) -> Effects:
        if self._finished or bookie_id not in self._md.current_ensemble:
            return NO_EFFECTS
        index = self._md.current_ensemble.index(bookie_id)
        md = self._md
        if status == Status.OK or status == Status.NO_SUCH_LEDGER:
            self._ok.add(index)
            if result is not None:
                self._lac = max(self._lac, int(result.lac))
        else:
            self._failed.add(index)
            self._errors.append(f"{bookie_id}: {Status(status).name}")
        quorum = md.quorum
        if quorum.covers_every_write_set(self._ok):
            self._finished = True
            return (OperationDone(max(self._lac, int(md.last_entry_id))),)
        if not quorum.can_still_cover(self._failed):
            self._finished = True
            return (
                OperationFailed(
                    UnavailableError(
                        f"ledger {md.ledger_id}: LAC read reached too few bookies "
                        f"({'; '.join(self._errors)})"
                    )
                ),
            )
        return NO_EFFECTS
