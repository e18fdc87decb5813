"""The read side of the bookie's gRPC servicer (a layer of ``BookieService``).

Reads: unary (``ReadEntry``, ``ReadLac``) or server-streamed (``ReadRange``: chunks of
consecutive entries bounded in entries and bytes; a client that asks ``packed`` gets
each chunk's entries as one run, serialized here with one copy of the entries). The
binary path serves its reads through the same methods (``range_chunks`` for either
wire). A read that carries the FENCE flag fences the ledger first (it needs the master
key). A long poll waits, bounded by ``long_poll_timeout_ms_max``, for the LAC to pass the
reader's and answers with the confirmed entries it waits for (``_piggyback``).
``WriteLac`` (the writer's explicit LAC, or a hint) and ``GetBookieInfo`` are here too.

Read authorisation (as BookKeeper's bookies check the master key on reads): a ledger
bound here to the master key of a password (any key but that of the empty password)
is read only by a caller that sends that same master key (the one-way derivation the
adds carry, never the password), or whose mutual-TLS identity is on the admin
allow-list (``scriba.tls.is_admin``: autorecovery and operators' tools). Anyone else
gets UNAUTHORIZED, not retriable, on every read kind: entry, range, LAC and long poll
(checked again when the poll answers, for a ledger that arrived while it waited).
Ledgers without a password, and ledgers not on this bookie, read as before.

Every failure is answered as a status (``_fail``, through ``serving.error_status``).
"""

from __future__ import annotations

import asyncio
import hmac
import struct
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final

from scriba.bookie.metrics import BookieMetrics
from scriba.bookie.serving import ServingState, caller_identities, error_status
from scriba.bookie.storage_api import LacState, LedgerStorage, long_poll_entries
from scriba.entry import HEADER_SIZE, master_key
from scriba.errors import (
    BadRequestError,
    BookieReadOnlyError,
    ScribaError,
    Status,
    UnauthorizedError,
)
from scriba.ids import LEDGER_ID_MAX
from scriba.log import get_logger
from scriba.proto import scriba_pb2 as pb
from scriba.proto import scriba_pb2_grpc as pb_grpc
from scriba.proto.packed import encode_packed_chunk
from scriba.tls import LoadedTls, is_admin

__all__ = ["OPEN_LEDGER_KEY", "BookieReads"]

log = get_logger(__name__)

_IDS: Final = struct.Struct(">Qq")  # the ledger id and entry id at the front of a packed entry
_OK: Final[Any] = int(Status.OK)
_NO_SUCH_ENTRY: Final[Any] = int(Status.NO_SUCH_ENTRY)
OPEN_LEDGER_KEY: Final = master_key(b"")  # the key of a ledger without a password: anyone reads it


class BookieReads(pb_grpc.BookieServicer):
    """Read RPCs, ``WriteLac`` and ``GetBookieInfo`` of ``BookieService`` (module docstring)."""

    # set by BookieService.__init__
    _storage: LedgerStorage
    _tls: LoadedTls | None
    _state: ServingState
    _metrics: BookieMetrics
    _long_poll_s_max: float
    _range_entries_max: int
    _range_bytes_max: int
    packed_reads: bool

    def _check_ids(self, ledger_id: int, entry_id: int | None = None) -> None:
        if ledger_id > LEDGER_ID_MAX:
            raise BadRequestError(f"ledger id {ledger_id} out of range")
        if entry_id is not None and entry_id < -1:
            raise BadRequestError(f"entry id {entry_id} out of range")

    def _authorize_read(self, ledger_id: int, key: bytes, context: Any) -> None:
        """UNAUTHORIZED unless the ledger is open to all here, ``key`` is its master key or
        the caller is an admin (module docstring)."""
        bound = self._storage.ledger_master_key(ledger_id)
        if not bound or bound == OPEN_LEDGER_KEY or hmac.compare_digest(bound, key):
            return
        if self._tls is not None and is_admin(self._tls.config, caller_identities(context)):
            return
        why = "no master key was sent" if not key else "the master key sent does not match"
        raise UnauthorizedError(
            f"ledger {ledger_id} has a password: {why} (read with the ledger's password, or as an admin)"
        )

    async def _fence(self, ledger_id: int, master_key: bytes) -> LacState:
        if not master_key:
            raise BadRequestError("FENCE needs the master key")
        state = await self._storage.fence(ledger_id, master_key)
        log.info("ledger_fenced", bookie_id=self._state.bookie_id, ledger_id=ledger_id,
                 lac=state.lac, entry_id=state.last_entry_id)
        return state

    async def ReadEntry(self, request: pb.ReadEntryRequest, context: Any) -> pb.ReadEntryResponse:
        started = time.perf_counter()
        lid = request.ledger_id
        eid = request.entry_id
        try:
            self._check_ids(lid, eid)
            if request.flags & pb.FENCE:
                await self._fence(lid, request.master_key)
            self._authorize_read(lid, request.master_key, context)
            data = self._storage.read_entry(lid, eid)
            if eid < 0 and len(data) >= HEADER_SIZE:
                eid = _IDS.unpack_from(data)[1]
            response = pb.ReadEntryResponse(status=_OK, ledger_id=lid, entry_id=eid, entry=data)
        except Exception as exc:
            response = pb.ReadEntryResponse(ledger_id=lid, entry_id=eid)
            self._fail(response, exc, "read_entry", lid, eid)
        self._metrics.observe_read("entry", response.status, time.perf_counter() - started)
        return response

    async def ReadRange(
        self, request: pb.ReadRangeRequest, context: Any
    ) -> AsyncIterator[pb.ReadRangeResponse | bytes]:
        """Chunks of consecutive entries; with ``packed``, each OK chunk is a serialized
        packed ``ReadRangeResponse`` (see ``scriba.proto.packed``; ``new_grpc_server``
        sends bytes as they are), else a message with one ``entries`` element each."""
        packed = request.packed and self.packed_reads
        status: Any
        async for status, first, entries, message in self.range_chunks(request, context):
            if status != _OK:
                yield pb.ReadRangeResponse(status=status, first_entry_id=first, message=message)
            elif packed:
                yield encode_packed_chunk(first, entries)
            else:
                yield pb.ReadRangeResponse(status=_OK, first_entry_id=first, entries=entries)

    async def range_chunks(
        self, request: pb.ReadRangeRequest, context: Any = None
    ) -> AsyncIterator[tuple[int, int, Sequence[bytes], str]]:
        """A range read as ``(status, first_entry_id, entries, message)`` chunks, for
        either wire: OK chunks of consecutive entries bounded in entries and bytes, then
        at most one non-OK chunk (no entries) that ends the range early."""
        started = time.perf_counter()
        lid = request.ledger_id
        first = request.first_entry_id
        last = request.last_entry_id
        entries_max = min(request.max_entries or self._range_entries_max, self._range_entries_max)
        bytes_max = min(request.max_bytes or self._range_bytes_max, self._range_bytes_max)
        status: Any = _OK
        try:
            self._check_ids(lid)
            if first < 0 or last < first:
                raise BadRequestError(f"range {first}..{last} is empty or negative")
            if request.flags & pb.FENCE:
                await self._fence(lid, request.master_key)
            self._authorize_read(lid, request.master_key, context)
        except Exception as exc:
            response = pb.ReadRangeResponse(first_entry_id=first)
            self._fail(response, exc, "read_range", lid, first)
            self._metrics.observe_read("range", response.status, time.perf_counter() - started)
            yield response.status, first, (), response.message
            return
        next_id = first
        while next_id <= last:
            try:
                entries = self._storage.read_range(lid, next_id, last, entries_max, bytes_max)
            except Exception as exc:
                response = pb.ReadRangeResponse(first_entry_id=next_id)
                self._fail(response, exc, "read_range", lid, next_id)
                status = response.status
                yield status, next_id, (), response.message
                break
            if not entries:  # storage promised at least `first` or an error
                status = _NO_SUCH_ENTRY
                yield status, next_id, (), "no entry"
                break
            yield _OK, next_id, entries, ""
            next_id += len(entries)
        self._metrics.observe_read("range", status, time.perf_counter() - started)

    async def ReadLac(self, request: pb.ReadLacRequest, context: Any) -> pb.ReadLacResponse:
        started = time.perf_counter()
        lid = request.ledger_id
        kind = "lac"
        try:
            self._check_ids(lid)
            fence = bool(request.flags & pb.FENCE)
            if fence:
                kind = "fence"
                state = await self._fence(lid, request.master_key)
            elif request.long_poll:
                kind = "long_poll"
                previous = request.previous_lac
                if previous < -1:
                    raise BadRequestError(f"previous_lac {previous} out of range")
                self._authorize_read(lid, request.master_key, context)
                timeout_s = min(request.timeout_ms / 1000.0, self._long_poll_s_max)
                wanted = bool(request.piggyback_entries_max or request.piggyback_entry)  # answer with entries
                state = await self._storage.wait_lac(lid, previous, timeout_s, entry=wanted)
                self._authorize_read(lid, request.master_key, context)  # the ledger may have come meanwhile
            else:
                self._authorize_read(lid, request.master_key, context)
                state = self._storage.lac_state(lid)
            response = pb.ReadLacResponse(
                status=_OK, lac=state.lac, last_entry_id=state.last_entry_id, fenced=state.fenced
            )
            if fence and state.last_entry_id >= 0:
                response.last_entry = self._storage.read_entry(lid, state.last_entry_id)
            if request.long_poll and state.lac > request.previous_lac:
                self._piggyback(response, request, state.lac)
        except Exception as exc:
            response = pb.ReadLacResponse(lac=-1, last_entry_id=-1)
            self._fail(response, exc, "read_lac", lid, None)
        self._metrics.observe_read(kind, response.status, time.perf_counter() - started)
        return response

    def _piggyback(self, response: pb.ReadLacResponse, request: pb.ReadLacRequest, lac: int) -> None:
        """A long poll's answer carries the entries the reader waits for (confirmed ones
        only): ``piggyback_entries_max`` of them, or the one of ``piggyback_entry``."""
        lid, previous = request.ledger_id, request.previous_lac
        if request.piggyback_entries_max:
            entries_max = min(request.piggyback_entries_max, self._range_entries_max)
            response.piggybacked_entries.extend(
                long_poll_entries(self._storage, lid, previous, lac, entries_max, self._range_bytes_max)
            )
        elif request.piggyback_entry:
            entries = long_poll_entries(self._storage, lid, previous, lac, 1, self._range_bytes_max)
            if entries:
                response.piggybacked_entry = entries[0]

    async def WriteLac(self, request: pb.WriteLacRequest, context: Any) -> pb.WriteLacResponse:
        lid = request.ledger_id
        try:
            self._check_ids(lid, request.lac)
            if not request.master_key:
                raise BadRequestError("master key missing")
            if not self._state.accepting_adds:
                raise BookieReadOnlyError("bookie is not accepting writes")
            if request.hint_only:
                self._storage.note_lac(lid, request.lac, request.master_key)
            else:
                await self._storage.write_lac(lid, request.lac, request.master_key)
            return pb.WriteLacResponse(status=_OK)
        except Exception as exc:
            response = pb.WriteLacResponse()
            self._fail(response, exc, "write_lac", lid, None)
            return response

    async def GetBookieInfo(self, request: pb.BookieInfoRequest, context: Any) -> pb.BookieInfoResponse:
        try:
            free, total = self._storage.disk_usage()
            return pb.BookieInfoResponse(
                status=_OK,
                bookie_id=self._state.bookie_id,
                state=self.bookie_state(),
                free_bytes=max(free, 0),
                total_bytes=max(total, 0),
                message=self._storage.read_only_reason if self._storage.read_only else "",
            )
        except Exception as exc:
            response = pb.BookieInfoResponse(bookie_id=self._state.bookie_id)
            self._fail(response, exc, "bookie_info", None, None)
            return response

    def bookie_state(self) -> Any:
        if self._state.shutting_down:
            return pb.BOOKIE_SHUTTING_DOWN
        if not self._state.started:
            return pb.BOOKIE_STATE_UNKNOWN
        if self._storage.read_only or not self._state.accepting_adds:
            return pb.BOOKIE_READ_ONLY
        return pb.BOOKIE_READ_WRITE

    def _fail(self, response: Any, exc: BaseException, op: str, lid: int | None, eid: int | None) -> None:
        if isinstance(exc, asyncio.CancelledError):
            raise exc
        status, message = error_status(exc)
        response.status = status
        response.message = message
        if not isinstance(exc, ScribaError):
            log.exception(f"{op}_failed", bookie_id=self._state.bookie_id, ledger_id=lid, entry_id=eid)

