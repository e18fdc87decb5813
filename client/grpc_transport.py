"""The gRPC ``BookieTransport``: one channel and one batched add stream per bookie.

Theory of operation. Python gRPC moves a few thousand *messages* per second, so
every add to one bookie goes onto that bookie's single ``AddStream`` in
:class:`AddBatch` messages, and inside a message the adds of one ledger travel as
an :class:`AddRun` (entry ids and sizes packed, the packed entries concatenated in
one bytes field): no protobuf object per entry on either side. ``add_entry()``
(one call for the whole write set) and ``add()`` (one bookie) only append the
entry id and the entry's bytes (the same object for every bookie of the write
set) to the bookie's open run (no coroutine, task or log line per entry). A run
collects the adds of one ledger that share master key, flags and callback, up to
``batch_entries_max`` entries / ``batch_bytes_max`` bytes (default 512: a bookie spends
~20% less CPU per add at 512 adds a message than at 256, the client about the same;
measured with ``scriba bench``, 3 bookies, 1 KiB). One sender task per
bookie drains the queued runs into one message of at most ``batch_entries_max``
entries; while a message is being written the next adds accumulate. While
``batch_entries_max * batches_inflight_max`` entries are unanswered, a partial
message is held back until it fills or answers arrive (Nagle-like; one add in
flight is never delayed). One reader task per bookie takes each
:class:`AddResponseBatch`; an :class:`AddRunResponse` is matched to the runs that
sent its entry ids with a few C-level dict operations, and answered with one
callback per run (``add_entry``: ``on_responses(bookie_id, ledger_id, entry_ids,
status)``) or one per entry (``add``).

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
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from itertools import accumulate, repeat
from typing import Any, Final

import grpc
import grpc.aio

from scriba.client.transport import AddCallback, AddRunCallback, BookieInfo, EntryRun, LacResult
from scriba.errors import (
    InternalError,
    NoSuchEntryError,
    ScribaError,
    Status,
    UnavailableError,
    error_for_status,
)
from scriba.errors import TimeoutError as DeadlineError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.invariant import invariant
from scriba.log import get_logger
from scriba.proto import scriba_pb2 as pb
from scriba.proto import scriba_pb2_grpc as pb_grpc
from scriba.proto.packed import run_ends

log = get_logger(__name__)

MESSAGE_BYTES_MAX: Final = 64 * 1024 * 1024
RECONNECT_BACKOFF_MIN_S: Final = 0.05
RECONNECT_BACKOFF_MAX_S: Final = 2.0
LONG_POLL_MARGIN_S: Final = 2.0
CLOSE_TIMEOUT_S: Final = 5.0

_STATUS_BY_CODE: Final = {int(s): s for s in Status}
_OK: Final = Status.OK
_TIMEOUT: Final = Status.TIMEOUT
_UNAVAILABLE: Final = Status.UNAVAILABLE
_TOO_MANY: Final = Status.TOO_MANY_REQUESTS
_RECOVERY_FLAG: Final = pb.RECOVERY_ADD
_FENCE_FLAG: Final = pb.FENCE

_CHANNEL_OPTIONS: Final = (
    ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
    ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
    # (not grpc.min_reconnect_backoff_ms: despite its name it is the connect timeout)
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
)


def _status(code: int) -> Status:
    return _STATUS_BY_CODE.get(code, Status.INTERNAL)


_ADD_STREAM_METHOD: Final = "/scriba.v1.Bookie/AddStream"
_AddRun: Final = pb.AddRun
_RUNS_TAG: Final = b"\x12"  # AddBatch.runs: field 2, length-delimited
_ENTRIES_TAG: Final = b"\x32"  # AddRun.entries: field 6, length-delimited


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _Run:
    """Adds of one ledger to one bookie that share master key, flags and callback."""

    __slots__ = (
        "callback",
        "deadline",
        "entries",
        "entry_ids",
        "flags",
        "key",
        "ledger_id",
        "master_key",
        "per_entry",
        "remaining",
        "sent",
        "size",
    )

    def __init__(
        self, ledger_id: int, master_key: bytes, flags: int, callback: Any, per_entry: bool, deadline: float
    ) -> None:
        self.ledger_id = ledger_id
        self.master_key = master_key
        self.flags = flags
        self.callback = callback  # AddRunCallback, or AddCallback when per_entry
        self.per_entry = per_entry
        self.deadline = deadline
        self.key = (callback, ledger_id, flags, master_key, per_entry)  # adds that may join
        self.entry_ids: list[int] = []
        self.entries: list[bytes] = []
        self.size = 0  # bytes of entries
        self.remaining = 0  # adds sent and not yet answered
        self.sent = False


def _encode_run(run: _Run, parts: list[bytes]) -> None:
    """Append ``run`` as one ``AddBatch.runs`` element on the wire to ``parts``.

    The ids, sizes and key go through protobuf (C); the entries field is framed by
    hand so that the entries are copied once, by the final ``b"".join``.
    """
    entries = run.entries
    head = _AddRun(
        ledger_id=run.ledger_id,
        master_key=run.master_key,
        flags=run.flags,
        entry_ids=run.entry_ids,
        sizes=list(map(len, entries)),
    ).SerializeToString()
    size = run.size
    if not size:  # proto3 leaves an empty bytes field out
        parts += (_RUNS_TAG, _varint(len(head)), head)
        return
    size_varint = _varint(size)
    parts += (_RUNS_TAG, _varint(len(head) + 1 + len(size_varint) + size), head, _ENTRIES_TAG, size_varint)
    parts += entries


def _group(ids: Sequence[int], runs: Sequence[_Run | None]) -> dict[_Run, list[int]]:
    """Answered ids by the run that sent them (ids no run waits for are dropped)."""
    groups: dict[_Run, list[int]] = {}
    for entry_id, run in zip(ids, runs, strict=True):
        if run is not None:
            groups.setdefault(run, []).append(entry_id)
    return groups


class _Connection:
    """One bookie: its channel, add stream, queued runs and pending adds (module docstring)."""

    __slots__ = (
        "add_stream",
        "address",
        "bookie_id",
        "call",
        "channel",
        "closing",
        "dups",
        "fail_count",
        "generation",
        "inflight_bytes",
        "ledgers",
        "open_run",
        "queue",
        "queued_entries",
        "reader",
        "retry_at",
        "runs",
        "sender",
        "sent_unanswered",
        "stub",
        "wake",
        "writable_event",
    )

    def __init__(self, bookie_id: BookieId) -> None:
        self.bookie_id = bookie_id
        self.address = ""
        self.channel: grpc.aio.Channel | None = None
        self.stub: pb_grpc.BookieStub | None = None
        self.add_stream: Any = None  # AddStream taking pre-serialized AddBatch bytes
        self.call: Any = None
        self.sender: asyncio.Task[None] | None = None
        self.reader: asyncio.Task[None] | None = None
        self.queue: list[_Run] = []  # runs not sent yet, in creation order
        self.open_run: _Run | None = None  # the last queued run, still taking adds
        self.queued_entries = 0  # adds in ``queue``
        self.runs: dict[_Run, None] = {}  # every unanswered run (queued or sent), creation order
        # sent and unanswered: ledger id -> entry id -> the run that sent it (the oldest);
        # an add sent again while it is pending waits in ``dups`` (FIFO per key)
        self.ledgers: dict[int, dict[int, _Run]] = {}
        self.dups: dict[tuple[int, int], list[_Run]] = {}
        self.inflight_bytes = 0
        self.sent_unanswered = 0  # entries written to the current stream, not yet answered
        self.wake = asyncio.Event()
        self.writable_event: asyncio.Event | None = None
        self.retry_at = 0.0
        self.fail_count = 0
        self.generation = 0
        self.closing = False


class GrpcBookieTransport:
    """``BookieTransport`` over grpc.aio (see the module docstring)."""

    def __init__(
        self,
        resolve: Callable[[BookieId], str],
        *,
        add_timeout_s: float = 10.0,
        read_timeout_s: float = 5.0,
        packed_reads: bool = True,
        batch_entries_max: int = 512,
        batch_bytes_max: int = 1024 * 1024,
        inflight_bytes_max: int = 64 * 1024 * 1024,
        inflight_bytes_hard_max: int | None = None,
        batches_inflight_max: int = 8,
        sweep_interval_s: float | None = None,
    ) -> None:
        invariant(add_timeout_s > 0 and read_timeout_s > 0, "timeouts must be positive")
        invariant(batch_entries_max >= 1 and batch_bytes_max >= 1, "batch limits must be >= 1")
        invariant(inflight_bytes_max >= 1, "inflight_bytes_max must be >= 1")
        invariant(batches_inflight_max >= 1, "batches_inflight_max must be >= 1")
        self._resolve = resolve
        self.add_timeout_s = add_timeout_s
        self.read_timeout_s = read_timeout_s
        self.packed_reads = packed_reads  # ask range reads as runs (False: as an old client)
        self.batch_entries_max = batch_entries_max
        self.batch_bytes_max = batch_bytes_max
        self.send_window_entries = batch_entries_max * batches_inflight_max
        self.inflight_bytes_max = inflight_bytes_max
        self.inflight_bytes_hard_max = (
            inflight_bytes_hard_max if inflight_bytes_hard_max is not None else 4 * inflight_bytes_max
        )
        self._sweep_interval_s = (
            sweep_interval_s
            if sweep_interval_s is not None
            else max(0.005, min(0.1, add_timeout_s / 10))
        )
        self._conns: dict[BookieId, _Connection] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # counters (cheap ints; read by tests and the bench)
        self.batches_sent = 0
        self.entries_sent = 0

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
        self._enqueue(bookies, ledger_id, entry_id, master_key, entry, on_responses, recovery, False)

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
        self._enqueue((bookie_id,), ledger_id, entry_id, master_key, entry, on_response, recovery, True)

    def _enqueue(
        self,
        bookies: Iterable[BookieId],
        ledger_id: int,
        entry_id: int,
        master_key: bytes,
        entry: bytes,
        callback: Any,
        recovery: bool,
        per_entry: bool,
    ) -> None:
        """Append the add to each bookie's open run (a new run when the open one's adds
        differ in ledger, key, flags or callback); ``per_entry``: ``callback`` is an
        ``AddCallback`` answered add by add, else an ``AddRunCallback``."""
        flags = _RECOVERY_FLAG if recovery else 0
        key = (callback, ledger_id, flags, master_key, per_entry)  # what a run's adds share
        size = len(entry)
        conns = self._conns
        hard_max = self.inflight_bytes_hard_max
        entries_max = self.batch_entries_max
        for bookie_id in bookies:
            conn = conns.get(bookie_id)
            if conn is None or conn.sender is None:
                conn = self._open(bookie_id)
                if conn is None:  # closed or unresolvable: answer soon, never inline
                    self._answer_soon(callback, per_entry, bookie_id, ledger_id, entry_id, _UNAVAILABLE)
                    continue
            inflight = conn.inflight_bytes
            if inflight + size > hard_max and inflight:
                self._answer_soon(callback, per_entry, bookie_id, ledger_id, entry_id, _TOO_MANY)
                continue
            conn.inflight_bytes = inflight + size
            run = conn.open_run
            if run is None or run.key != key:
                run = self._new_run(conn, ledger_id, master_key, flags, callback, per_entry)
            ids = run.entry_ids
            ids.append(entry_id)
            run.entries.append(entry)
            run.size += size
            queued = conn.queued_entries + 1
            conn.queued_entries = queued
            if queued == 1 or queued == entries_max:
                conn.wake.set()  # a full batch goes out even while the send window is used up
            if len(ids) >= entries_max or run.size >= self.batch_bytes_max:
                conn.open_run = None

    def _new_run(
        self, conn: _Connection, ledger_id: int, master_key: bytes, flags: int, callback: Any, per_entry: bool
    ) -> _Run:
        run = _Run(ledger_id, master_key, flags, callback, per_entry, time.monotonic() + self.add_timeout_s)
        conn.queue.append(run)
        conn.runs[run] = None
        conn.open_run = run
        return run

    def writable(self, bookie_id: BookieId) -> bool:
        """Whether ``bookie_id`` has room for more adds (below ``inflight_bytes_max``)."""
        conn = self._conns.get(bookie_id)
        return conn is None or conn.inflight_bytes < self.inflight_bytes_max

    async def wait_writable(self, bookie_id: BookieId, timeout_s: float | None = None) -> bool:
        """Wait until ``bookie_id`` is below ``inflight_bytes_max``; False if ``timeout_s`` passed."""
        conn = self._conns.get(bookie_id)
        if conn is None or conn.inflight_bytes < self.inflight_bytes_max:
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
        return conn.inflight_bytes if conn is not None else 0

    def pending_adds(self, bookie_id: BookieId | None = None) -> int:
        """Adds not yet answered (all bookies, or one)."""
        conns = self._conns.values() if bookie_id is None else [self._conns.get(bookie_id)]
        total = 0
        for conn in conns:
            if conn is not None:
                total += conn.queued_entries + sum(map(len, conn.ledgers.values()))
                total += sum(map(len, conn.dups.values()))
        return total

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
            except Exception:
                log.exception("add_callback_failed", bookie_id=bookie_id, ledger_id=ledger_id, entry_id=entry_ids[0])
            return
        for entry_id in entry_ids:
            try:
                cb(bookie_id, ledger_id, entry_id, status)
            except Exception:
                log.exception("add_callback_failed", bookie_id=bookie_id, ledger_id=ledger_id, entry_id=entry_id)

    # --- connection lifecycle ----------------------------------------------------
    def _open(self, bookie_id: BookieId) -> _Connection | None:
        """Start the add stream of ``bookie_id`` (None while closed or unresolvable)."""
        if self._closed:
            return None
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        conn = self._conns.get(bookie_id)
        if conn is None:
            conn = _Connection(bookie_id)
            self._conns[bookie_id] = conn
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
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep_loop(), name="scriba-add-sweep")
        return conn

    async def _stream(self, conn: _Connection) -> None:
        delay_s = conn.retry_at - time.monotonic()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        try:
            if conn.stub is None:  # the channel was dropped while waiting
                self._ensure_channel(conn)
            add_stream = conn.add_stream
            if add_stream is None:
                raise UnavailableError(f"bookie {conn.bookie_id}: no channel")
            call = add_stream()
        except Exception as exc:
            if conn.sender is asyncio.current_task():
                self._break(conn, _UNAVAILABLE, f"open: {_describe(exc)}", drop_channel=False)
            return
        conn.call = call
        conn.reader = asyncio.get_running_loop().create_task(
            self._read_loop(conn, call), name=f"scriba-add-recv-{conn.bookie_id}"
        )
        await self._send_loop(conn, call)

    def _ensure_channel(self, conn: _Connection) -> None:
        try:
            address = self._resolve(conn.bookie_id)
        except ScribaError:
            raise
        except Exception as exc:  # a registry lookup that failed in an unexpected way
            raise UnavailableError(f"bookie {conn.bookie_id}: cannot resolve: {exc!r}") from exc
        if conn.channel is not None and address == conn.address:
            return
        if conn.channel is not None:
            self._close_channel_later(conn.channel)
        conn.address = address
        conn.channel = grpc.aio.insecure_channel(address, options=list(_CHANNEL_OPTIONS))
        conn.stub = pb_grpc.BookieStub(conn.channel)
        conn.add_stream = conn.channel.stream_stream(
            _ADD_STREAM_METHOD,
            request_serializer=None,  # the sender writes AddBatch bytes it joined itself
            response_deserializer=pb.AddResponseBatch.FromString,
        )

    def _close_channel_later(self, channel: grpc.aio.Channel) -> None:
        task = asyncio.get_running_loop().create_task(channel.close(grace=None))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _note_failure(self, conn: _Connection, reason: str) -> None:
        conn.fail_count += 1
        backoff = min(RECONNECT_BACKOFF_MAX_S, RECONNECT_BACKOFF_MIN_S * (2 ** (conn.fail_count - 1)))
        conn.retry_at = time.monotonic() + backoff
        log.info("bookie_stream_failed", bookie_id=conn.bookie_id, reason=reason, backoff_s=backoff)


    def _break(
        self,
        conn: _Connection,
        status: Status,
        reason: str,
        *,
        drop_channel: bool,
        timed_out: Iterable[_Run] = (),
    ) -> None:
        """Fail the stream: answer every pending add with ``status`` (``timed_out`` runs:
        TIMEOUT); back off."""
        call, sender, reader = conn.call, conn.sender, conn.reader
        conn.call = conn.sender = conn.reader = None
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

    def _fail_all(self, conn: _Connection, status: Status, timed_out: frozenset[_Run] = frozenset()) -> None:
        runs, ledgers, dups = conn.runs, conn.ledgers, conn.dups
        conn.runs, conn.ledgers, conn.dups = {}, {}, {}
        conn.queue, conn.open_run, conn.queued_entries = [], None, 0
        conn.sent_unanswered = 0
        conn.inflight_bytes = 0
        self._signal_writable(conn)
        left: dict[_Run, list[int]] = {}  # sent runs: their unanswered ids
        for ids in ledgers.values():
            for entry_id, run in ids.items():
                left.setdefault(run, []).append(entry_id)
        for (_ledger_id, entry_id), waiting in dups.items():
            for run in waiting:
                left.setdefault(run, []).append(entry_id)
        bookie_id = conn.bookie_id
        safe = self._safe_call
        for run in runs:
            entry_ids = left.get(run) if run.sent else run.entry_ids
            if entry_ids:
                safe(
                    run.callback, run.per_entry, bookie_id, run.ledger_id, entry_ids,
                    _TIMEOUT if run in timed_out else status,
                )

    def _signal_writable(self, conn: _Connection) -> None:
        event = conn.writable_event
        if event is not None and conn.inflight_bytes < self.inflight_bytes_max:
            conn.writable_event = None
            event.set()

    # --- the per-bookie tasks ------------------------------------------------------
    async def _send_loop(self, conn: _Connection, call: Any) -> None:
        entries_max, bytes_max = self.batch_entries_max, self.batch_bytes_max
        window = self.send_window_entries
        wake = conn.wake
        join = b"".join
        try:
            while True:
                queued = conn.queued_entries
                # Nagle-like: while a window of entries is unanswered, hold a partial batch
                # back so that it fills up (full batches always go).
                if not queued or (queued < entries_max and conn.sent_unanswered >= window):
                    wake.clear()
                    await wake.wait()
                    continue
                queue = conn.queue
                parts: list[bytes] = []
                count = size = taken = 0
                for run in queue:  # whole runs (each within the limits), at least one
                    n = len(run.entry_ids)
                    if taken and (count + n > entries_max or size + run.size > bytes_max):
                        break
                    taken += 1
                    count += n
                    size += run.size
                    self._register(conn, run)
                    _encode_run(run, parts)
                if taken == len(queue):
                    conn.queue = []
                    conn.open_run = None
                else:
                    del queue[:taken]
                conn.queued_entries = queued - count
                self.batches_sent += 1
                self.entries_sent += count
                conn.sent_unanswered += count
                await call.write(join(parts))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if conn.call is call:
                self._break(conn, _UNAVAILABLE, f"write: {_describe(exc)}", drop_channel=False)

    @staticmethod
    def _register(conn: _Connection, run: _Run) -> None:
        """``run`` is being sent: map its ids to it (an id already pending waits in dups)."""
        ids = run.entry_ids
        run.sent = True
        run.remaining = len(ids)
        pending = conn.ledgers.get(run.ledger_id)
        if pending is None:
            pending = conn.ledgers[run.ledger_id] = {}
        if pending and not pending.keys().isdisjoint(ids):
            for entry_id in ids:  # rare: a re-send of an add still pending
                if entry_id in pending:
                    conn.dups.setdefault((run.ledger_id, entry_id), []).append(run)
                else:
                    pending[entry_id] = run
            return
        before = len(pending)
        pending.update(dict.fromkeys(ids, run))
        if len(pending) - before != len(ids):  # rare: one id twice in the run
            for entry_id, times in Counter(ids).items():
                if times > 1:
                    conn.dups.setdefault((run.ledger_id, entry_id), []).extend([run] * (times - 1))

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
                self._break(conn, _UNAVAILABLE, f"read: {_describe(exc)}", drop_channel=False)

    def _on_answer(self, conn: _Connection, ledger_id: int, ids: list[int], code: int) -> None:
        """One bookie answer: ``ids`` of ``ledger_id`` all got ``code``."""
        n = len(ids)
        if not n:
            return
        unanswered = conn.sent_unanswered - n
        conn.sent_unanswered = unanswered if unanswered > 0 else 0
        if conn.queued_entries and unanswered < self.send_window_entries:
            conn.wake.set()
        pending = conn.ledgers.get(ledger_id)
        if pending is None:
            return  # nothing of this ledger is pending (answered already)
        groups: Any
        if conn.dups:
            groups = self._match_with_dups(conn, ledger_id, pending, ids)
        else:
            runs = list(map(pending.pop, ids, repeat(None)))
            run = runs[0]
            groups = ((run, ids),) if run is not None and runs.count(run) == n else _group(ids, runs).items()
        if not pending:
            del conn.ledgers[ledger_id]
        status = _OK if code == 0 else _status(code)
        bookie_id = conn.bookie_id
        for run, entry_ids in groups:
            remaining = run.remaining - len(entry_ids)
            run.remaining = remaining
            if remaining <= 0:
                del conn.runs[run]
                conn.inflight_bytes -= run.size
                conn.fail_count = 0
                if conn.writable_event is not None:
                    self._signal_writable(conn)
            if run.per_entry:
                self._safe_call(run.callback, True, bookie_id, ledger_id, entry_ids, status)
                continue
            try:
                run.callback(bookie_id, ledger_id, entry_ids, status)
            except Exception:
                log.exception("add_callback_failed", bookie_id=bookie_id, ledger_id=ledger_id, entry_id=entry_ids[0])

    @staticmethod
    def _match_with_dups(
        conn: _Connection, ledger_id: int, pending: dict[int, _Run], ids: list[int]
    ) -> Iterable[tuple[_Run, list[int]]]:
        """Answered ids by run when some adds were sent again while pending (FIFO per id)."""
        runs: list[_Run | None] = []
        dups = conn.dups
        for entry_id in ids:
            run = pending.pop(entry_id, None)
            runs.append(run)
            if run is None:
                continue
            key = (ledger_id, entry_id)
            waiting = dups.get(key)
            if waiting:
                pending[entry_id] = waiting.pop(0)
                if not waiting:
                    del dups[key]
        return _group(ids, runs).items()

    async def _sweep_loop(self) -> None:
        interval = self._sweep_interval_s
        while not self._closed:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for conn in list(self._conns.values()):
                if conn.runs:
                    self._sweep(conn, now)

    def _sweep(self, conn: _Connection, now: float) -> None:
        expired: list[_Run] = []
        for run in conn.runs:  # creation order: deadlines ascend
            if run.deadline > now:
                break
            expired.append(run)
        if not expired:
            return
        # A silent stream: answer the expired adds TIMEOUT, the rest UNAVAILABLE, redial.
        log.info(
            "bookie_add_timeout", bookie_id=conn.bookie_id, expired_runs=len(expired), address=conn.address
        )
        self._break(conn, _UNAVAILABLE, "add timeout", drop_channel=True, timed_out=expired)

    # --- reads -------------------------------------------------------------------------
    def _stub(self, bookie_id: BookieId) -> tuple[_Connection, pb_grpc.BookieStub]:
        if self._closed:
            raise UnavailableError("transport is closed")
        conn = self._conns.get(bookie_id)
        if conn is None:
            conn = _Connection(bookie_id)
            self._conns[bookie_id] = conn
        self._ensure_channel(conn)
        stub = conn.stub
        if stub is None:
            raise UnavailableError(f"bookie {conn.bookie_id}: no channel")
        return conn, stub

    def _rpc_error(self, conn: _Connection, exc: grpc.aio.AioRpcError, what: str) -> ScribaError:
        code = exc.code()
        text = f"bookie {conn.bookie_id} ({conn.address}) {what}: {code.name} {exc.details() or ''}".strip()
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            # The channel may be stuck behind a silent drop: dial afresh next time.
            if conn.channel is not None and conn.call is None:
                self._close_channel_later(conn.channel)
                conn.channel = conn.stub = conn.add_stream = None
            return DeadlineError(text)
        return UnavailableError(text)

    def _timeout(self, timeout_s: float | None) -> float:
        return self.read_timeout_s if timeout_s is None else timeout_s

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
        timeout_s: float | None = None,
    ) -> list[bytes]:
        entries: list[bytes] = []
        runs = self.read_runs(
            bookie_id, ledger_id, first_entry_id, last_entry_id,
            max_entries=max_entries, max_bytes=max_bytes, timeout_s=timeout_s,
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
        )
        got = 0
        call = stub.ReadRange(request, timeout=self._timeout(timeout_s))
        try:
            async for chunk in call:
                run = _chunk_run(chunk, bookie_id, ledger_id, first_entry_id + got, max_entries - got)
                if run is not None:
                    got += len(run)
                    yield run
                if chunk.status != 0:
                    if got:  # a short answer: the caller goes on from the next entry
                        break
                    raise error_for_status(
                        chunk.status, _message(chunk.message, bookie_id, ledger_id, first_entry_id)
                    )
                if got >= max_entries:
                    break
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(conn, exc, "read_range") from None
        finally:
            call.cancel()
        if not got and first_entry_id <= last_entry_id:
            raise NoSuchEntryError(f"bookie {bookie_id}: ledger {ledger_id} entry {first_entry_id}: no entries")

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
        piggyback_entry: bool = True,
    ) -> LacResult:
        request = pb.ReadLacRequest(
            ledger_id=ledger_id,
            long_poll=True,
            previous_lac=previous_lac,
            timeout_ms=max(0, int(wait_s * 1000)),
            piggyback_entry=piggyback_entry,
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
            piggybacked_entry=bytes(r.piggybacked_entry),
            fenced=r.fenced,
        )

    async def write_lac(
        self, bookie_id: BookieId, ledger_id: LedgerId, lac: EntryId, master_key: bytes
    ) -> None:
        conn, stub = self._stub(bookie_id)
        request = pb.WriteLacRequest(ledger_id=ledger_id, lac=lac, master_key=master_key)
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


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name} {exc.details() or ''}".strip()
    return f"{type(exc).__name__}: {exc}"


def _message(message: str, bookie_id: BookieId, ledger_id: int | None, entry_id: int | None) -> str:
    where = f"bookie {bookie_id}"
    if ledger_id is not None:
        where += f" ledger {ledger_id}"
    if entry_id is not None:
        where += f" entry {entry_id}"
    return f"{where}: {message}" if message else where
