"""``LedgerReader``: the read handle of a ledger (from ``Client.open_ledger``).

Range reads, LAC reads and tailing by long poll (the answer carrying the newly
confirmed entries), each run as an ``Operation`` of a read core.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Final

from scriba.client.driver import DriverConfig, read_ledger_metadata
from scriba.client.hedged_poll import HedgedPoll
from scriba.client.operation import Operation
from scriba.client.read_core import LacReadCore, ReadConfig, ReadCore, ReadOrder
from scriba.client.transport import (
    BookieTransport,
    LacAnswer,
    LacResult,
    Withdraw,
    long_poll_lac_soon,
)
from scriba.config import require
from scriba.entry import Digest, Entry, unpack_entry
from scriba.errors import (
    DigestMismatchError,
    InternalError,
    NoSuchEntryError,
)
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.log import get_logger
from scriba.meta.records import LedgerMetadata
from scriba.meta.store import MetadataStore

log = get_logger(__name__)

PIGGYBACK_ENTRIES_MAX: Final = 64  # entries a tailing long poll's answer may carry (bookies cap it too)
POLLS_AHEAD: Final = 2  # long polls a tail keeps waiting: for the next entry and those after it
POLL_REPLICAS: Final = 2  # replicas (1 or 2) each of those polls waits at: the first useful answer is taken
POLL_REPLICAS_CHOICES: Final = (1, 2)  # what ``tail(poll_replicas=...)`` takes


class LedgerReader:
    """A read handle (from ``Client.open_ledger``)."""

    def __init__(
        self,
        metadata: LedgerMetadata,
        *,
        store: MetadataStore,
        transport: BookieTransport,
        digest: Digest,
        master_key: bytes,
        read_order: ReadOrder,
        config: DriverConfig | None = None,
        read_config: ReadConfig | None = None,
    ) -> None:
        self._md = metadata
        self._store = store
        self._transport = transport
        self._digest = digest
        self._master_key = master_key
        self._read_order = read_order
        self._config = (config or DriverConfig()).validate()
        self._read_config = read_config
        self._lac = int(metadata.last_entry_id)
        self._poll_index = 0
        self._poll_bookie: BookieId | None = None  # the bookie a tail polls while it can
        self._poll_second: BookieId | None = None  # and the second one (tail's poll_replicas)
        self._second_index = 0

    @property
    def ledger_id(self) -> LedgerId:
        return self._md.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._md

    @property
    def is_closed(self) -> bool:
        return self._md.is_closed

    @property
    def last_add_confirmed(self) -> EntryId:
        """The last entry known confirmed (for a closed ledger: its last entry)."""
        return EntryId(self._md.last_entry_id if self._md.is_closed else self._lac)

    def _operation(self, core: Any) -> Operation:
        return Operation(
            core, ledger_id=self._md.ledger_id, store=self._store, transport=self._transport,
            master_key=self._master_key, config=self._config,
        )

    async def refresh(self) -> LedgerMetadata:
        """Re-read the ledger's record (state, ensembles, last entry)."""
        self._md = await read_ledger_metadata(self._store, self._md.ledger_id, self._config.metadata_timeout_s)
        return self._md

    async def read_last_add_confirmed(self) -> EntryId:
        """The LAC: the record's last entry if closed, else max LAC of a quorum of bookies."""
        if self._md.is_closed:
            return self._md.last_entry_id
        core = LacReadCore(self._md)
        op = self._operation(core)
        async for _ in op.run(core.start()):
            pass
        lac = op.result
        if not isinstance(lac, int):
            raise InternalError("LAC read finished without a value")
        self._lac = max(self._lac, lac)
        return EntryId(self._lac)

    async def read(self, first: int = 0, last: int | None = None) -> AsyncIterator[Entry]:
        """Entries ``first..last`` (default: to the LAC), verified, in order.

        Only confirmed entries: beyond the LAC (or a closed ledger's last entry)
        raises ``NoSuchEntryError``.
        """
        bound = self.last_add_confirmed
        if last is None or last > bound:
            if not self._md.is_closed:
                bound = await self.read_last_add_confirmed()
            if last is None:
                last = bound
        if last > bound:
            raise NoSuchEntryError(
                f"ledger {self._md.ledger_id}: entry {last} is beyond the last confirmed "
                f"entry {bound}"
            )
        if first < 0:
            raise NoSuchEntryError(f"ledger {self._md.ledger_id}: entry {first} < 0")
        if first > last:
            return
        core = ReadCore(
            self._md, first, last, digest=self._digest, read_order=self._read_order,
            config=self._read_config,
        )
        async for batch in self._operation(core).run(core.start()):
            for entry in batch:
                yield entry

    async def tail(self, start: int = 0, *, poll_replicas: int = POLL_REPLICAS, poll_pause_s: float = 0.0,
                   hurry: asyncio.Event | None = None) -> AsyncGenerator[Entry, None]:
        """Follow the ledger from ``start``: every entry in order, ending once it is closed.

        Waiting at the end is by long poll (``ReadLastConfirmed`` with ``long_poll``): the
        bookie answers as soon as its LAC passes the poll's ``previous_lac``, carrying the
        newly confirmed entries with it (``piggybacked_entries``, up to
        ``PIGGYBACK_ENTRIES_MAX``), so an entry is delivered one round trip after the
        bookie learns it is confirmed. What the answer did not carry (a larger step, a
        bookie without its copy yet, an older bookie) is read from the replicas, and the
        next poll goes to another replica of the write set.

        Two polls wait at a time (``POLLS_AHEAD``): one for the next entry and one for the
        entry after it, each re-armed as soon as its answer is in, before the entries are
        delivered. With one poll at a time, an LAC that moves again while the answer
        travels back and the next poll travels out waits for that poll; a writer at 1k
        entries/s moves it every millisecond. Only the answer to the poll for the next
        entry is delivered from (consecutive, verified, none beyond its own LAC: see
        ``piggybacked``); an answer that a larger step made stale is dropped.

        Each of those polls waits at two replicas of the entry's write set at once
        (``poll_replicas``, default ``POLL_REPLICAS``) and takes the first answer that
        carries the entry: the writer pushes the LAC to each bookie on its own, and the
        bookie a single poll waited at may learn it last (descheduled, busy with its
        journal, or its push slow). Any bookie's LAC is a confirmed point, so whichever
        answers first is as good as the other; the slower answer is dropped. That hedge
        costs a second answer (and poll) per entry at the bookies and here: a tail whose
        delivery latency matters less than CPU (an RSM follower, off the commit path)
        passes ``poll_replicas=1``.

        Each poll is a ``HedgedPoll`` (``hedged_poll.py``): one future, each replica's poll
        sent in the next loop turn through the transport's ``long_poll_lac_soon`` and
        answered by callback, one timer for its deadline; no task, ``asyncio.wait`` or
        ``asyncio.timeout`` per entry.

        ``poll_pause_s`` > 0 trades delivery latency for CPU: after each answer's entries
        are delivered, the tail waits that long, then sends one poll (not ``POLLS_AHEAD``).
        Entries confirmed meanwhile come back together in its answer, so a writer faster
        than one entry per pause costs one poll and one answer per pause, not per entry.
        While ``hurry`` is set (someone waits for the next entries: a read on an RSM
        follower), the tail does not pause, and a pause under way ends when it is set.
        """
        require(poll_replicas in POLL_REPLICAS_CHOICES, "poll_replicas", f"one of {POLL_REPLICAS_CHOICES}")
        require(0.0 <= poll_pause_s <= 1.0, "poll_pause_s", "must be in [0, 1] s")
        ahead = 1 if poll_pause_s > 0 else POLLS_AHEAD
        next_id = start
        failures = 0
        polls: dict[int, HedgedPoll] = {}  # previous_lac -> its poll
        try:
            while True:
                if self._md.is_closed:
                    if next_id <= self._md.last_entry_id:
                        async for entry in self.read(next_id, self._md.last_entry_id):
                            yield entry
                    return
                if next_id <= self._lac:
                    last = self._lac
                    async for entry in self.read(next_id, last):
                        yield entry
                    next_id = last + 1
                    continue
                self._arm(polls, next_id - 1, poll_replicas, ahead)
                result = await polls.pop(next_id - 1)
                if result is None:  # that bookie failed: back off (bounded), try the next
                    failures += 1
                    await asyncio.sleep(min(0.05 * failures, 1.0))
                else:
                    failures = 0
                if result is None or result.lac < next_id:  # closed meanwhile? a new ensemble?
                    _cancel(polls)
                    await self.refresh()
                    continue
                self._lac = max(self._lac, int(result.lac))
                carried = piggybacked(result, self._md.ledger_id, next_id, self._digest)
                if not carried:
                    self._next_replica()  # its copy lags (or is bad): poll another replica next
                    continue
                after = next_id + len(carried)
                if after > self._lac and not poll_pause_s:  # waiting again once these are delivered: poll now
                    self._arm(polls, after - 1, poll_replicas, ahead)
                for entry in carried:
                    yield entry
                    next_id += 1
                if poll_pause_s and next_id > self._lac:  # caught up with what is known confirmed
                    await _pause(poll_pause_s, hurry)
        finally:
            _cancel(polls)

    def _arm(self, polls: dict[int, HedgedPoll], previous_lac: int, replicas: int, ahead: int) -> None:
        """Polls for ``previous_lac`` and the ``ahead - 1`` entries after it; stale ones
        (for entries already delivered) are cancelled."""
        for stale in [p for p in polls if p < previous_lac]:
            polls.pop(stale).cancel()
        for previous in range(previous_lac, previous_lac + ahead):
            if previous not in polls:
                polls[previous] = self._long_poll(EntryId(previous), replicas)

    def _long_poll(self, previous_lac: EntryId, replicas: int) -> HedgedPoll:
        """A poll, at ``replicas`` bookies that hold entry ``previous_lac + 1`` (the best
        in read order; after a failure the next ones), resolving with the first answer
        that carries that entry; else with the answer with the highest LAC (the entry not
        yet stored there, or the poll's time up); None if every one of them failed
        (``hedged_poll.py``). Sent in the next loop turn, each over its own long poll;
        cancelling it withdraws them."""
        ledger_id, wait_s, key = self._md.ledger_id, self._config.long_poll_s, self._master_key
        transport = self._transport

        def start(bookie_id: BookieId, on_answer: LacAnswer) -> Withdraw:
            return long_poll_lac_soon(
                transport, bookie_id, ledger_id, previous_lac, on_answer, wait_s=wait_s,
                piggyback_entries_max=PIGGYBACK_ENTRIES_MAX, master_key=key,
            )

        return HedgedPoll(
            lambda: self._poll_targets(previous_lac + 1, replicas), previous_lac, start, self._poll_failed,
            self._config.long_poll_s + self._config.read_timeout_s,
        )

    def _poll_failed(self, bookie_id: BookieId, exc: BaseException) -> None:
        """A bookie's long poll failed (or its time was up): if it is the bookie the
        tail's polls go to first, they go to the next replica from now on."""
        log.debug("long_poll_failed", ledger_id=self._md.ledger_id, bookie_id=bookie_id, error=str(exc))
        if bookie_id == self._poll_bookie:
            self._next_replica()
        elif bookie_id == self._poll_second:
            self._second_index += 1
            self._poll_second = None

    def _poll_targets(self, entry_id: int, replicas: int) -> list[BookieId]:
        """The bookies to long-poll for ``entry_id``: ``_poll_target``'s, and (with
        ``replicas`` 2) a second replica of the entry's write set, likewise kept while
        it holds the entries and has not failed (after a failure, the next one)."""
        write_set = self._md.write_set(entry_id)
        primary = self._poll_target(write_set)
        if replicas < 2:
            return [primary]
        second = self._poll_second
        if second is None or second == primary or second not in write_set:
            others = [b for b in self._read_order(write_set) if b != primary]
            if not others:
                return [primary]
            second = self._poll_second = others[self._second_index % len(others)]
        return [primary, second]

    def _poll_target(self, write_set: tuple[BookieId, ...]) -> BookieId:
        """The bookie to long-poll for an entry of ``write_set``: the one polled last
        while it holds that entry (a tail's polls, those waiting ahead included, see one
        bookie's LAC, which only rises), else the best in read order of the entry's
        write set (after a failure or a lagging copy, the next one)."""
        if self._poll_bookie in write_set:
            return self._poll_bookie  # type: ignore[return-value]
        order = self._read_order(write_set)
        self._poll_bookie = order[self._poll_index % len(order)]
        return self._poll_bookie

    def _next_replica(self) -> None:
        self._poll_index += 1
        self._poll_bookie = None

    async def close(self) -> None:
        """Nothing to release (reads hold no resources between calls)."""


def _cancel(polls: dict[int, HedgedPoll]) -> None:
    for poll in polls.values():
        poll.cancel()
    polls.clear()


def piggybacked(result: LacResult, ledger_id: LedgerId, first: int, digest: Digest) -> list[Entry]:
    """The entries of a long poll's answer that may be delivered: consecutive from
    ``first``, each verified (digest, and a header naming that entry of this ledger) and
    **none beyond the LAC of the same answer** — a reader never sees an unconfirmed entry,
    whatever a bookie sends. Stops at the first that fails; the reader reads the rest
    from the replicas (which also reports a corrupt copy)."""
    entries: list[Entry] = []
    entry_id = first
    for data in result.piggybacked_entries:
        if entry_id > result.lac:
            break
        try:
            entry = unpack_entry(digest, data)
        except DigestMismatchError:
            break
        if entry.ledger_id != ledger_id or entry.entry_id != entry_id:
            break
        entries.append(entry)
        entry_id += 1
    return entries


async def _pause(seconds: float, hurry: asyncio.Event | None) -> None:
    """A tail's pause: ``seconds``, over as soon as ``hurry`` is set (at once if it is)."""
    if hurry is None:
        await asyncio.sleep(seconds)
    elif not hurry.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await hurry.wait()
