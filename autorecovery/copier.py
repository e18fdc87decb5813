"""Copy a fragment's entries to its new bookies: batched reads, digest checks, recovery adds.

For each batch of the plan's entries (at most ``batch_entries`` and about
``batch_bytes``): the entries are spread over as few replicas as their read orders
allow (:func:`assign_sources`: striping would otherwise alternate the first choice
and make a range read of every entry), runs of consecutive entries on one replica
are one range read, every entry is checked (digest,
ledger and entry id in the header), and an entry a replica lacks or serves corrupt
is asked of the next replica; then the batch waits for the rate limit and is added to
each new bookie of its write set with the recovery flag (one callback for the batch,
so the transport packs it into one run per bookie) (a fenced ledger takes
recovery adds), the same packed bytes the writer made (digest and piggybacked LAC
unchanged). The batch is done when every new bookie acknowledged every add, i.e.
journaled it. An add a bookie already holds is answered OK without a new write, so a
copy that is repeated (a worker that crashed and a successor) is harmless.

Errors: :class:`CopyError` (retriable) when no replica can serve an entry; the add's
typed error when a new bookie refuses it (``error_for_status``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

from scriba.autorecovery.plan import ReadOrder, RepairPlan
from scriba.client.transport import BookieTransport
from scriba.entry import Digest, unpack_entry
from scriba.errors import ScribaError, Status, error_for_status
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.log import get_logger
from scriba.meta.records import LedgerMetadata

log = get_logger(__name__)


class CopyError(ScribaError):
    """No replica could serve an entry that must be copied."""

    retriable = True


@dataclass(slots=True)
class CopyStats:
    entries: int = 0
    bytes: int = 0
    adds: int = 0


Progress = Callable[[int, int], None]
"""``(entries, bytes)`` copied so far by this batch: metrics and rate figures."""


class FragmentCopier:
    def __init__(
        self,
        transport: BookieTransport,
        *,
        digest: Digest,
        master_key: bytes,
        read_order: ReadOrder,
        throttle_wait: Callable[[int, int], float],
        batch_entries: int,
        batch_bytes: int,
        read_timeout_s: float,
        on_progress: Progress | None = None,
    ) -> None:
        self._transport = transport
        self._digest = digest
        self._master_key = master_key
        self._order = read_order
        self._throttle_wait = throttle_wait
        self._batch_entries = batch_entries
        self._batch_bytes = batch_bytes
        self._read_timeout_s = read_timeout_s
        self._on_progress = on_progress

    async def copy(self, md: LedgerMetadata, plan: RepairPlan) -> CopyStats:
        stats = CopyStats()
        if not plan.copies_anything:
            return stats
        entries: Iterator[EntryId] = plan.entries(md)
        while batch := list(islice(entries, self._batch_entries)):
            got = await self._read_batch(md, plan, batch)
            size = sum(len(d) for d in got.values())
            wait = self._throttle_wait(len(batch), size)
            if wait > 0:
                await asyncio.sleep(wait)
            stats.adds += await self._write_batch(md, plan, batch, got)
            stats.entries += len(batch)
            stats.bytes += size
            if self._on_progress is not None:
                self._on_progress(len(batch), size)
        return stats

    # --- reads ------------------------------------------------------------------------
    async def _read_batch(
        self, md: LedgerMetadata, plan: RepairPlan, batch: list[EntryId]
    ) -> dict[EntryId, bytes]:
        got: dict[EntryId, bytes] = {}
        tried: dict[EntryId, list[BookieId]] = {e: plan.sources(md, e, self._order) for e in batch}
        errors: dict[EntryId, list[str]] = {e: [] for e in batch}
        while True:
            wanted = [e for e in batch if e not in got]
            if not wanted:
                return got
            for e in wanted:
                if not tried[e]:
                    raise CopyError(
                        f"ledger {md.ledger_id} entry {e}: no replica could serve it "
                        f"({'; '.join(errors[e]) or 'no replica left'})"
                    )
            by_source = assign_sources(wanted, tried)
            await asyncio.gather(*(
                self._read_from(md.ledger_id, source, ids, got, errors)
                for source, ids in by_source.items()
            ))

    async def _read_from(
        self, ledger_id: LedgerId, source: BookieId, ids: list[EntryId],
        got: dict[EntryId, bytes], errors: dict[EntryId, list[str]],
    ) -> None:
        for first, last in _runs(ids):
            try:
                if first == last:
                    datas = [await self._transport.read_entry(
                        source, ledger_id, first, master_key=self._master_key, timeout_s=self._read_timeout_s)]
                else:
                    datas = await self._transport.read_range(
                        source, ledger_id, first, last, max_entries=last - first + 1,
                        max_bytes=self._batch_bytes, master_key=self._master_key, timeout_s=self._read_timeout_s,
                    )
            except ScribaError as exc:
                for e in range(first, last + 1):
                    errors[EntryId(e)].append(f"{source}: {type(exc).__name__}")
                continue
            for offset, data in enumerate(datas):
                entry_id = EntryId(first + offset)
                if entry_id > last:
                    break
                problem = self._check(ledger_id, entry_id, data)
                if problem:
                    errors[entry_id].append(f"{source}: {problem}")
                    log.warning("replica_unusable", ledger_id=ledger_id, entry_id=entry_id,
                                bookie_id=source, error=problem)
                else:
                    got[entry_id] = data
            for e in range(first + len(datas), last + 1):
                if EntryId(e) not in got:
                    errors[EntryId(e)].append(f"{source}: short range read")

    def _check(self, ledger_id: LedgerId, entry_id: EntryId, data: bytes) -> str:
        try:
            entry = unpack_entry(self._digest, data)
        except ScribaError as exc:
            return f"{type(exc).__name__}: {exc}"
        if entry.ledger_id != ledger_id or entry.entry_id != entry_id:
            return f"header names ledger {entry.ledger_id} entry {entry.entry_id}"
        return ""

    # --- writes -----------------------------------------------------------------------
    async def _write_batch(
        self, md: LedgerMetadata, plan: RepairPlan, batch: list[EntryId], got: dict[EntryId, bytes]
    ) -> int:
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Status]] = []

        def answer(fut: asyncio.Future[Status]) -> Callable[[BookieId, LedgerId, EntryId, Status], None]:
            def on_response(_b: BookieId, _l: LedgerId, _e: EntryId, status: Status) -> None:
                if not fut.done():
                    fut.set_result(status)
            return on_response

        add_entry = getattr(self._transport, "add_entry", None)
        if add_entry is not None:  # a BatchedAddTransport: the batch travels as packed runs
            return await self._write_runs(md, plan, batch, got, add_entry)
        where: list[tuple[BookieId, EntryId]] = []
        for entry_id in batch:
            for target in plan.targets(md, entry_id):
                fut: asyncio.Future[Status] = loop.create_future()
                futures.append(fut)
                where.append((target, entry_id))
                self._transport.add(
                    target, md.ledger_id, entry_id, self._master_key, got[entry_id],
                    answer(fut), recovery=True,
                )
        statuses = await asyncio.gather(*futures)
        for (target, entry_id), status in zip(where, statuses, strict=True):
            if status != Status.OK:
                raise error_for_status(
                    status, f"ledger {md.ledger_id} entry {entry_id}: bookie {target} refused "
                            f"the copy ({Status(status).name})"
                )
        return len(futures)


    async def _write_runs(
        self, md: LedgerMetadata, plan: RepairPlan, batch: list[EntryId], got: dict[EntryId, bytes],
        add_entry: Callable[..., None],
    ) -> int:
        """The batch's adds through ``add_entry`` with one callback, so the transport packs
        them into one run per bookie (a callback per add would make a run of each add)."""
        waiting: set[tuple[BookieId, int]] = set()
        refused: list[tuple[BookieId, int, Status]] = []
        all_answered = asyncio.get_running_loop().create_future()

        def on_responses(bookie_id: BookieId, _ledger_id: int, entry_ids: list[int], status: Status) -> None:
            for entry_id in entry_ids:
                if (bookie_id, entry_id) in waiting:
                    waiting.discard((bookie_id, entry_id))
                    if status != Status.OK:
                        refused.append((bookie_id, entry_id, status))
            if not waiting and not all_answered.done():
                all_answered.set_result(None)

        for entry_id in batch:
            targets = plan.targets(md, entry_id)
            waiting.update((target, entry_id) for target in targets)
        adds = len(waiting)
        for entry_id in batch:
            add_entry(plan.targets(md, entry_id), md.ledger_id, entry_id, self._master_key, got[entry_id],
                      on_responses, recovery=True)
        if waiting:
            await all_answered
        if refused:
            target, bad_id, status = min(refused, key=lambda r: r[1])
            raise error_for_status(
                status, f"ledger {md.ledger_id} entry {bad_id}: bookie {target} refused "
                        f"the copy ({Status(status).name})"
            )
        return adds


def assign_sources(
    wanted: Sequence[EntryId], tried: dict[EntryId, list[BookieId]]
) -> dict[BookieId, list[EntryId]]:
    """Which bookie to read each wanted entry from, taking it off that entry's ``tried`` list.

    Each entry's list is its read order (the moved bookie last). Striping rotates the
    first choice from entry to entry, so taking every entry's first choice splits a batch
    into runs of one entry per bookie (a range read per entry). Instead, greedily, the
    bookie that can serve the most still-unassigned entries takes all of them, counting
    only choices before an entry's last resort (unless nothing else is left): with
    E = W, one surviving bookie serves the whole batch in one range read.
    """
    by_source: dict[BookieId, list[EntryId]] = {}
    left = sorted(wanted)

    def choices(e: EntryId) -> list[BookieId]:
        order = tried[e]
        return order[:-1] if len(order) > 1 else order

    while left:
        counts: dict[BookieId, int] = {}
        for e in left:
            for b in choices(e):
                counts[b] = counts.get(b, 0) + 1
        best = min(counts, key=lambda b: (-counts[b], b))
        taken = [e for e in left if best in choices(e)]
        for e in taken:
            tried[e].remove(best)
        by_source[best] = taken
        gone = set(taken)
        left = [e for e in left if e not in gone]
    return by_source


def _runs(ids: list[EntryId]) -> Iterator[tuple[EntryId, EntryId]]:
    """Consecutive runs of sorted ids as ``(first, last)``."""
    if not ids:
        return
    start = prev = ids[0]
    for e in ids[1:]:
        if e != prev + 1:
            yield start, prev
            start = e
        prev = e
    yield start, prev
