"""The gRPC servicer of the ``scriba.v1.Bookie`` service (grpc.aio).

Inputs: protobuf requests; outputs: protobuf responses that always carry a
``Status`` — a request-level problem (unknown ledger, wrong key, malformed entry,
back-pressure, disk error) is never a transport error.

Adds: one bidirectional stream per client connection carrying ``AddBatch``es. A
reader task takes batches as they come and hands each to ``storage.add_batch``
without waiting for the previous one (pipelining); a batch's ``AddResponseBatch``
goes out when storage has made it durable. Per connection, the bytes of batches
accepted but not yet answered are bounded (``inflight_bytes_per_connection_max``:
beyond it a batch gets TOO_MANY_REQUESTS), and so is the number of responses
waiting to be sent (beyond it the reader stops reading: gRPC flow control).
Answers already waiting are coalesced into one message (gRPC costs per message;
the client matches answers by ledger and entry id).

Each batch, runs (the clients' form) or single adds alike, goes through five steps:
refuse the whole message (too many adds, not serving: ``_refuse``) -> decode it into
storage columns, answering malformed adds (``add_decoding``) -> bound the connection's
in-flight bytes -> store (``storage.add_columns``) -> answer (``_admit``).

Reads: unary (``ReadEntry``, ``ReadLac``) or server-streamed (``ReadRange``: chunks of
consecutive entries bounded in entries and bytes; a client that asks ``packed`` gets
each chunk's entries as one run, serialized here with one copy of the entries).

Read authorisation (as BookKeeper's bookies check the master key on reads): a ledger
bound here to the master key of a password (any key but that of the empty password)
is read only by a caller that sends that same master key (the one-way derivation the
adds carry, never the password), or whose mutual-TLS identity is on the admin
allow-list (``scriba.tls.is_admin``: autorecovery and operators' tools). Anyone else
gets UNAUTHORIZED, not retriable, on every read kind: entry, range, LAC and long poll
(checked again when the poll answers, for a ledger that arrived while it waited).
Ledgers without a password, and ledgers not on this bookie, read as before.

Invariant: an add is answered OK only when ``storage.add_batch`` said OK for it,
and only while the bookie accepts adds (registered, not shutting down).
"""

from __future__ import annotations

import asyncio
import hmac
import struct
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final, Protocol

import grpc

from scriba.bookie.add_decoding import (
    DecodedAdds,
    RunLike,
    answer_message,
    decode_adds,
    decode_runs,
    wire_status,
)
from scriba.bookie.metrics import BookieMetrics
from scriba.bookie.storage_api import AddColumns, LacState, LedgerStorage, long_poll_entries
from scriba.entry import HEADER_SIZE, master_key
from scriba.errors import (
    BadRequestError,
    BookieReadOnlyError,
    ScribaError,
    Status,
    UnauthorizedError,
)
from scriba.grpc_auth import guard_handlers, identity_check
from scriba.ids import LEDGER_ID_MAX
from scriba.log import get_logger
from scriba.proto import scriba_pb2 as pb
from scriba.proto import scriba_pb2_grpc as pb_grpc
from scriba.proto.packed import encode_packed_chunk
from scriba.tls import LoadedTls, Role, identities_from_grpc, is_admin

log = get_logger(__name__)

_IDS: Final = struct.Struct(">Qq")  # the ledger id and entry id at the front of a packed entry
_WIRE_STATUS_MAX: Final = int(Status.UNAVAILABLE)
# wire codes as plain ints (the generated stubs type them as the proto enum)
_OK: Final[Any] = int(Status.OK)
_BAD_REQUEST: Final[Any] = int(Status.BAD_REQUEST)
_READ_ONLY: Final[Any] = int(Status.READ_ONLY)
_TOO_MANY: Final[Any] = int(Status.TOO_MANY_REQUESTS)
_INTERNAL: Final[Any] = int(Status.INTERNAL)
_NO_SUCH_ENTRY: Final[Any] = int(Status.NO_SUCH_ENTRY)
RESPONSES_PENDING_MAX: Final = 1024
RESPONSES_MERGE_MAX: Final = 16  # answers of up to this many batches share one message
RESPONSES_MERGE_ENTRIES_MAX: Final = 4096  # ... while the message stays small (< 1 MiB)
OPEN_LEDGER_KEY: Final = master_key(b"")  # the key of a ledger without a password: anyone reads it


def error_status(exc: BaseException) -> tuple[int, str]:
    """The wire status and message for an exception raised while serving a request."""
    if isinstance(exc, ScribaError):
        code = int(exc.status)
        message = str(exc) or type(exc).__name__
        if code > _WIRE_STATUS_MAX:
            message = f"{type(exc).__name__}: {message}"
        return wire_status(code), message
    return _INTERNAL, f"{type(exc).__name__}: {exc}"


class PeerIdentities:
    """A caller's certificate identities, known before the call (the binary path takes
    them once per connection; a gRPC call's come from its context)."""

    __slots__ = ("identities",)

    def __init__(self, identities: frozenset[str]) -> None:
        self.identities = identities


def caller_identities(context: Any) -> frozenset[str]:
    """The certificate identities of a call's peer: a gRPC context, ``PeerIdentities``
    or None (no identities)."""
    if context is None:
        return frozenset()
    if isinstance(context, PeerIdentities):
        return context.identities
    return identities_from_grpc(context.auth_context())


class AddCredit(Protocol):
    """What bounds one connection's adds: the bytes accepted and not yet answered."""

    inflight_bytes: int


class ServingState:
    """What the servicer needs to know about the bookie around it."""

    __slots__ = ("accepting_adds", "bookie_id", "shutting_down", "started")

    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        self.started = False  # registered at least once: the bookie serves
        self.accepting_adds = False  # registered now and not shutting down
        self.shutting_down = False


class _Connection:
    """Per-AddStream bookkeeping."""

    __slots__ = ("closed", "inflight_bytes", "responses", "slots", "tasks")

    def __init__(self) -> None:
        self.inflight_bytes = 0
        self.responses: asyncio.Queue[tuple[pb.AddResponseBatch, int] | None] = asyncio.Queue()
        self.slots = asyncio.Semaphore(RESPONSES_PENDING_MAX)
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False


class BookieService(pb_grpc.BookieServicer):
    def __init__(
        self,
        storage: LedgerStorage,
        state: ServingState,
        metrics: BookieMetrics,
        *,
        entry_size_max: int,
        inflight_bytes_per_connection_max: int,
        batch_entries_max: int,
        long_poll_timeout_ms_max: int,
        read_range_entries_max: int,
        read_range_bytes_max: int,
        packed_reads: bool = True,
        tls: LoadedTls | None = None,
    ) -> None:
        """``tls``: the bookie's TLS, whose admin allow-list may read any ledger."""
        self._storage = storage
        self._tls = tls
        self._state = state
        self._metrics = metrics
        self._entry_size_max = entry_size_max
        self._inflight_max = inflight_bytes_per_connection_max
        self._batch_entries_max = batch_entries_max
        self._long_poll_s_max = long_poll_timeout_ms_max / 1000.0
        self._range_entries_max = read_range_entries_max
        self._range_bytes_max = read_range_bytes_max
        self.packed_reads = packed_reads  # False: answer as a bookie that predates `packed`
        self._connections: set[_Connection] = set()
        self._batches: set[asyncio.Task[None]] = set()  # every add batch still with storage

    # --- adds ------------------------------------------------------------------
    async def AddStream(
        self, request_iterator: AsyncIterator[pb.AddBatch], context: Any
    ) -> AsyncIterator[pb.AddResponseBatch]:
        conn = _Connection()
        self._connections.add(conn)
        reader = asyncio.create_task(self._read_batches(request_iterator, conn))
        queue = conn.responses
        try:
            ending = False
            while not ending:
                item = await queue.get()
                if item is None:
                    break
                response, nbytes = item
                merged = 1
                # Coalesce answers that are already waiting into one message: gRPC's cost
                # is per message, and the client matches answers by (ledger, entry).
                while (
                    merged < RESPONSES_MERGE_MAX
                    and len(response.responses) < RESPONSES_MERGE_ENTRIES_MAX
                    and not queue.empty()
                ):
                    more = queue.get_nowait()
                    if more is None:
                        ending = True
                        break
                    response.MergeFrom(more[0])
                    nbytes += more[1]
                    merged += 1
                yield response
                conn.inflight_bytes -= nbytes
                for _ in range(merged):
                    conn.slots.release()
        finally:
            conn.closed = True
            self._connections.discard(conn)
            if not reader.done():
                reader.cancel()
            # In-flight storage work finishes on its own; its answers are dropped.

    async def _read_batches(self, request_iterator: AsyncIterator[pb.AddBatch], conn: _Connection) -> None:
        try:
            async for batch in request_iterator:
                await conn.slots.acquire()
                if conn.closed:
                    return
                task = asyncio.create_task(self._add_batch(batch, conn))
                conn.tasks.add(task)
                task.add_done_callback(conn.tasks.discard)
                self._batches.add(task)
                task.add_done_callback(self._batches.discard)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client went away mid-stream
            log.debug("add_stream_read_ended", bookie_id=self._state.bookie_id, error=repr(exc))
        if conn.tasks:
            await asyncio.gather(*list(conn.tasks), return_exceptions=True)
        conn.responses.put_nowait(None)

    async def _add_batch(self, batch: pb.AddBatch, conn: _Connection) -> None:
        try:
            item = await self.answer_adds(batch.adds, batch.runs, conn)
        except asyncio.CancelledError as exc:  # never leave a batch unanswered (or its slot taken)
            response = pb.AddResponseBatch()
            answer_message(response, batch.adds, batch.runs, *error_status(exc))
            conn.responses.put_nowait((response, 0))
            raise
        conn.responses.put_nowait(item)

    async def answer_adds(
        self, adds: Sequence[pb.AddRequest], runs: Sequence[RunLike], conn: AddCredit
    ) -> tuple[pb.AddResponseBatch, int]:
        """One message of adds through the five steps, for either wire (the binary path
        hands its decoded runs here): the answer and the bytes it holds in ``conn``'s
        in-flight count (the caller subtracts them once the answer is sent). Raises only
        ``CancelledError``: any other failure answers every add of the message."""
        started = time.perf_counter()
        try:
            item = await self._process_batch(adds, runs, conn)
        except Exception as exc:
            status, message = error_status(exc)
            if not isinstance(exc, ScribaError):
                log.exception("add_batch_failed", bookie_id=self._state.bookie_id)
            response = pb.AddResponseBatch()
            answer_message(response, adds, runs, status, message)
            item = (response, 0)
        self._metrics.add_batch_seconds.observe(time.perf_counter() - started)
        return item

    def track_adds(self, task: asyncio.Task[Any]) -> None:
        """Count ``task`` (an add message of another wire) among the adds ``drain`` awaits."""
        self._batches.add(task)
        task.add_done_callback(self._batches.discard)

    async def _process_batch(
        self, adds: Sequence[pb.AddRequest], runs: Sequence[RunLike], conn: AddCredit
    ) -> tuple[pb.AddResponseBatch, int]:
        """Runs and single adds of one message (clients send one kind; both are served)."""
        if not adds:
            return await self._process_runs(runs, conn)
        if not runs:
            return await self._process_adds(adds, conn)
        (r1, n1), (r2, n2) = await asyncio.gather(
            self._process_runs(runs, conn), self._process_adds(adds, conn)
        )
        r1.MergeFrom(r2)
        return r1, n1 + n2

    async def _process_runs(
        self, runs: Sequence[RunLike], conn: AddCredit
    ) -> tuple[pb.AddResponseBatch, int]:
        """The clients' hot path: runs of one ledger's adds, packed in one bytes field each.

        Structure is checked here (counts and lengths add up, ids in range, a key);
        the entries themselves (size bounds, header ids, key, fencing) are admitted by
        storage like any add. All good runs of the message go to storage in one call
        (one journal record); the answer is one ``AddRunResponse`` per run and status.
        """
        count = 0
        for run in runs:
            count += len(run.entry_ids)
        refused = self._refuse((), runs, count)
        if refused is not None:
            return refused, 0
        return await self._admit(decode_runs(runs), conn)

    async def _process_adds(
        self, adds: Sequence[pb.AddRequest], conn: AddCredit
    ) -> tuple[pb.AddResponseBatch, int]:
        """Single adds: each checked alone, the good ones to storage in one call, every
        add answered in order."""
        refused = self._refuse(adds, (), len(adds))
        if refused is not None:
            return refused, 0
        return await self._admit(decode_adds(adds, self._entry_size_max), conn)

    def _refuse(
        self, adds: Sequence[pb.AddRequest], runs: Sequence[RunLike], count: int
    ) -> pb.AddResponseBatch | None:
        """Step 1: the answer refusing a whole message of ``count`` adds (too big, not
        serving), or None when it is not refused."""
        if count > self._batch_entries_max:
            status, message = _BAD_REQUEST, f"batch of {count} adds exceeds {self._batch_entries_max}"
        elif not self._state.accepting_adds:
            status = _READ_ONLY
            message = "bookie is shutting down" if self._state.shutting_down else "bookie not registered"
        else:
            return None
        response = pb.AddResponseBatch()
        answer_message(response, adds, runs, status, message)
        self._metrics.count_adds(status, count)
        return response

    async def _admit(self, decoded: DecodedAdds, conn: AddCredit) -> tuple[pb.AddResponseBatch, int]:
        """Steps 3 to 5 for a decoded message: bound, store, answer.

        Returns the response and the bytes it holds in the connection's in-flight count
        (released once the response is sent).
        """
        metrics = self._metrics
        if decoded.rejected:
            metrics.count_adds(_BAD_REQUEST, decoded.rejected)
        columns = decoded.columns
        if columns is None:
            return decoded.response, 0
        count = decoded.count
        nbytes = decoded.nbytes
        message = self._over_inflight(conn, nbytes)
        if message:
            decoded.answer_all(_TOO_MANY, message)
            metrics.count_adds(_TOO_MANY, count)
            return decoded.response, 0
        statuses, failure = await self._store(columns, conn, nbytes)
        if failure is not None:
            decoded.answer_all(*failure)
            metrics.count_adds(failure[0], count)
            return decoded.response, nbytes
        ok = statuses.count(_OK)
        if ok == count:
            metrics.count_ok(ok, nbytes)
            decoded.answer_all(_OK, "")
            return decoded.response, nbytes
        metrics.count_ok(ok, 0)
        decoded.answer_each(statuses)
        for st in statuses:
            if st != _OK:
                metrics.count_adds(wire_status(int(st)), 1)
        log.debug("adds_rejected", bookie_id=self._state.bookie_id, count=count - ok)
        return decoded.response, nbytes

    async def _store(
        self, columns: AddColumns, conn: AddCredit, nbytes: int
    ) -> tuple[Sequence[int], tuple[int, str] | None]:
        """Hand ``columns`` to storage, holding ``nbytes`` in the connection's in-flight
        count until the answer is sent: (statuses, None), or ((), (status, message)) when
        storage failed as a whole."""
        conn.inflight_bytes += nbytes
        try:
            return await self._storage.add_columns(columns), None
        except asyncio.CancelledError:
            conn.inflight_bytes -= nbytes
            raise
        except Exception as exc:
            if not isinstance(exc, ScribaError):
                log.exception("storage_add_batch_failed", bookie_id=self._state.bookie_id)
            return (), error_status(exc)

    def _over_inflight(self, conn: AddCredit, nbytes: int) -> str:
        """Why ``nbytes`` more would break the connection's in-flight bound ('' if they fit;
        one batch alone always fits)."""
        if conn.inflight_bytes and conn.inflight_bytes + nbytes > self._inflight_max:
            return f"in-flight bytes per connection exceed {self._inflight_max}"
        return ""

    # --- reads -----------------------------------------------------------------
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

    # --- lifecycle -------------------------------------------------------------
    async def drain(self, timeout_s: float) -> None:
        """Wait (bounded) for every accepted add to be answered by storage."""
        tasks = list(self._batches)
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)


BOOKIE_CALLERS: Final = (Role.CLIENT, Role.BOOKIE, Role.ADMIN)  # who may call a bookie's gRPC service


def grpc_server_options(message_bytes_max: int) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", message_bytes_max),
        ("grpc.max_send_message_length", message_bytes_max),
        ("grpc.so_reuseport", 0),
        ("grpc.max_concurrent_streams", 1024),  # per client connection (long polls included)
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


class _Handlers:
    """Takes the method handlers the generated ``add_BookieServicer_to_server`` registers."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.service, self.handlers = service, dict(handlers)


def _serialize_range_chunk(chunk: pb.ReadRangeResponse | bytes) -> bytes:
    """A ReadRange chunk on the wire: packed chunks come serialized already."""
    return chunk if type(chunk) is bytes else chunk.SerializeToString()  # type: ignore[union-attr]


def new_grpc_server(service: BookieService, message_bytes_max: int, *, tls: LoadedTls | None = None) -> grpc.aio.Server:
    """The server with the generated handlers, ReadRange's serializer letting bytes through.

    With mutual TLS every call first checks the peer's certificate against the client,
    bookie and admin allow-lists (``scriba.grpc_auth``); the port itself is added by the
    caller (``scriba.grpc_auth.bind``).
    """
    server = grpc.aio.server(options=grpc_server_options(message_bytes_max))
    taken = _Handlers()
    pb_grpc.add_BookieServicer_to_server(service, taken)
    handlers = taken.handlers
    read_range = handlers["ReadRange"]
    handlers["ReadRange"] = grpc.unary_stream_rpc_method_handler(
        read_range.unary_stream,
        request_deserializer=read_range.request_deserializer,
        response_serializer=_serialize_range_chunk,
    )
    if tls is not None and tls.config.require_client_cert:
        handlers = guard_handlers(handlers, identity_check(tls, BOOKIE_CALLERS))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(taken.service, handlers),))
    server.add_registered_method_handlers(taken.service, handlers)
    return server

