"""``BinaryLink``: one TCP connection to one bookie, speaking ``scriba.proto.binary``.

Theory of operation. A link is an ``asyncio.BufferedProtocol`` (reads land in a reused
buffer: ``scriba.frame_read``) with Nagle off. ``handshake()`` sends HELLO and waits for
HELLO_OK: the version both speak becomes ``version`` (a bookie that speaks none of this
client's raises :class:`VersionRefused`, and the transport uses gRPC for it; an
UNAUTHORIZED answer is mutual TLS refusing our certificate).

Answers are dispatched in ``data_received`` as their frames complete, with no reader
task in between: ADD_ACK frames go to ``on_answers`` (set by the transport; it runs the
write core's callbacks corked), ENTRY / LAC / LAC_WRITTEN answers resolve the future of
their request id (``request``) or are handed to its callback (``request_soon``: no
coroutine and no loop turn between the frame and its handling; a tailing reader's long
polls), RANGE_CHUNK frames go to their request's queue
(``chunks``, until one without ``FLAG_MORE``). The link is also the add stream's call:
``send_parts`` frames an ADD around a message's parts (the socket write joins them: the
entries are copied once), ``write_parts`` then waits while the socket is full
(``pause_writing`` / ``resume_writing``), ``cancel()`` closes.

States: OPEN after the handshake -> CLOSED (socket lost, ERROR frame, protocol error, or
``cancel()``): ``wait_closed()`` returns why; every request and range waiting on it fails
``UnavailableError`` (a callback is called with it); the socket is aborted, not closed (every add on it is answered by
the transport, and a TLS close would wait for the peer's close_notify). A closed link is
never reused: the transport (``binary_transport.py``) dials a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncGenerator, Callable
from typing import cast

from scriba.errors import Status, UnauthorizedError, UnavailableError
from scriba.frame_read import BufferedFrames
from scriba.frame_write import FrameWrite, frame_writer
from scriba.ids import BookieId
from scriba.log import get_logger
from scriba.proto import binary as wire
from scriba.proto.binary import FrameError, FrameType

log = get_logger(__name__)

__all__ = ["BinaryLink", "VersionRefused"]


class VersionRefused(Exception):
    """The bookie speaks no version this client speaks (use gRPC for it)."""


class BinaryLink(BufferedFrames):
    """One TCP connection to one bookie (module docstring). Also the add stream's call:
    ``write(body)`` sends an ADD frame, ``cancel()`` closes."""

    def __init__(self, bookie_id: BookieId, frame_bytes_max: int) -> None:
        self.bookie_id = bookie_id
        self._reader = wire.FrameReader(frame_bytes_max)
        self._transport: asyncio.Transport | None = None
        self._write_frame: FrameWrite | None = None
        loop = asyncio.get_running_loop()
        self._hello: asyncio.Future[tuple[int, int, str]] = loop.create_future()
        self._closed: asyncio.Future[str] = loop.create_future()
        self._lost: asyncio.Future[None] = loop.create_future()  # the socket is closed
        self._pending: dict[int, asyncio.Future[memoryview]] = {}
        self._callbacks: dict[int, Callable[[memoryview | BaseException], None]] = {}  # request_soon's
        self._chunks: dict[int, asyncio.Queue[tuple[int, memoryview] | BaseException]] = {}
        self._next_id = 1
        self._writable: asyncio.Event | None = None
        self._paused = False
        self.version = 0
        self.on_answers: Callable[[list[wire.AddAnswer]], None] | None = None

    # --- asyncio.BufferedProtocol (reads land in a reused buffer: scriba.frame_read) --
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass)
        self._write_frame = frame_writer(self._transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(f"connection lost ({exc!r})" if exc is not None else "connection closed")
        if not self._lost.done():
            self._lost.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._writable is not None:
            self._writable.set()
            self._writable = None

    def data_received(self, data: bytes) -> None:
        try:
            for header, body in self._reader.feed(data):
                self._dispatch(header, body)
        except FrameError as exc:
            log.warning("binary_frame_rejected", bookie_id=self.bookie_id, reason=str(exc))
            self._fail(f"protocol error: {exc}")

    def _dispatch(self, header: wire.Header, body: memoryview) -> None:
        ftype, rid = header.type, header.request_id
        if ftype == FrameType.ADD_ACK:
            answers = wire.decode_add_ack(body)
            if self.on_answers is not None:
                self.on_answers(answers)
        elif ftype in (FrameType.ENTRY, FrameType.LAC, FrameType.LAC_WRITTEN):
            future = self._pending.pop(rid, None)
            if future is not None:
                if not future.done():
                    future.set_result(body)
            else:
                callback = self._callbacks.pop(rid, None)
                if callback is not None:
                    callback(body)
        elif ftype == FrameType.RANGE_CHUNK:
            queue = self._chunks.get(rid)
            if queue is not None:
                queue.put_nowait((header.flags, body))
        elif ftype == FrameType.HELLO_OK:
            if not self._hello.done():
                self._hello.set_result(wire.decode_hello_ok(body))
        elif ftype == FrameType.ERROR:
            status, message = wire.decode_error(body)
            log.warning("binary_error_frame", bookie_id=self.bookie_id, status=status, reason=message)
            self._fail(f"bookie error: {Status(status).name if status <= 11 else status} {message}")
        else:
            raise FrameError(f"frame type {FrameType(ftype).name} is not an answer")

    # --- lifecycle ----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed.done()

    async def handshake(self) -> None:
        """HELLO / HELLO_OK: the version both speak (``VersionRefused`` when none)."""
        self._send(wire.encode_hello())
        await asyncio.wait((self._hello, self._closed), return_when=asyncio.FIRST_COMPLETED)
        if self._hello.done():
            status, version, message = self._hello.result()
            if status == 0 and wire.VERSION_MIN <= version <= wire.VERSION:
                self.version = version
                return
            self.cancel()
            if status == Status.UNAUTHORIZED:  # mutual TLS: our certificate is on no allow-list
                raise UnauthorizedError(f"bookie {self.bookie_id}: {message}")
            raise VersionRefused(message or f"version {version}")
        reason = self._closed.result()
        if "no common version" in reason:
            raise VersionRefused(reason)
        raise UnavailableError(f"bookie {self.bookie_id}: handshake: {reason}")

    async def wait_lost(self, timeout_s: float) -> None:
        """Wait (bounded) until the socket is closed after ``cancel()``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._lost), timeout_s)

    async def wait_closed(self) -> str:
        """Wait until the link is closed; returns why."""
        return await asyncio.shield(self._closed)

    def cancel(self) -> None:
        """Close the link (pending reads fail UNAVAILABLE)."""
        self._fail("closed by the client")

    def _fail(self, reason: str) -> None:
        if self._closed.done():
            return
        self._closed.set_result(reason)
        if self._transport is not None:
            # abort, not close: nothing pending needs flushing (every add on the link is
            # answered by the transport), and a TLS close would wait for the peer's close_notify
            self._transport.abort()
        elif not self._lost.done():
            self._lost.set_result(None)
        error = UnavailableError(f"bookie {self.bookie_id}: {reason}")
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        callbacks, self._callbacks = self._callbacks, {}
        for callback in callbacks.values():
            callback(error)
        for queue in self._chunks.values():
            queue.put_nowait(error)
        if self._writable is not None:
            self._writable.set()

    # --- sending --------------------------------------------------------------------------
    def _send(self, parts: list[wire.Buffer]) -> None:
        if self._closed.done() or self._write_frame is None:
            raise UnavailableError(f"bookie {self.bookie_id}: {self._closed.result() if self.closed else 'not connected'}")
        self._write_frame(parts)

    async def write(self, body: bytes) -> None:
        """Send one ADD frame (the add stream's write); waits while the socket is full."""
        await self.write_parts([body])

    @property
    def sendable(self) -> bool:
        """Whether a frame can be written now without waiting (open, socket not full)."""
        return not self._paused and not self._closed.done() and self._transport is not None

    def send_parts(self, parts: list[bytes]) -> None:
        """Write one ADD frame whose body is ``parts`` (the runs' heads and entries, as
        ``take_message`` left them): the header goes in front and the socket write joins
        them, so a message's entries are copied once on their way out, not twice."""
        rid = self._next_id
        self._next_id = rid + 1
        self._send(wire.encode_frame(FrameType.ADD, rid, parts))

    async def write_parts(self, parts: list[bytes]) -> None:
        """Send one ADD frame whose body is ``parts`` (``send_parts``); waits while the
        socket is full."""
        self.send_parts(parts)
        while self._paused and not self.closed:
            if self._writable is None:
                self._writable = asyncio.Event()
            await self._writable.wait()

    def _request_id(self) -> int:
        rid = self._next_id
        self._next_id = rid + 1
        return rid

    async def request(self, make: Callable[[int], list[wire.Buffer]]) -> memoryview:
        """Send the frame ``make(request_id)``; the body of its answer."""
        rid = self._request_id()
        future: asyncio.Future[memoryview] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            self._send(make(rid))
            return await future
        finally:
            self._pending.pop(rid, None)

    def request_soon(self, make: Callable[[int], list[wire.Buffer]],
                     on_answer: Callable[[memoryview | BaseException], None]) -> int:
        """Send the frame ``make(request_id)``; ``on_answer`` is called once, from the
        frame's dispatch, with the body of its answer (or with ``UnavailableError`` when
        the link closes first), unless ``forget(request_id)`` withdrew it. Returns the
        request id; raises ``UnavailableError`` at once on a closed link."""
        rid = self._request_id()
        self._send(make(rid))
        self._callbacks[rid] = on_answer
        return rid

    def forget(self, request_id: int) -> None:
        """Withdraw ``request_soon``'s callback (its answer, if one comes, is dropped)."""
        self._callbacks.pop(request_id, None)

    async def chunks(self, make: Callable[[int], list[wire.Buffer]]) -> AsyncGenerator[wire.RangeChunk, None]:
        """Send ``make(request_id)``; yield the RANGE_CHUNK answers until the last."""
        rid = self._request_id()
        queue: asyncio.Queue[tuple[int, memoryview] | BaseException] = asyncio.Queue()
        self._chunks[rid] = queue
        try:
            self._send(make(rid))
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                flags, body = item
                yield wire.decode_range_chunk(body)
                if not flags & wire.FLAG_MORE:
                    return
        finally:
            self._chunks.pop(rid, None)
