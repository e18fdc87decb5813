"""The bookie's binary data path: frames of ``scriba.proto.binary`` over TCP (asyncio Protocol).

Theory of operation. One :class:`BinaryConnection` per client connection. The client
opens with HELLO (the version is negotiated: the highest both speak); any other frame
first is a protocol error. Then ADD frames (runs of adds), READ_ENTRY, READ_RANGE and
READ_LAC (long poll included) and, on a link negotiated at version 2, WRITE_LAC (the
writer's explicit LAC push) are taken as they arrive, each started at once
(``scriba.eager``: a request that need not wait, as an add on the journal's idle path,
is answered before the next frame is read; one that waits goes on in its own task), and
answered out of order as they finish (pipelining; the client matches add answers by
ledger and entry ids, read answers by request id). What a request means is the
``BookieService``'s to judge, exactly as on gRPC: adds go through
``BookieService.answer_adds`` (refuse, decode, bound, store, answer: one journal record
and fsync per message, runs of many ledgers alike), reads through the same service
methods, so statuses, fencing, master keys and limits are one code.

Back-pressure: per connection, requests being served are bounded
(``requests_inflight_max``) and so are the add bytes accepted and not answered (the
service's ``inflight_bytes_per_connection_max``, via ``AddCredit``); at the request
bound, or while the socket's send buffer is full (``pause_writing``), the connection
stops reading the socket (TCP flow control pushes back on the client).

TLS: the listener takes an ``SSLContext`` (the bookie's ``config.tls`` one by default);
with mutual TLS a client whose certificate is on no allow-list gets HELLO_OK with status
UNAUTHORIZED and the connection closes (gRPC's PERMISSION_DENIED on every call).

Protocol errors (bad magic, version or type, a frame over the cap, a body that does
not parse): the connection is answered ERROR with the reason, logged
(``binary_frame_rejected``) and closed; other connections and the bookie go on.

Invariant: every ADD frame accepted is answered once (unless the connection is gone);
adds in flight when the connection drops finish in storage and their answers are
dropped, as on gRPC.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable, Coroutine
from typing import Any, Final, cast

from scriba import tcp
from scriba.bookie.service import BookieService
from scriba.bookie.serving import BOOKIE_CALLERS, PeerIdentities, ServingState
from scriba.eager import start_eagerly
from scriba.errors import Status
from scriba.frame_read import BufferedFrames
from scriba.frame_write import FrameWrite, frame_writer
from scriba.log import get_logger
from scriba.proto import binary as wire
from scriba.proto import scriba_pb2 as pb
from scriba.proto.binary import FrameError, FrameType
from scriba.tls import LoadedTls, identities_from_peercert, refusal

log = get_logger(__name__)

REQUESTS_INFLIGHT_MAX: Final = 1024
_BAD_REQUEST: Final = int(Status.BAD_REQUEST)
_OK: Final = int(Status.OK)
_UNAUTHORIZED: Final = int(Status.UNAUTHORIZED)


class BinaryConnection(BufferedFrames):
    """One client connection (module docstring)."""

    def __init__(self, server: BinaryServer) -> None:
        self._server = server
        self._service = server.service
        self._reader = wire.FrameReader(server.frame_bytes_max)
        self._transport: asyncio.Transport | None = None
        self._write_frame: FrameWrite | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._version = 0  # negotiated; 0 until HELLO
        self._reading_paused = False
        self._writing_paused = False
        self._writable: asyncio.Event | None = None
        self.closed = False
        self.peer = ""
        self.caller = PeerIdentities(frozenset())  # its certificate's identities (reads of protected ledgers)
        self.inflight_bytes = 0  # AddCredit: add bytes accepted and not answered

    # --- asyncio.BufferedProtocol (reads land in a reused buffer: scriba.frame_read) --
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass)
        self._write_frame = frame_writer(self._transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._server.connections.discard(self)
        if self._writable is not None:
            self._writable.set()
        for task in list(self._tasks):
            if task.get_name() != "add":  # adds finish in storage; reads (long polls) stop
                task.cancel()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._writable is not None:
            self._writable.set()
            self._writable = None
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            frames = self._reader.feed(data)
            for header, body in frames:
                self._dispatch(header, body)
                if self.closed:
                    return
        except FrameError as exc:
            self.reject(0, str(exc))

    # --- frames -------------------------------------------------------------------------
    def _dispatch(self, header: wire.Header, body: memoryview) -> None:
        ftype, rid = header.type, header.request_id
        if not self._version:
            if ftype != FrameType.HELLO:
                raise FrameError(f"expected HELLO first, got frame type {ftype}")
            self._hello(body)
            return
        if ftype == FrameType.ADD:
            runs = wire.decode_add(body)
            task = self._start(self._add(rid, runs), "add")
            if task is not None:
                self._service.track_adds(task)
        elif ftype == FrameType.READ_ENTRY:
            self._start(self._read_entry(rid, *wire.decode_read_entry(body)), "read")
        elif ftype == FrameType.READ_RANGE:
            self._start(self._read_range(rid, *wire.decode_read_range(body)), "read")
        elif ftype == FrameType.READ_LAC:
            self._start(self._read_lac(rid, *wire.decode_read_lac(body)), "read")
        elif ftype == FrameType.WRITE_LAC:
            if self._version < wire.WRITE_LAC_VERSION:
                raise FrameError(f"WRITE_LAC on a version {self._version} link")
            self._start(self._write_lac(rid, *wire.decode_write_lac(body)), "lac")
        else:
            raise FrameError(f"frame type {FrameType(ftype).name} is not a request")

    def _hello(self, body: memoryview) -> None:
        lo, hi = wire.decode_hello(body)
        version = wire.negotiate(lo, hi)
        if version is None:
            self.reject(0, f"no common version: client speaks {lo}..{hi}, bookie {wire.VERSION_MIN}..{wire.VERSION}")
            return
        peercert = self._transport.get_extra_info("peercert") if self._transport is not None else None
        refused = refusal(self._server.tls, peercert, BOOKIE_CALLERS)
        if refused is not None:  # mutual TLS: a certificate on no allow-list (as gRPC's PERMISSION_DENIED)
            log.warning("binary_client_refused", bookie_id=self._server.state.bookie_id, peer=self.peer,
                        reason=str(refused))
            self._write(wire.encode_hello_ok(_UNAUTHORIZED, version, f"unauthorized: {refused}"))
            self.close()
            return
        self._version = version
        self.caller = PeerIdentities(identities_from_peercert(peercert))
        self._write(wire.encode_hello_ok(_OK, version))

    def reject(self, request_id: int, reason: str) -> None:
        """A protocol error: answer ERROR with the reason, log it, close."""
        if self.closed:
            return
        log.warning("binary_frame_rejected", bookie_id=self._server.state.bookie_id, peer=self.peer,
                    reason=reason)
        self._write(wire.encode_error(request_id, _BAD_REQUEST, reason))
        self.close()

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    def _write(self, parts: list[wire.Buffer]) -> None:
        if not self.closed and self._write_frame is not None:
            self._write_frame(parts)

    def _start(self, coro: Coroutine[Any, Any, None], kind: str) -> asyncio.Task[None] | None:
        """Serve a request now (``scriba.eager``): one that need not wait (an add the
        journal's idle path syncs at once, a long poll already answerable) is answered
        before this returns; one that waits goes on in a task (None: it is done)."""
        try:
            task = start_eagerly(coro, name=kind)
        except Exception as exc:  # as a task's failure: logged, the connection goes on
            self._failed(exc)
            return None
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._finished)
            self._update_reading()
        return task

    def _failed(self, exc: BaseException) -> None:
        log.error("binary_request_failed", bookie_id=self._server.state.bookie_id, peer=self.peer, error=repr(exc))

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._failed(exc)
        self._update_reading()

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or self.closed:
            return
        pause = self._writing_paused or len(self._tasks) >= self._server.requests_inflight_max
        if pause and not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()
        elif not pause and self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()

    async def _drained(self) -> None:
        """Wait while the socket's send buffer is full (long range reads)."""
        while self._writing_paused and not self.closed:
            if self._writable is None:
                self._writable = asyncio.Event()
            await self._writable.wait()

    # --- requests -----------------------------------------------------------------------
    async def _add(self, rid: int, runs: list[wire.Run]) -> None:
        response, nbytes = await self._service.answer_adds((), runs, self)
        answers = [(a.ledger_id, a.entry_ids, int(a.status), a.message) for a in response.runs]
        answers += [(a.ledger_id, (a.entry_id,), int(a.status), a.message) for a in response.responses]
        self._write(wire.encode_add_ack(rid, answers))
        self.inflight_bytes -= nbytes

    async def _read_entry(self, rid: int, ledger_id: int, entry_id: int, flags: int, key: bytes) -> None:
        request = pb.ReadEntryRequest(ledger_id=ledger_id, entry_id=entry_id, master_key=key,
                                      flags=pb.FENCE if flags & wire.READ_FENCE else 0)
        r = await self._service.ReadEntry(request, self.caller)
        self._write(wire.encode_entry_answer(rid, int(r.status), r.entry_id, r.message, r.entry))

    async def _read_range(self, rid: int, ledger_id: int, first: int, last: int, entries_max: int,
                          bytes_max: int, key: bytes) -> None:
        """Chunks as the service reads them, up to ``entries_max`` entries in all (the
        client asks no more); the last chunk goes without FLAG_MORE."""
        request = pb.ReadRangeRequest(ledger_id=ledger_id, first_entry_id=first, last_entry_id=last,
                                      max_entries=entries_max, max_bytes=bytes_max, master_key=key)
        held: tuple[int, int, Any, str] | None = None  # one chunk behind: is it the last?
        sent = 0
        chunks = self._service.range_chunks(request, self.caller)
        try:
            async for chunk in chunks:
                if held is not None:
                    self._write(wire.encode_range_chunk(rid, *held, more=True))
                    await self._drained()
                held = chunk
                sent += len(chunk[2])
                if entries_max and sent >= entries_max:
                    break
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
        if held is not None:
            self._write(wire.encode_range_chunk(rid, *held, more=False))

    async def _read_lac(self, rid: int, ledger_id: int, flags: int, previous_lac: int, timeout_ms: int,
                        entries_max: int, key: bytes) -> None:
        request = pb.ReadLacRequest(
            ledger_id=ledger_id, flags=pb.FENCE if flags & wire.READ_FENCE else 0, master_key=key,
            long_poll=bool(flags & wire.LAC_LONG_POLL), previous_lac=previous_lac, timeout_ms=timeout_ms,
            piggyback_entries_max=entries_max,
        )
        r = await self._service.ReadLac(request, self.caller)
        self._write(wire.encode_lac_answer(rid, int(r.status), r.lac, r.last_entry_id, r.fenced, r.message,
                                           r.last_entry, r.piggybacked_entries))


    async def _write_lac(self, rid: int, ledger_id: int, lac: int, flags: int, key: bytes) -> None:
        request = pb.WriteLacRequest(ledger_id=ledger_id, lac=lac, master_key=key,
                                     hint_only=bool(flags & wire.LAC_HINT_ONLY))
        r = await self._service.WriteLac(request, None)
        self._write(wire.encode_lac_written(rid, int(r.status), r.message))


class BinaryServer:
    """The binary listener of one bookie (``ssl``: the TLS hook, None for plain TCP)."""

    def __init__(
        self,
        service: BookieService,
        state: ServingState,
        *,
        frame_bytes_max: int = wire.FRAME_BYTES_MAX,
        requests_inflight_max: int = REQUESTS_INFLIGHT_MAX,
        ssl_context: ssl.SSLContext | None = None,
        tls: LoadedTls | None = None,
    ) -> None:
        """``ssl_context``: TLS on the listener; ``tls``: the bookie's TLS configuration,
        whose allow-lists admit each connection's certificate (as on gRPC)."""
        self.service = service
        self.tls = tls
        self.state = state
        self.frame_bytes_max = frame_bytes_max
        self.requests_inflight_max = requests_inflight_max
        self.ssl_context = ssl_context
        self.connections: set[BinaryConnection] = set()
        self._server: tcp.Listener | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port); returns the port."""
        factory: Callable[[], BinaryConnection] = lambda: BinaryConnection(self)  # noqa: E731
        self._server = await tcp.listen(factory, host, port, ssl_context=self.ssl_context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        """Stop listening and close every connection."""
        if self._server is None:
            return
        self._server.close()
        for conn in list(self.connections):
            conn.close()
        await self._server.wait_closed()
        self._server = None
