"""How the client talks to bookies: the ``BookieTransport`` seam.

The ledger cores decide *what* to send; a transport sends it. The gRPC transport
(``grpc_transport.py``) batches adds per bookie onto one bidirectional stream while
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

Likewise for range reads: ``RunReadTransport.read_runs`` yields a range's entries as
``EntryRun``s (consecutive entries in one bytes object, split by offsets: no object per
entry until the reader verifies them); drivers fall back to ``read_range``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from scriba.errors import Status
from scriba.ids import BookieId, EntryId, LedgerId

AddCallback = Callable[[BookieId, LedgerId, EntryId, Status], None]
AddRunCallback = Callable[[BookieId, int, list[int], Status], None]
"""``(bookie_id, ledger_id, entry_ids, status)``: adds answered alike (any order of ids)."""


@dataclass(frozen=True, slots=True)
class LacResult:
    """One bookie's answer to a LAC read."""

    lac: EntryId  # max(explicit LAC, LAC piggybacked on its entries); -1 if none
    last_entry_id: EntryId  # highest entry it stores; -1 if none
    last_entry: bytes = b""  # packed entry ``last_entry_id`` (fencing reads)
    piggybacked_entry: bytes = b""  # long poll: packed entry previous_lac + 1
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
        piggyback_entry: bool = True,
    ) -> LacResult:
        """Answers once the bookie's LAC passes ``previous_lac`` or ``wait_s`` passes."""
        ...

    async def write_lac(
        self, bookie_id: BookieId, ledger_id: LedgerId, lac: EntryId, master_key: bytes
    ) -> None: ...

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
        timeout_s: float | None = None,
    ) -> AsyncGenerator[EntryRun, None]:
        """``read_range`` as runs, each yielded as it arrives: consecutive from
        ``first_entry_id``, possibly fewer entries than asked (a short answer ends the
        iteration; the caller reads on from the next entry). Raises the typed error
        when the range yields no entry at all."""
        ...
