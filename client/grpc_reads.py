"""The reads of the gRPC transport (a layer of ``GrpcBookieTransport``).

Each read is one RPC on the bookie's channel (``grpc_channels``) with a deadline
(``read_timeout_s`` unless the caller gives one; a long poll waits its ``wait_s`` plus
``LONG_POLL_MARGIN_S``). A non-OK answer becomes its ``scriba.errors`` exception
(``error_for_status``), a gRPC failure ``UnavailableError`` or ``DeadlineExceededError``.

Range reads: one server-streamed ``ReadRange`` whose chunks are yielded as runs as they
arrive (``read_runs``; ``follow_runs`` is shared with the binary transport): a packed
chunk as it came (sizes + one blob), an old bookie's chunk of ``entries`` joined into
one. The range stops after ``max_entries`` or at a non-OK chunk, whose error is raised
only when no entry came before it (the caller goes on from the next entry); a chunk that
does not add up, or starts at another entry than the next one, is an ``InternalError``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from itertools import accumulate
from typing import Any, Final

import grpc
import grpc.aio

from scriba.client.grpc_channels import GrpcChannels, _message
from scriba.client.transport import BookieInfo, EntryRun, LacResult
from scriba.errors import InternalError, NoSuchEntryError, error_for_status
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.proto import scriba_pb2 as pb
from scriba.proto.packed import run_ends

__all__ = ["LONG_POLL_MARGIN_S", "GrpcReads", "follow_runs"]

LONG_POLL_MARGIN_S: Final = 2.0
_FENCE_FLAG: Final = pb.FENCE


class GrpcReads(GrpcChannels):
    """Entry, range and LAC reads, explicit LAC writes, bookie info (module docstring)."""

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
        conn, stub = self._stub(bookie_id)
        request = pb.ReadEntryRequest(
            ledger_id=ledger_id, entry_id=entry_id, flags=_FENCE_FLAG if fence else 0, master_key=master_key
        )
        try:
            response = await stub.ReadEntry(request, timeout=self._timeout(timeout_s))
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(conn, exc, "read_entry") from None
        if response.status != 0:
            raise error_for_status(response.status, _message(response.message, bookie_id, ledger_id, entry_id))
        return bytes(response.entry)

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
        entries: list[bytes] = []
        runs = self.read_runs(
            bookie_id, ledger_id, first_entry_id, last_entry_id,
            max_entries=max_entries, max_bytes=max_bytes, master_key=master_key, timeout_s=timeout_s,
        )
        async with contextlib.aclosing(runs):
            async for run in runs:
                entries += run.entries()
        return entries

    async def read_runs(
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
        """One ReadRange stream, each chunk yielded as a run as it arrives (packed chunks
        as they came; a chunk of an old bookie's ``entries`` joined into one)."""
        conn, stub = self._stub(bookie_id)
        request = pb.ReadRangeRequest(
            ledger_id=ledger_id,
            first_entry_id=first_entry_id,
            last_entry_id=last_entry_id,
            max_entries=max_entries,
            max_bytes=max_bytes,
            packed=self.packed_reads,
            master_key=master_key,
        )
        call = stub.ReadRange(request, timeout=self._timeout(timeout_s))
        runs = follow_runs(
            call, lambda chunk, next_id, count_max: (
                chunk.status, chunk.message, _chunk_run(chunk, bookie_id, ledger_id, next_id, count_max)),
            bookie_id, ledger_id, first_entry_id, last_entry_id, max_entries,
        )
        try:
            async with contextlib.aclosing(runs):
                async for run in runs:
                    yield run
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(conn, exc, "read_range") from None
        finally:
            call.cancel()

    async def read_lac(
        self,
        bookie_id: BookieId,
        ledger_id: LedgerId,
        *,
        fence: bool = False,
        master_key: bytes = b"",
        timeout_s: float | None = None,
    ) -> LacResult:
        request = pb.ReadLacRequest(
            ledger_id=ledger_id, flags=_FENCE_FLAG if fence else 0, master_key=master_key
        )
        return await self._read_lac(bookie_id, ledger_id, request, self._timeout(timeout_s))

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
        request = pb.ReadLacRequest(
            ledger_id=ledger_id,
            long_poll=True,
            previous_lac=previous_lac,
            timeout_ms=max(0, int(wait_s * 1000)),
            piggyback_entry=piggyback_entries_max > 0,  # a bookie that predates the max sends one
            piggyback_entries_max=max(0, piggyback_entries_max),
            master_key=master_key,
        )
        return await self._read_lac(bookie_id, ledger_id, request, wait_s + LONG_POLL_MARGIN_S)

    async def _read_lac(
        self, bookie_id: BookieId, ledger_id: LedgerId, request: pb.ReadLacRequest, timeout_s: float
    ) -> LacResult:
        conn, stub = self._stub(bookie_id)
        try:
            r = await stub.ReadLac(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(conn, exc, "read_lac") from None
        if r.status != 0:
            raise error_for_status(r.status, _message(r.message, bookie_id, ledger_id, None))
        return LacResult(
            lac=EntryId(r.lac),
            last_entry_id=EntryId(r.last_entry_id),
            last_entry=bytes(r.last_entry),
            piggybacked_entries=(
                tuple(r.piggybacked_entries) if r.piggybacked_entries
                else (r.piggybacked_entry,) if r.piggybacked_entry else ()
            ),
            fenced=r.fenced,
        )

    async def write_lac(
        self, bookie_id: BookieId, ledger_id: LedgerId, lac: EntryId, master_key: bytes,
        *, hint_only: bool = False,
    ) -> None:
        conn, stub = self._stub(bookie_id)
        request = pb.WriteLacRequest(ledger_id=ledger_id, lac=lac, master_key=master_key, hint_only=hint_only)
        try:
            r = await stub.WriteLac(request, timeout=self.read_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(conn, exc, "write_lac") from None
        if r.status != 0:
            raise error_for_status(r.status, _message(r.message, bookie_id, ledger_id, None))

    async def bookie_info(self, bookie_id: BookieId, *, timeout_s: float | None = None) -> BookieInfo:
        conn, stub = self._stub(bookie_id)
        try:
            r = await stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=self._timeout(timeout_s))
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(conn, exc, "bookie_info") from None
        if r.status != 0:
            raise error_for_status(r.status, _message(r.message, bookie_id, None, None))
        return BookieInfo(
            bookie_id=BookieId(r.bookie_id or bookie_id),
            read_only=r.state == pb.BOOKIE_READ_ONLY,
            free_bytes=r.free_bytes,
            total_bytes=r.total_bytes,
        )


async def follow_runs(
    chunks: AsyncIterator[Any],
    to_run: Callable[[Any, int, int], tuple[int, str, EntryRun | None]],
    bookie_id: BookieId,
    ledger_id: LedgerId,
    first_entry_id: EntryId,
    last_entry_id: EntryId,
    max_entries: int,
) -> AsyncGenerator[EntryRun, None]:
    """A range read's answer chunks (either wire) as runs: ``to_run(chunk, next_id,
    count_max)`` gives a chunk's status, message and run (at most ``count_max``
    entries from ``next_id``). Stops after ``max_entries``, or at a non-OK chunk (its
    error raised when no entry came before it); ``NoSuchEntryError`` when none came."""
    got = 0
    async for chunk in chunks:
        status, message, run = to_run(chunk, first_entry_id + got, max_entries - got)
        if run is not None:
            got += len(run)
            yield run
        if status != 0:
            if got:  # a short answer: the caller goes on from the next entry
                break
            raise error_for_status(status, _message(message, bookie_id, ledger_id, first_entry_id))
        if got >= max_entries:
            break
    if not got and first_entry_id <= last_entry_id:
        raise NoSuchEntryError(f"bookie {bookie_id}: ledger {ledger_id} entry {first_entry_id}: no entries")


def _chunk_run(
    chunk: pb.ReadRangeResponse, bookie_id: BookieId, ledger_id: int, next_id: int, count_max: int
) -> EntryRun | None:
    """A ReadRange chunk's entries as a run of at most ``count_max`` (None: it has none);
    ``InternalError`` when a packed chunk does not add up or starts elsewhere."""
    sizes = chunk.sizes
    if sizes or chunk.packed_entries:
        blob = chunk.packed_entries
        ends = run_ends(sizes, len(blob))
        problem = "" if ends is not None else f"{len(sizes)} sizes do not add up to {len(blob)} bytes"
    elif chunk.entries:
        entries = list(chunk.entries)
        blob = b"".join(entries)
        ends = list(accumulate(map(len, entries)))
        problem = ""
    else:
        return None
    if not problem and chunk.first_entry_id != next_id:
        problem = f"chunk starts at entry {chunk.first_entry_id}, expected {next_id}"
    if ends is None or problem:
        raise InternalError(_message(f"malformed range answer: {problem}", bookie_id, ledger_id, next_id))
    return EntryRun(EntryId(next_id), ends[:count_max] if len(ends) > count_max else ends, blob)


