"""The gRPC ``BookieTransport``: one channel and one batched add stream per bookie.

Theory of operation. Every add to one bookie goes onto that bookie's single
``AddStream``, batched into ``AddBatch`` messages of ``AddRun``s by the I/O-free
``scriba.client.add_batcher`` (``AddBatcher`` over one ``BookieAdds`` per bookie: what
to send, whom an answer is for, which adds expired; its docstring gives the batching
rules). This module is the I/O half. ``add_entry()`` (one call for the whole write
set) and ``add()`` (one bookie) only push the add into the batcher (no coroutine,
task or log line per entry); a bookie whose stream is not running is started then. One sender task per bookie writes a message whenever
the batcher is ready; while a message is being written the next adds accumulate.
One reader task per bookie takes each ``AddResponseBatch`` and answers the runs the
batcher matched, with one callback per run (``add_entry``: ``on_responses(bookie_id,
ledger_id, entry_ids, status)``) or one per entry (``add``). A callback that raises is
reported to the event loop's exception handler, like an exception in any loop callback.

States of a bookie connection: IDLE (no stream) -> OPEN (sender + reader running)
-> BROKEN (stream or channel failed; every pending add was answered UNAVAILABLE;
the next use after a bounded, doubling backoff opens a new stream) -> OPEN ...

Invariants:
- every add is answered exactly once (per bookie, per ``add``/``add_entry`` call):
  with the bookie's status, with ``Status.TIMEOUT`` once ``add_timeout_s`` has
  passed since its run was opened (one periodic sweep over the runs in creation
  order, not a timer per entry), or with ``Status.UNAVAILABLE`` when the stream
  fails or the transport closes;
- bytes queued + in flight per bookie are bounded: ``wait_writable()`` blocks the
  caller while ``inflight_bytes_max`` is reached, and an add beyond
  ``inflight_bytes_hard_max`` is answered ``TOO_MANY_REQUESTS`` (a caller that
  ignores back-pressure gets an error, never an unbounded queue); a run's bytes are
  released when its last add is answered;
- every read carries a deadline; bookie statuses become ``scriba.errors`` via
  ``error_for_status``; gRPC failures become ``UnavailableError`` or ``TimeoutError``.

An add that timed out leaves its stream suspect (a silent blackhole keeps a TCP
connection open forever), so a timeout also drops that bookie's channel; the next
use dials afresh.

Layers: ``GrpcChannels`` (``grpc_channels.py``: the fields, one channel per bookie,
dialing and gRPC errors) <- ``GrpcReads`` (``grpc_reads.py``: the unary and streamed
reads) <- ``GrpcBookieTransport`` (this module: the add streams, and closing).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

import grpc
import grpc.aio

from scriba.client.add_batcher import REFUSED, STOPPED, WAKE, AddRun, RunKey
from scriba.client.grpc_channels import _REFUSED_CODES, _Connection
from scriba.client.grpc_reads import GrpcReads
from scriba.client.transport import AddCallback, AddRunCallback
from scriba.errors import ScribaError, Status, UnauthorizedError, UnavailableError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.log import get_logger
from scriba.proto import scriba_pb2 as pb

log = get_logger(__name__)

CLOSE_TIMEOUT_S: Final = 5.0

_STATUS_BY_CODE: Final = {int(s): s for s in Status}
_OK: Final = Status.OK
_TIMEOUT: Final = Status.TIMEOUT
_UNAVAILABLE: Final = Status.UNAVAILABLE
_TOO_MANY: Final = Status.TOO_MANY_REQUESTS
_UNAUTHORIZED: Final = Status.UNAUTHORIZED
_RECOVERY_FLAG: Final = pb.RECOVERY_ADD


def _status(code: int) -> Status:
    return _STATUS_BY_CODE.get(code, Status.INTERNAL)


class GrpcBookieTransport(GrpcReads):
    """``BookieTransport`` over grpc.aio (see the module docstring)."""

    # --- adds -------------------------------------------------------------------
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
        """Queue one add per bookie of ``bookies`` (the same ``entry`` object for all).

        Answers come batched: ``on_responses(bookie_id, ledger_id, entry_ids, status)``,
        each add of this call named exactly once over all the calls.
        """
        key = (on_responses, ledger_id, _RECOVERY_FLAG if recovery else 0, master_key, False)
        attention = self._push(bookies, key, entry_id, entry)  # the hot path: one call
        if attention is not None:
            self._attend(attention, key, entry_id, entry)

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
        """Queue one add; ``on_response(bookie_id, ledger_id, entry_id, status)`` fires once."""
        key = (on_response, ledger_id, _RECOVERY_FLAG if recovery else 0, master_key, True)
        attention = self._push((bookie_id,), key, entry_id, entry)
        if attention is not None:
            self._attend(attention, key, entry_id, entry)

    def _attend(self, attention: list[tuple[BookieId, int]], key: RunKey, entry_id: int, entry: bytes) -> None:
        """The bookies the batcher could not just queue an add for: wake a sender, start a
        stream (then queue), or answer soon (never inline: the caller's core may not
        expect re-entry). ``key[4]`` (per_entry): the callback is an ``AddCallback``
        answered add by add, else an ``AddRunCallback``."""
        callback, ledger_id, _flags, _master_key, per_entry = key
        for bookie_id, first_code in attention:
            code = first_code
            if code == STOPPED:  # no stream yet (or it failed): start one, then queue
                if self._open(bookie_id) is None:  # closed or unresolvable
                    self._answer_soon(callback, per_entry, bookie_id, ledger_id, entry_id, _UNAVAILABLE)
                    continue
                again = self._push((bookie_id,), key, entry_id, entry)
                if again is None:
                    continue
                ((_, code),) = again
            if code == WAKE:
                conn = self._conns[bookie_id]
                if self._corked:  # a burst of adds is being made: sent once it is complete
                    self._corked_conns.append(conn)
                elif not conn.adds.sent_unanswered and self._sends_now(conn):
                    # an idle bookie: sent at the end of this loop turn, with whatever the
                    # turn's other callbacks add (a burst of futures' callbacks), by no task
                    if not self._flush_conns:
                        asyncio.get_running_loop().call_soon(self._flush)
                    self._flush_conns.append(conn)
                else:
                    conn.wake.set()
            elif code == REFUSED:
                self._answer_soon(callback, per_entry, bookie_id, ledger_id, entry_id, _TOO_MANY)

    def writable(self, bookie_id: BookieId) -> bool:
        """Whether ``bookie_id`` has room for more adds (below ``inflight_bytes_max``)."""
        conn = self._conns.get(bookie_id)
        return conn is None or conn.adds.inflight_bytes < self.inflight_bytes_max

    async def wait_writable(self, bookie_id: BookieId, timeout_s: float | None = None) -> bool:
        """Wait until ``bookie_id`` is below ``inflight_bytes_max``; False if ``timeout_s`` passed."""
        conn = self._conns.get(bookie_id)
        if conn is None or conn.adds.inflight_bytes < self.inflight_bytes_max:
            return True
        if conn.writable_event is None:
            conn.writable_event = asyncio.Event()
        event = conn.writable_event
        try:
            async with asyncio.timeout(timeout_s if timeout_s is not None else self.add_timeout_s):
                await event.wait()
        except TimeoutError:
            return False
        return True

    def inflight_bytes(self, bookie_id: BookieId) -> int:
        conn = self._conns.get(bookie_id)
        return conn.adds.inflight_bytes if conn is not None else 0

    def pending_adds(self, bookie_id: BookieId | None = None) -> int:
        """Adds not yet answered (all bookies, or one)."""
        conns = self._conns.values() if bookie_id is None else [self._conns.get(bookie_id)]
        return sum(conn.adds.pending() for conn in conns if conn is not None)

    def _answer_soon(
        self, cb: Any, per_entry: bool, bookie_id: BookieId, ledger_id: int, entry_id: int, status: Status
    ) -> None:
        # Never call back inside add(): the caller's core may not expect re-entry.
        asyncio.get_running_loop().call_soon(
            self._safe_call, cb, per_entry, bookie_id, ledger_id, [entry_id], status
        )

    @staticmethod
    def _safe_call(
        cb: Any, per_entry: bool, bookie_id: BookieId, ledger_id: int, entry_ids: list[int], status: Status
    ) -> None:
        if not per_entry:
            try:
                cb(bookie_id, ledger_id, entry_ids, status)
            except Exception as exc:
                _callback_failed(exc, bookie_id, ledger_id, entry_ids[0])
            return
        for entry_id in entry_ids:
            try:
                cb(bookie_id, ledger_id, entry_id, status)
            except Exception as exc:
                _callback_failed(exc, bookie_id, ledger_id, entry_id)

    # --- connection lifecycle ----------------------------------------------------
    def _open(self, bookie_id: BookieId) -> _Connection | None:
        """Start the add stream of ``bookie_id`` (None while closed or unresolvable)."""
        if self._closed:
            return None
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        conn = self._connection(bookie_id)
        if conn.sender is not None:
            return conn
        try:
            self._ensure_channel(conn)
        except ScribaError as exc:
            self._note_failure(conn, f"resolve: {exc}")
            return None
        conn.generation += 1
        conn.wake = asyncio.Event()
        # After a failure the stream is redialled once the backoff has passed; adds queue
        # meanwhile (bounded by the in-flight bytes cap and answered by the add timeout).
        conn.sender = loop.create_task(self._stream(conn), name=f"scriba-add-send-{bookie_id}")
        self._batcher.start(bookie_id)  # adds queue now (the stream opens after any backoff)
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep_loop(), name="scriba-add-sweep")
        return conn

    async def _stream(self, conn: _Connection) -> None:
        delay_s = conn.retry_at - time.monotonic()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        try:
            call = await self._open_add_call(conn)
        except Exception as exc:
            if conn.sender is asyncio.current_task():
                self._break(conn, _failure_status(exc), f"open: {self._describe(exc)}", drop_channel=False)
            return
        conn.call = call
        conn.reader = asyncio.get_running_loop().create_task(
            self._read_loop(conn, call), name=f"scriba-add-recv-{conn.bookie_id}"
        )
        await self._send_loop(conn, call)

    async def _open_add_call(self, conn: _Connection) -> Any:
        """The call adds to ``conn``'s bookie are written to (``write(bytes)``,
        ``read()``, ``cancel()``): here an ``AddStream``; a subclass may offer another."""
        if conn.stub is None:  # the channel was dropped while waiting
            self._ensure_channel(conn)
        add_stream = conn.add_stream
        if add_stream is None:
            raise UnavailableError(f"bookie {conn.bookie_id}: no channel")
        return add_stream()

    def _run_encoder(self, call: Any) -> Callable[[AddRun, list[bytes]], None] | None:
        """How runs are encoded for ``call`` (None: as ``AddRun``s of an ``AddBatch``)."""
        return None

    def cork(self) -> None:
        """Hold the adds made until ``uncork`` (a writer calling back many appends at
        once): an idle bookie then gets them in one message, not the first alone."""
        self._corked += 1

    def uncork(self) -> None:
        """The burst is complete: every bookie it queued adds for gets them now, in one
        message each (``_send_now``: a busy bookie too, when its send rule lets a message
        go; its sender task would send the same message one loop turn later)."""
        self._corked -= 1
        if self._corked or not self._corked_conns:
            return
        conns, self._corked_conns = self._corked_conns, []
        self._send_or_wake(conns, busy_too=True)

    def _flush(self) -> None:
        conns, self._flush_conns = self._flush_conns, []
        self._send_or_wake(conns, busy_too=False)

    def _send_or_wake(self, conns: list[_Connection], *, busy_too: bool) -> None:
        for conn in conns:
            if conn.sender is None or ((busy_too or not conn.adds.sent_unanswered) and self._send_now(conn)):
                continue
            conn.wake.set()

    def _sends_now(self, conn: _Connection) -> bool:
        """Whether ``_send_now`` can send to ``conn`` without its task."""
        return False

    def _send_now(self, conn: _Connection) -> bool:
        """Send ``conn``'s queued adds at once, without waking its sender task, when its
        call can take a message synchronously; False: the sender task must do it. Asked
        when waiting gains no batching: for an idle bookie's first add, and at ``uncork``
        (the burst is complete); a busy bookie's other adds keep batching in its task."""
        return False

    def _parts_writer(self, call: Any) -> Callable[[list[bytes]], Awaitable[None]] | None:
        """How a message's parts are written to ``call`` when it frames them itself
        (None: joined here into one ``AddBatch``, then ``call.write``)."""
        return None

    def _break(
        self,
        conn: _Connection,
        status: Status,
        reason: str,
        *,
        drop_channel: bool,
        timed_out: Iterable[AddRun] = (),
    ) -> None:
        """Fail the stream: answer every pending add with ``status`` (``timed_out`` runs:
        TIMEOUT); back off."""
        call, sender, reader = conn.call, conn.sender, conn.reader
        conn.call = conn.sender = conn.reader = None
        self._batcher.stop(conn.bookie_id)  # the next add starts a new stream
        current = asyncio.current_task()
        for task in (sender, reader):
            if task is not None and task is not current and not task.done():
                task.cancel()
        if call is not None:
            call.cancel()
        if drop_channel and conn.channel is not None:
            self._close_channel_later(conn.channel)
            conn.channel = conn.stub = conn.add_stream = None
        if not conn.closing:
            self._note_failure(conn, reason)
        self._fail_all(conn, status, frozenset(timed_out))

    def _fail_all(self, conn: _Connection, status: Status, timed_out: frozenset[AddRun] = frozenset()) -> None:
        unanswered = conn.adds.drain()
        self._signal_writable(conn)
        bookie_id = conn.bookie_id
        safe = self._safe_call
        for run, entry_ids in unanswered:
            safe(
                run.callback, run.per_entry, bookie_id, run.ledger_id, entry_ids,
                _TIMEOUT if run in timed_out else status,
            )

    def _signal_writable(self, conn: _Connection) -> None:
        event = conn.writable_event
        if event is not None and conn.adds.inflight_bytes < self.inflight_bytes_max:
            conn.writable_event = None
            event.set()

    # --- the per-bookie tasks ------------------------------------------------------
    async def _send_loop(self, conn: _Connection, call: Any) -> None:
        adds = conn.adds
        wake = conn.wake
        join = b"".join
        encode = self._run_encoder(call)
        write_parts = self._parts_writer(call)
        try:
            while True:
                if not adds.ready():
                    wake.clear()
                    await wake.wait()
                    continue
                parts: list[bytes] = []
                count = adds.take_message(parts, encode)
                self.batches_sent += 1
                self.entries_sent += count
                if write_parts is not None:
                    await write_parts(parts)
                else:
                    await call.write(join(parts))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if conn.call is call:
                self._break(conn, _failure_status(exc), f"write: {self._describe(exc)}", drop_channel=False)

    async def _read_loop(self, conn: _Connection, call: Any) -> None:
        try:
            while True:
                batch = await call.read()
                if batch is grpc.aio.EOF:
                    raise UnavailableError("bookie closed the add stream")
                for answer in batch.runs:
                    self._on_answer(conn, answer.ledger_id, list(answer.entry_ids), answer.status)
                for r in batch.responses:  # single adds (not sent by this client; still served)
                    self._on_answer(conn, r.ledger_id, [r.entry_id], r.status)
                if conn.call is not call:
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if conn.call is call:
                self._break(conn, _failure_status(exc), f"read: {self._describe(exc)}", drop_channel=False)

    def _on_answer(self, conn: _Connection, ledger_id: int, ids: list[int], code: int) -> None:
        """One bookie answer: ``ids`` of ``ledger_id`` all got ``code``."""
        if not ids:
            return
        adds = conn.adds
        groups, finished = adds.answer(ledger_id, ids)
        if adds.wants_more():
            conn.wake.set()
        if finished:
            conn.fail_count = 0
            if conn.writable_event is not None:
                self._signal_writable(conn)
        status = _OK if code == 0 else _status(code)
        bookie_id = conn.bookie_id
        for run, entry_ids in groups:
            if run.per_entry:
                self._safe_call(run.callback, True, bookie_id, ledger_id, entry_ids, status)
                continue
            try:
                run.callback(bookie_id, ledger_id, entry_ids, status)
            except Exception as exc:
                _callback_failed(exc, bookie_id, ledger_id, entry_ids[0])

    async def _sweep_loop(self) -> None:
        interval = self._config.resolved_sweep_interval_s
        while not self._closed:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for conn in list(self._conns.values()):
                if conn.adds.runs:
                    self._sweep(conn, now)

    def _sweep(self, conn: _Connection, now: float) -> None:
        expired = conn.adds.expired(now)
        if not expired:
            return
        # A silent stream: answer the expired adds TIMEOUT, the rest UNAVAILABLE, redial.
        log.info(
            "bookie_add_timeout", bookie_id=conn.bookie_id, expired_runs=len(expired), address=conn.address
        )
        self._break(conn, _UNAVAILABLE, "add timeout", drop_channel=True, timed_out=expired)

    # --- shutdown -----------------------------------------------------------------------
    async def close(self) -> None:
        """Answer every pending add UNAVAILABLE, stop the tasks, close every channel."""
        if self._closed:
            return
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        tasks: list[asyncio.Task[Any]] = [self._sweeper] if self._sweeper is not None else []
        channels = []
        for conn in self._conns.values():
            conn.closing = True
            tasks.extend(t for t in (conn.sender, conn.reader) if t is not None)
            self._break(conn, _UNAVAILABLE, "transport closed", drop_channel=False)
            if conn.channel is not None:
                channels.append(conn.channel)
                conn.channel = conn.stub = conn.add_stream = None
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*(c.close(grace=None) for c in channels), return_exceptions=True)
            if self._background:
                await asyncio.gather(*list(self._background), return_exceptions=True)


def _failure_status(exc: BaseException) -> Status:
    """What a failed add stream answers its pending adds: UNAUTHORIZED when the bookie
    refused this client's certificate (a request error: no other bookie would take it
    either), UNAVAILABLE otherwise."""
    if isinstance(exc, grpc.aio.AioRpcError) and exc.code() in _REFUSED_CODES:
        return _UNAUTHORIZED
    if isinstance(exc, UnauthorizedError):  # the binary path's refusal, at its handshake
        return _UNAUTHORIZED
    return _UNAVAILABLE


def _callback_failed(exc: Exception, bookie_id: BookieId, ledger_id: int, entry_id: int) -> None:
    """An add callback raised: a bug in its owner. Report it as the event loop reports an
    exception in any callback (logged by default; a test fails on it)."""
    context = {
        "message": f"add callback failed: bookie {bookie_id} ledger {ledger_id} entry {entry_id}",
        "exception": exc,
    }
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        log.error("add_callback_failed", bookie_id=bookie_id, ledger_id=ledger_id, entry_id=entry_id,
                  error=f"{type(exc).__name__}: {exc}")
        return
    loop.call_exception_handler(context)
