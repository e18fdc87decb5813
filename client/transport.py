"""How the client talks to bookies: the ``BookieTransport`` seam.

The ledger cores decide *what* to send; a transport sends it. The gRPC transport
(``grpc_transport.py``; ``binary_transport.py`` extends it with the binary data path
for the bookies that offer one) batches adds per bookie onto one bidirectional stream while
earlier ones are in flight; the simulation's transport delivers them through a
seeded simulated network.

Adds are fire-and-callback (no coroutine per entry on the hot path): ``add()``
queues the request and later calls ``on_response(bookie_id, ledger_id, entry_id,
status)`` exactly once — with ``Status.TIMEOUT`` when ``add_timeout_s`` passes and
``Status.UNAVAILABLE`` when the connection fails. Reads are coroutines that return
values or raise the typed errors of ``scriba.errors``, each with a deadline.

A transport may also offer the batched write path of ``BatchedAddTransport``:
``add_entry(bookies, ...)`` queues one entry for its whole write set in one call,
and answers come as ``on_responses(bookie_id, ledger_id, entry_ids, status)``, one
call for many adds of one bookie that got the same status (each add named exactly
once). Drivers use it when present (``getattr``) and fall back to ``add``.

Long polls may also be issued without a coroutine (``PollSoonTransport``):
``long_poll_lac_soon`` sends the poll and calls ``on_answer`` once with its
``LacResult`` or its typed error, and returns a function that withdraws it. A tailing
reader builds its hedged polls from these (``hedged_poll.py``); ``long_poll_lac_soon``
(the module function) runs ``long_poll_lac`` in a task for a transport without one.

Likewise for range reads: ``RunReadTransport.read_runs`` yields a range's entries as
``EntryRun``s (consecutive entries in one bytes object, split by offsets: no object per
entry until the reader verifies them); drivers fall back to ``read_range``.

``TransportConfig`` holds a transport's deadlines and bounds (the gRPC transport reads
them all; ``add_batcher.py`` explains the batching ones).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from scriba.config import require
from scriba.errors import Status
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.tls import TlsConfig

AddCallback = Callable[[BookieId, LedgerId, EntryId, Status], None]
AddRunCallback = Callable[[BookieId, int, list[int], Status], None]
"""``(bookie_id, ledger_id, entry_ids, status)``: adds answered alike (any order of ids)."""


PROTOCOLS = ("binary", "grpc")


@dataclass(frozen=True, slots=True)
class TransportConfig:
    """Deadlines and bounds of a bookie transport (``validate()`` names a bad field)."""

    add_timeout_s: float = 10.0  # an add unanswered this long is answered TIMEOUT
    read_timeout_s: float = 5.0  # deadline of every read, LAC write and info call
    packed_reads: bool = True  # ask range reads as runs (False: as an old client)
    # Batching (add_batcher.py): adds per message and bytes per message, per bookie. 512:
    # a bookie spends ~20% less CPU per add than at 256, the client about the same
    # (``scriba bench``, 3 bookies, 1 KiB).
    batch_entries_max: int = 512
    batch_bytes_max: int = 1024 * 1024
    batches_inflight_max: int = 8  # unanswered messages before partial ones are held back
    # Back-pressure per bookie: wait_writable() blocks at inflight_bytes_max; an add
    # beyond inflight_bytes_hard_max is answered TOO_MANY_REQUESTS (None: 4 x the soft bound).
    inflight_bytes_max: int = 64 * 1024 * 1024
    inflight_bytes_hard_max: int | None = None
    sweep_interval_s: float | None = None  # add deadline checks (None: add_timeout_s / 10, 5..100 ms)
    # "binary": adds and reads over the binary data path to each bookie that advertises
    # one (binary_transport.py), gRPC to the others; "grpc": everything over gRPC.
    protocol: str = "binary"
    tls: TlsConfig | None = None  # dial bookies over TLS (server name verified); None: plaintext

    def validate(self) -> TransportConfig:
        require(self.add_timeout_s > 0, "add_timeout_s", "must be > 0")
        require(self.read_timeout_s > 0, "read_timeout_s", "must be > 0")
        require(self.batch_entries_max >= 1, "batch_entries_max", "must be >= 1")
        require(self.batch_bytes_max >= 1, "batch_bytes_max", "must be >= 1")
        require(self.batches_inflight_max >= 1, "batches_inflight_max", "must be >= 1")
        require(self.inflight_bytes_max >= 1, "inflight_bytes_max", "must be >= 1")
        require(
            self.inflight_bytes_hard_max is None or self.inflight_bytes_hard_max >= self.inflight_bytes_max,
            "inflight_bytes_hard_max",
            "must be at least inflight_bytes_max",
        )
        require(
            self.sweep_interval_s is None or self.sweep_interval_s > 0, "sweep_interval_s", "must be > 0"
        )
        require(self.protocol in PROTOCOLS, "protocol", f"{self.protocol!r}: one of {', '.join(PROTOCOLS)}")
        if self.tls is not None:
            self.tls.validate()
        return self

    @property
    def send_window_entries(self) -> int:
        """Unanswered adds per bookie beyond which partial messages wait."""
        return self.batch_entries_max * self.batches_inflight_max

    @property
    def resolved_inflight_bytes_hard_max(self) -> int:
        hard_max = self.inflight_bytes_hard_max
        return hard_max if hard_max is not None else 4 * self.inflight_bytes_max

    @property
    def resolved_sweep_interval_s(self) -> float:
        if self.sweep_interval_s is not None:
            return self.sweep_interval_s
        return max(0.005, min(0.1, self.add_timeout_s / 10))


@dataclass(frozen=True, slots=True)
class LacResult:
    """One bookie's answer to a LAC read."""

    lac: EntryId  # max(explicit LAC, LAC piggybacked on its entries); -1 if none
    last_entry_id: EntryId  # highest entry it stores; -1 if none
    last_entry: bytes = b""  # packed entry ``last_entry_id`` (fencing reads)
    # long poll: packed entries previous_lac + 1, + 2, ... (consecutive, none beyond ``lac``;
    # the bookie's word: the reader checks them)
    piggybacked_entries: tuple[bytes, ...] = ()
    fenced: bool = False


@dataclass(frozen=True, slots=True)
class EntryRun:
    """Consecutive packed entries (unverified) from ``first_entry_id`` in one ``blob``:
    entry ``first_entry_id + i`` is ``blob[ends[i - 1]:ends[i]]``, the first one
    ``blob[0:ends[0]]``."""

    first_entry_id: EntryId
    ends: Sequence[int]
    blob: bytes

    def __len__(self) -> int:
        return len(self.ends)

    def entries(self) -> list[bytes]:
        """The entries as separate bytes objects (one copy each)."""
        blob = self.blob
        return list(map(blob.__getitem__, map(slice, [0, *self.ends[:-1]], self.ends)))


@dataclass(frozen=True, slots=True)
class BookieInfo:
    bookie_id: BookieId
    read_only: bool
    free_bytes: int
    total_bytes: int


class BookieTransport(Protocol):
    def add(
        self,
        bookie_id: BookieId,
        ledger_id: LedgerId,
        entry_id: EntryId,
        master_key: bytes,
        entry: bytes,
        on_response: AddCallback,
        *,
        recovery: bool = False,
    ) -> None:
        """Queue one add; ``on_response`` is called exactly once."""
        ...

    async def read_entry(
        self,
        bookie_id: BookieId,
        ledger_id: LedgerId,
        entry_id: EntryId,
        *,
        fence: bool = False,
        master_key: bytes = b"",
        timeout_s: float | None = None,
    ) -> bytes:
        """The packed entry (unverified: the caller checks the digest)."""
        ...

    async def read_range(
        self,
        bookie_id: BookieId,
        ledger_id: LedgerId,
        first_entry_id: EntryId,
        last_entry_id: EntryId,
        *,
        max_entries: int = 1024,
        max_bytes: int = 4 * 1024 * 1024,
        master_key: bytes = b"",
        timeout_s: float | None = None,
    ) -> list[bytes]:
        """Consecutive packed entries from ``first_entry_id`` (possibly fewer than asked)."""
        ...

    async def read_lac(
        self,
        bookie_id: BookieId,
        ledger_id: LedgerId,
        *,
        fence: bool = False,
        master_key: bytes = b"",
        timeout_s: float | None = None,
    ) -> LacResult: ...

    async def long_poll_lac(
        self,
        bookie_id: BookieId,
        ledger_id: LedgerId,
        previous_lac: EntryId,
        *,
        wait_s: float,
        piggyback_entries_max: int = 1,
        master_key: bytes = b"",
    ) -> LacResult:
        """Answers once the bookie's LAC passes ``previous_lac`` or ``wait_s`` passes, with up
        to ``piggyback_entries_max`` entries from ``previous_lac + 1`` (none beyond the LAC)."""
        ...

    async def write_lac(
        self, bookie_id: BookieId, ledger_id: LedgerId, lac: EntryId, master_key: bytes,
        *, hint_only: bool = False,
    ) -> None:
        """The writer's LAC to one bookie: journaled, or with ``hint_only`` only raised in
        the bookie's memory for tailing readers (``WriteLacRequest.hint_only``)."""
        ...

    async def bookie_info(self, bookie_id: BookieId, *, timeout_s: float | None = None) -> BookieInfo: ...

    async def close(self) -> None: ...


class BatchedAddTransport(BookieTransport, Protocol):
    def add_entry(
        self,
        bookies: Iterable[BookieId],
        ledger_id: LedgerId,
        entry_id: EntryId,
        master_key: bytes,
        entry: bytes,
        on_responses: AddRunCallback,
        *,
        recovery: bool = False,
    ) -> None:
        """Queue ``entry`` to every bookie of ``bookies``; each add is answered once
        through ``on_responses`` (batched per bookie and status)."""
        ...


LacAnswer = Callable[[LacResult | BaseException], None]
"""A long poll's answer: its ``LacResult``, or the error ``long_poll_lac`` would raise."""
Withdraw = Callable[[], object]
"""Withdraws a poll issued by ``long_poll_lac_soon`` (its ``on_answer`` is then not called)."""


class PollSoonTransport(BookieTransport, Protocol):
    def long_poll_lac_soon(
        self,
        bookie_id: BookieId,
        ledger_id: LedgerId,
        previous_lac: EntryId,
        on_answer: LacAnswer,
        *,
        wait_s: float,
        piggyback_entries_max: int = 1,
        master_key: bytes = b"",
    ) -> Withdraw:
        """``long_poll_lac`` without a coroutine: ``on_answer`` is called once (never
        before this returns) with the answer or the typed error, its deadline's
        included, unless the returned function withdrew the poll first."""
        ...


def long_poll_lac_soon(
    transport: BookieTransport,
    bookie_id: BookieId,
    ledger_id: LedgerId,
    previous_lac: EntryId,
    on_answer: LacAnswer,
    *,
    wait_s: float,
    piggyback_entries_max: int = 1,
    master_key: bytes = b"",
) -> Withdraw:
    """``transport.long_poll_lac_soon`` if it has one, else its ``long_poll_lac`` in a
    task whose outcome goes to ``on_answer`` (withdrawing cancels the task)."""
    soon = getattr(transport, "long_poll_lac_soon", None)
    if soon is not None:
        withdraw: Withdraw = soon(bookie_id, ledger_id, previous_lac, on_answer, wait_s=wait_s,
                                  piggyback_entries_max=piggyback_entries_max, master_key=master_key)
        return withdraw
    return poll_in_task(transport.long_poll_lac(
        bookie_id, ledger_id, previous_lac, wait_s=wait_s, piggyback_entries_max=piggyback_entries_max,
        master_key=master_key), on_answer)


def poll_in_task(poll: Coroutine[Any, Any, LacResult], on_answer: LacAnswer) -> Withdraw:
    """Run ``poll`` in a task; its result or error goes to ``on_answer`` unless the
    returned function (the task's ``cancel``) withdrew it first."""
    task = asyncio.get_running_loop().create_task(poll)

    def done(task: asyncio.Task[LacResult]) -> None:
        if task.cancelled():
            return  # withdrawn
        error = task.exception()
        on_answer(error if error is not None else task.result())

    task.add_done_callback(done)
    return task.cancel


class RunReadTransport(BookieTransport, Protocol):
    def read_runs(
        self,
        bookie_id: BookieId,
        ledger_id: LedgerId,
        first_entry_id: EntryId,
        last_entry_id: EntryId,
        *,
        max_entries: int = 1024,
        max_bytes: int = 4 * 1024 * 1024,
        master_key: bytes = b"",
        timeout_s: float | None = None,
    ) -> AsyncGenerator[EntryRun, None]:
        """``read_range`` as runs, each yielded as it arrives: consecutive from
        ``first_entry_id``, possibly fewer entries than asked (a short answer ends the
        iteration; the caller reads on from the next entry). Raises the typed error
        when the range yields no entry at all."""
        ...
