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

Reads, ``WriteLac`` and ``GetBookieInfo``, with their authorisation, are the layer
``service_reads.BookieReads``; what the servicer shares with the bookie and the binary
path (serving state, callers' identities, exceptions as wire statuses) is ``serving``.

Invariant: an add is answered OK only when ``storage.add_batch`` said OK for it,
and only while the bookie accepts adds (registered, not shutting down).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final

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
from scriba.bookie.service_reads import BookieReads
from scriba.bookie.serving import BOOKIE_CALLERS, AddCredit, ServingState, error_status
from scriba.bookie.storage_api import AddColumns, LedgerStorage
from scriba.errors import ScribaError, Status
from scriba.grpc_auth import guard_handlers, identity_check
from scriba.log import get_logger
from scriba.proto import scriba_pb2 as pb
from scriba.proto import scriba_pb2_grpc as pb_grpc
from scriba.tls import LoadedTls

log = get_logger(__name__)

_OK: Final[Any] = int(Status.OK)
_BAD_REQUEST: Final[Any] = int(Status.BAD_REQUEST)
_READ_ONLY: Final[Any] = int(Status.READ_ONLY)
_TOO_MANY: Final[Any] = int(Status.TOO_MANY_REQUESTS)
RESPONSES_PENDING_MAX: Final = 1024
RESPONSES_MERGE_MAX: Final = 16  # answers of up to this many batches share one message
RESPONSES_MERGE_ENTRIES_MAX: Final = 4096  # ... while the message stays small (< 1 MiB)


class _Connection:
    """Per-AddStream bookkeeping."""

    __slots__ = ("closed", "inflight_bytes", "responses", "slots", "tasks")

    def __init__(self) -> None:
        self.inflight_bytes = 0
        self.responses: asyncio.Queue[tuple[pb.AddResponseBatch, int] | None] = asyncio.Queue()
        self.slots = asyncio.Semaphore(RESPONSES_PENDING_MAX)
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False


class BookieService(BookieReads):
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

    # --- lifecycle -------------------------------------------------------------
    async def drain(self, timeout_s: float) -> None:
        """Wait (bounded) for every accepted add to be answered by storage."""
        tasks = list(self._batches)
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)


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

