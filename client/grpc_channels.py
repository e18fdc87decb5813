"""The channels of the gRPC transport: one per bookie, dialed and re-dialed.

``GrpcChannels`` is the base of ``GrpcBookieTransport`` (``grpc_transport.py``; the reads
are the layer ``grpc_reads.py`` over it, the batched add streams the transport itself).
It holds the transport's fields (all set in one ``__init__``) and, per bookie, a
``_Connection``: the channel, the add stream's call and tasks, and the bookie's adds in
the I/O-free ``AddBatcher``.

Dialing: a bookie's address is resolved at each use; a channel is opened on first use
and replaced when the address changed (the old one closed in the background). A failed
add stream backs off before it is redialed (``_note_failure``: doubling from
``RECONNECT_BACKOFF_MIN_S`` to ``RECONNECT_BACKOFF_MAX_S``); a read that passed its
deadline drops an idle channel (it may be stuck behind a silent drop) so the next use
dials afresh. gRPC failures become ``scriba.errors`` here (``_rpc_error``): a refused
certificate ``UnauthorizedError``, a deadline ``DeadlineExceededError``, anything else
``UnavailableError`` (a plaintext transport's says it dialed without TLS).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Final

import grpc
import grpc.aio

from scriba.client.add_batcher import AddBatcher, BookieAdds
from scriba.client.transport import TransportConfig
from scriba.errors import DeadlineExceededError, ScribaError, UnauthorizedError, UnavailableError
from scriba.grpc_auth import open_channel
from scriba.ids import BookieId
from scriba.log import get_logger
from scriba.proto import scriba_pb2 as pb
from scriba.proto import scriba_pb2_grpc as pb_grpc

__all__ = ["MESSAGE_BYTES_MAX", "GrpcChannels"]

log = get_logger(__name__)

MESSAGE_BYTES_MAX: Final = 64 * 1024 * 1024
RECONNECT_BACKOFF_MIN_S: Final = 0.05
RECONNECT_BACKOFF_MAX_S: Final = 2.0
_PLAINTEXT_HINT: Final = " (this client dials without TLS: does the bookie require it?)"
_REFUSED_CODES: Final = frozenset({grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED})

_CHANNEL_OPTIONS: Final = (
    ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
    ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
    # (not grpc.min_reconnect_backoff_ms: despite its name it is the connect timeout)
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
)
_ADD_STREAM_METHOD: Final = "/scriba.v1.Bookie/AddStream"


class _Connection:
    """One bookie: its channel, add stream, tasks and batcher (module docstring)."""

    __slots__ = (
        "add_stream",
        "address",
        "adds",
        "bookie_id",
        "call",
        "channel",
        "closing",
        "fail_count",
        "generation",
        "reader",
        "retry_at",
        "sender",
        "stub",
        "wake",
        "writable_event",
    )

    def __init__(self, bookie_id: BookieId, adds: BookieAdds) -> None:
        self.bookie_id = bookie_id
        self.adds = adds  # queued and unanswered adds (no I/O)
        self.address = ""
        self.channel: grpc.aio.Channel | None = None
        self.stub: pb_grpc.BookieStub | None = None
        self.add_stream: Any = None  # AddStream taking pre-serialized AddBatch bytes
        self.call: Any = None
        self.sender: asyncio.Task[None] | None = None
        self.reader: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()
        self.writable_event: asyncio.Event | None = None
        self.retry_at = 0.0
        self.fail_count = 0
        self.generation = 0
        self.closing = False


class GrpcChannels:
    """The fields of ``GrpcBookieTransport`` and its channels (see the module docstring)."""

    def __init__(self, resolve: Callable[[BookieId], str], config: TransportConfig | None = None) -> None:
        self._config = config = (config or TransportConfig()).validate()
        self._tls = config.tls.load() if config.tls is not None else None  # bad files: ConfigError now
        self._resolve = resolve
        self.add_timeout_s = config.add_timeout_s
        self.read_timeout_s = config.read_timeout_s
        self.packed_reads = config.packed_reads  # ask range reads as runs (False: as an old client)
        self.inflight_bytes_max = config.inflight_bytes_max
        self._batcher = AddBatcher(config, time.monotonic)
        self._push = self._batcher.push  # bound once: called once per entry
        self._corked = 0  # cork() depth: adds held for one message (uncork sends them)
        self._corked_conns: list[_Connection] = []
        self._flush_conns: list[_Connection] = []  # idle bookies to send to at the end of this loop turn
        self._conns: dict[BookieId, _Connection] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # counters (cheap ints; read by tests and the bench)
        self.batches_sent = 0
        self.entries_sent = 0

    @property
    def config(self) -> TransportConfig:
        return self._config

    def _connection(self, bookie_id: BookieId) -> _Connection:
        conn = self._conns.get(bookie_id)
        if conn is None:
            conn = self._conns[bookie_id] = _Connection(bookie_id, self._batcher.bookie(bookie_id))
        return conn

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
        conn.channel = open_channel(address, self._tls, _CHANNEL_OPTIONS)
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

    def _stub(self, bookie_id: BookieId) -> tuple[_Connection, pb_grpc.BookieStub]:
        if self._closed:
            raise UnavailableError("transport is closed")
        conn = self._connection(bookie_id)
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
            return DeadlineExceededError(text)
        if code in _REFUSED_CODES:
            return UnauthorizedError(text)
        if self._tls is None and code is grpc.StatusCode.UNAVAILABLE:
            text += _PLAINTEXT_HINT
        return UnavailableError(text)

    def _describe(self, exc: BaseException) -> str:
        """``exc`` for a log line; a plaintext transport's UNAVAILABLE says it dialed without TLS."""
        text = _describe(exc)
        if self._tls is None and isinstance(exc, grpc.aio.AioRpcError) and exc.code() is grpc.StatusCode.UNAVAILABLE:
            text += _PLAINTEXT_HINT
        return text

    def _timeout(self, timeout_s: float | None) -> float:
        return self.read_timeout_s if timeout_s is None else timeout_s


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


