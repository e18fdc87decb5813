"""Reading entries and the last-add-confirmed of a ledger. No I/O.

``ReadCore`` reads entries ``first..last`` (already known confirmed). States per
entry: WAITING (asked one or more replicas) -> DONE (a replica returned it with a
valid digest) | FAILED (every replica tried, none valid).

Inputs: ``start()``, ``on_entry(bookie, entry, data, status)``,
``on_entries(bookie, answers)`` (one replica's answers for many entries),
``on_run(bookie, run)`` (one replica's consecutive entries in one bytes object: the
packed range read; CRC32C entries are checked in place, with no object per entry but
the ``Entry`` delivered), ``on_timer(key)``.
Outputs: ``ReadEntries`` (ids grouped per bookie; consecutive ids let the driver
use one range read), ``StartTimer`` (speculative read), ``DeliverEntries``
(verified, consecutive, in order), ``OperationDone`` / ``OperationFailed``.

Rules:
- replicas are tried in the placement policy's read order for the entry's write set;
- if a replica has not answered after ``speculative_timeout_s`` the next one is asked
  too (speculative read); an error or a bad digest moves on to the next at once;
  the entries one replica failed together are asked of the next one together (one
  ``ReadEntries`` per bookie, consecutive ids: the driver keeps using range reads);
- every entry's digest is checked, and its header must name the entry asked for (a
  valid copy of another entry is a bad copy); ``DigestMismatchError`` only when *every*
  replica returned a bad copy; ``NoSuchEntryError`` only when every replica lacks it;
- at most ``entries_window`` entries are outstanding, and about ``window_bytes_max``
  bytes once the size of the entries read so far is known (the first batch is sized by
  ``batch_entries_max`` alone): bounded memory.

``LacReadCore`` asks every bookie of the last segment for its LAC and answers
``max(LAC)`` once ``Qw - Qa + 1`` bookies of every write set answered.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Final, Literal

import google_crc32c

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
from scriba.client.transport import EntryRun, LacResult
from scriba.config import require
from scriba.entry import HEADER, HEADER_SIZE, Crc32cDigest, Digest, Entry, unpack_entry
from scriba.errors import (
    DeadlineExceededError,
    DigestMismatchError,
    NoSuchEntryError,
    ScribaError,
    Status,
    UnauthorizedError,
    UnavailableError,
)
from scriba.ids import BookieId, EntryId
from scriba.invariant import invariant
from scriba.meta.records import LedgerMetadata

_U32: Final = struct.Struct(">I")
_crc_value = google_crc32c.value
_crc_extend = google_crc32c.extend

ReadOrder = Callable[[tuple[BookieId, ...]], Sequence[BookieId]]
"""``write_set -> the bookies to try, best first`` (placement's ``read_order``)."""


@dataclass(frozen=True, slots=True)
class ReadConfig:
    entries_window: int = 4096
    batch_entries_max: int = 1024  # entries per range read (fewer, larger reads: ~4x less CPU per entry than 128)
    window_bytes_max: int = 32 * 1024 * 1024
    speculative_timeout_s: float = 0.5

    def validate(self) -> ReadConfig:
        require(self.entries_window >= 1, "entries_window", "must be >= 1")
        require(self.batch_entries_max >= 1, "batch_entries_max", "must be >= 1")
        require(self.window_bytes_max >= 1, "window_bytes_max", "must be >= 1")
        require(self.speculative_timeout_s > 0, "speculative_timeout_s", "must be > 0")
        return self


class _Pending:
    """One entry being read: its replicas in read order and what they answered."""

    __slots__ = ("bad", "errors", "missing", "order", "outstanding", "tried")

    def __init__(self, order: Sequence[BookieId]) -> None:
        self.order = order
        self.tried = 1  # replicas asked so far (order[:tried])
        self.outstanding = 1
        self.bad = 0
        self.missing = 0
        self.errors: list[str] = []


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
        # Entries asked and not yet read: an entry asked of its first replica only, with
        # no answer yet, maps to its read order (shared, no object per entry); it gets
        # its own _Pending at its first failed answer or speculative retry (_tracked).
        self._pending: dict[int, _Pending | Sequence[BookieId]] = {}
        self._ready: dict[int, Entry] = {}
        self._crc = isinstance(digest, Crc32cDigest)
        self._entries_read = 0  # entries received (verified or not), and their bytes:
        self._bytes_read = 0  # the mean entry size bounds the window in bytes
        self._segment_orders: dict[int, list[Sequence[BookieId]]] = {}
        self._round = 0
        self._rounds: dict[int, Sequence[int]] = {}
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
        return self._after(delivered, retry)

    def on_run(self, bookie_id: BookieId, run: EntryRun) -> Effects:
        """One replica's consecutive entries as one run (a packed range read).

        Each entry still wanted is verified (digest, header ids) straight from the run's
        bytes, with no object per entry but the ``Entry`` delivered; a bad copy goes on
        to the next replica as in :meth:`on_entries`.
        """
        if self._finished:
            return NO_EFFECTS
        self._entries_read += len(run)
        self._bytes_read += len(run.blob)
        if self._crc:
            delivered, bad = _verify_crc_run(run, self._ledger_id, self._pending, self._ready)
        else:
            delivered, bad = self._verify_run(run)
        retry: dict[BookieId, list[EntryId]] = {}
        for entry_id, problem in bad:
            outcome = self._bad_copy(bookie_id, entry_id, self._tracked(entry_id), problem, retry)
            if outcome is not None:
                return outcome
        return self._after(delivered, retry)

    def _after(self, delivered: bool, retry: dict[BookieId, list[EntryId]]) -> Effects:
        """Deliver what is ready, ask the next replicas for what is not."""
        effects: list[Effect] = []
        if delivered:
            effects.extend(self._deliver())
            if self._finished:
                return effects
        if retry:
            ids = [int(e) for batch in retry.values() for e in batch]
            effects.extend(self._with_timer(self._batches(retry), ids))
        return effects

    def _verify_run(self, run: EntryRun) -> tuple[bool, list[tuple[int, str]]]:
        """As :func:`_verify_crc_run`, for any digest (one :meth:`_check` per entry)."""
        pending = self._pending
        blob = run.blob
        entry_id = int(run.first_entry_id)
        start = 0
        delivered = False
        bad: list[tuple[int, str]] = []
        for end in run.ends:
            if entry_id in pending:
                got = self._check(blob[start:end], entry_id)
                if type(got) is Entry:
                    del pending[entry_id]
                    self._ready[entry_id] = got
                    delivered = True
                else:
                    bad.append((entry_id, got))  # type: ignore[arg-type]
            start = end
            entry_id += 1
        return delivered, bad

    def _check(self, data: bytes, entry_id: int) -> Entry | str:
        """The entry when its digest verifies and its header names ``entry_id`` of this
        ledger, else what is wrong with it."""
        try:
            entry = unpack_entry(self._digest, data)
        except DigestMismatchError:
            return "digest mismatch"
        if entry.ledger_id != self._ledger_id or entry.entry_id != entry_id:
            return "header names another entry"
        return entry

    def _answer(
        self,
        bookie_id: BookieId,
        entry_id: int,
        data: bytes | None,
        status: int,
        retry: dict[BookieId, list[EntryId]],
    ) -> Literal[True] | Effects | None:
        """One replica's answer for one entry: True when it is now ready, the failure
        effects when the read failed, else None (queued in ``retry`` or waiting)."""
        if entry_id not in self._pending:
            return None
        if status == Status.OK and data is not None:
            self._entries_read += 1
            self._bytes_read += len(data)
            got = self._check(data, entry_id)
            if type(got) is Entry:
                del self._pending[entry_id]
                self._ready[entry_id] = got
                return True
            return self._bad_copy(bookie_id, entry_id, self._tracked(entry_id), got, retry)  # type: ignore[arg-type]
        pending = self._tracked(entry_id)
        pending.outstanding -= 1
        if status == Status.CORRUPT:
            pending.bad += 1
            pending.errors.append(f"{bookie_id}: corrupt at rest")
        elif status == Status.NO_SUCH_ENTRY or status == Status.NO_SUCH_LEDGER:
            pending.missing += 1
            pending.errors.append(f"{bookie_id}: {Status(status).name}")
        elif status == Status.UNAUTHORIZED:
            return self._fail(UnauthorizedError(f"bookie {bookie_id} rejected the read"))
        else:
            pending.errors.append(f"{bookie_id}: {Status(status).name}")
        return self._next_replica(entry_id, pending, retry)

    def _tracked(self, entry_id: int) -> _Pending:
        """The pending entry's own record (made at its first failure or retry)."""
        pending = self._pending[entry_id]
        if type(pending) is _Pending:
            return pending
        tracked = self._pending[entry_id] = _Pending(pending)  # type: ignore[arg-type]
        return tracked

    def _bad_copy(
        self,
        bookie_id: BookieId,
        entry_id: int,
        pending: _Pending,
        problem: str,
        retry: dict[BookieId, list[EntryId]],
    ) -> Effects | None:
        """A replica returned a copy that does not verify: count it, try the next one."""
        pending.outstanding -= 1
        pending.bad += 1
        pending.errors.append(f"{bookie_id}: {problem}")
        return self._next_replica(entry_id, pending, retry)

    def _next_replica(
        self, entry_id: int, pending: _Pending, retry: dict[BookieId, list[EntryId]]
    ) -> Effects | None:
        """Queue the entry for its next replica in ``retry``; the failure effects once
        every replica was asked and none is still outstanding; else None."""
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
        if not entry_ids or max(entry_ids) < self._next_deliver:  # all read meanwhile
            return NO_EFFECTS
        by_bookie: dict[BookieId, list[EntryId]] = {}
        retried: list[int] = []
        for entry_id in entry_ids:
            if entry_id not in self._pending:
                continue
            pending = self._tracked(entry_id)
            if pending.tried >= len(pending.order):
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
    def _orders(self, segment: int) -> list[Sequence[BookieId]]:
        """The read orders of a segment: one for all its entries when every bookie holds
        every entry (Qw == E: consecutive entries go to one bookie as one range read),
        else one per ``entry_id % ensemble_size`` (entries with one write set)."""
        orders = self._segment_orders.get(segment)
        if orders is None:
            md = self._md
            ensemble = md.ensembles[segment][1]
            size = md.ensemble_size
            if md.write_quorum_size == size:
                write_sets = [tuple(ensemble)]
            else:
                quorum = md.quorum
                write_sets = [tuple(ensemble[slot] for slot in quorum.write_set(r)) for r in range(size)]
            orders = []
            for write_set in write_sets:
                order = list(self._read_order(write_set))
                invariant(set(order) == set(write_set), f"read order {order} != write set {write_set}")
                orders.append(order)
            self._segment_orders[segment] = orders
        return orders

    def _stretches(self, first: int, last: int) -> Iterator[tuple[range, list[Sequence[BookieId]]]]:
        """``first..last`` cut at segment boundaries, each stretch with its read orders."""
        ensembles = self._md.ensembles
        segment = self._md.segment_index(first)
        start = first
        while start <= last:
            stop = last if segment + 1 >= len(ensembles) else min(last, ensembles[segment + 1][0] - 1)
            if stop >= start:
                yield range(start, stop + 1), self._orders(segment)
                start = stop + 1
            segment += 1

    def _window(self) -> int:
        """Entries that may be outstanding: ``entries_window``, or fewer where the entries
        read so far say that many would exceed ``window_bytes_max`` (one batch before any)."""
        cfg = self._config
        if not self._entries_read:
            return min(cfg.entries_window, cfg.batch_entries_max)
        mean_bytes = max(1, self._bytes_read // self._entries_read)
        return max(1, min(cfg.entries_window, cfg.window_bytes_max // mean_bytes))

    def _issue(self) -> Effects:
        window = self._window()
        limit = min(self._last, self._next_deliver + window - 1)
        if self._next_issue > limit:
            return NO_EFFECTS
        # Refill in batches, not one entry per delivered entry: wait until a whole
        # batch fits (or nothing is outstanding, or the rest of the range fits).
        room = limit - self._next_issue + 1
        batch = min(self._config.batch_entries_max, window // 2 or 1)
        if self._pending and room < batch and limit < self._last:
            return NO_EFFECTS
        by_bookie: dict[BookieId, list[EntryId]] = {}
        pending = self._pending
        for ids, orders in self._stretches(self._next_issue, limit):
            if len(orders) == 1:
                order = orders[0]
                pending.update(zip(ids, repeat(order, len(ids)), strict=True))
                by_bookie.setdefault(order[0], []).extend(ids)  # type: ignore[arg-type]
                continue
            size = len(orders)
            for entry_id in ids:
                order = orders[entry_id % size]
                pending[entry_id] = order
                by_bookie.setdefault(order[0], []).append(EntryId(entry_id))
        issued = range(self._next_issue, limit + 1)
        self._next_issue = limit + 1
        return self._with_timer(self._batches(by_bookie), issued)

    def _batches(self, by_bookie: dict[BookieId, list[EntryId]]) -> list[Effect]:
        size = self._config.batch_entries_max
        effects: list[Effect] = []
        for bookie, ids in by_bookie.items():
            for i in range(0, len(ids), size):
                effects.append(ReadEntries(bookie, tuple(ids[i : i + size])))
        return effects

    def _with_timer(self, effects: list[Effect], entry_ids: Sequence[int]) -> Effects:
        self._round += 1
        self._rounds[self._round] = entry_ids
        effects.append(StartTimer(("speculative", self._round), self._config.speculative_timeout_s))
        return effects

    def _deliver(self) -> Effects:
        batch: list[Entry] = []
        append = batch.append
        take = self._ready.pop
        next_id = self._next_deliver
        entry = take(next_id, None)
        while entry is not None:
            append(entry)
            next_id += 1
            entry = take(next_id, None)
        self._next_deliver = next_id
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
        return DeadlineExceededError(f"{where}: no replica answered in time ({detail})")

    def _fail(self, error: ScribaError) -> Effects:
        if self._finished:
            return NO_EFFECTS
        self._finished = True
        self._pending.clear()
        self._rounds.clear()
        return (OperationFailed(error),)


def _entry_builder() -> Callable[[int, int, int, int, bytes], Entry]:
    """``Entry(...)`` without the frozen dataclass's ``__init__``: the same object, its
    fields stored through their slot descriptors instead of one ``object.__setattr__``
    call each (that ``__init__`` was ~40% of the instructions of a run's entry)."""
    names = tuple(f.name for f in dataclasses.fields(Entry))
    invariant(
        names == ("ledger_id", "entry_id", "last_add_confirmed", "length", "payload")
        and not hasattr(Entry, "__post_init__"),
        f"Entry changed ({names}): update _entry_builder",
    )
    new = object.__new__
    set_ledger, set_entry, set_lac, set_length, set_payload = (getattr(Entry, n).__set__ for n in names)

    def build(ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes) -> Entry:
        entry = new(Entry)
        set_ledger(entry, ledger_id)
        set_entry(entry, entry_id)
        set_lac(entry, lac)
        set_length(entry, length)
        set_payload(entry, payload)
        return entry

    return build


_new_entry: Final = _entry_builder()


def _verify_crc_run(
    run: EntryRun, ledger_id: int, wanted: dict[int, Any], ready: dict[int, Entry]
) -> tuple[bool, list[tuple[int, str]]]:
    """Check the CRC32C entries of ``run`` whose ids are in ``wanted`` in place (two C
    calls each, slices of the run's bytes, no object but the ``Entry``): a good one
    leaves ``wanted`` for ``ready``. Whether any did, and (entry id, problem) of the bad."""
    blob = run.blob
    entry_id = int(run.first_entry_id)
    header_unpack = HEADER.unpack
    digest_at = _U32.unpack_from
    value = _crc_value
    extend = _crc_extend
    new_entry = _new_entry
    start = 0
    delivered = False
    bad: list[tuple[int, str]] = []
    for end in run.ends:
        if entry_id in wanted:
            digest_start = start + HEADER_SIZE
            body = digest_start + 4
            if end < body:
                bad.append((entry_id, "too short to carry a digest"))
            else:
                header = blob[start:digest_start]
                payload = blob[body:end]
                if extend(value(header), payload) != digest_at(blob, digest_start)[0]:
                    bad.append((entry_id, "digest mismatch"))
                else:
                    lid, eid, lac, length = header_unpack(header)
                    if lid != ledger_id or eid != entry_id:
                        bad.append((entry_id, "header names another entry"))
                    else:
                        del wanted[entry_id]
                        ready[entry_id] = new_entry(lid, eid, lac, length, payload)
                        delivered = True
        start = end
        entry_id += 1
    return delivered, bad


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
