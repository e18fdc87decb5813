"""The binary ``BookieTransport``: adds and reads over ``scriba.proto.binary`` frames.

Theory of operation. :class:`BinaryTransport` is the gRPC transport with another wire
under its hot path, bookie by bookie: a bookie whose registration advertises a binary
address gets one TCP connection (a :class:`BinaryLink`, Nagle off, optional TLS) that
carries its adds, their answers, entry and range reads, LAC reads and long polls, and
explicit LAC writes when the link speaks version 2 (``WRITE_LAC``; over gRPC to an older
bookie: a push over gRPC arrived after the next entry's add in the traces, so tailing
readers never gained from it); a bookie that advertises none (or refuses every version
this client speaks) is served over gRPC exactly as ``GrpcBookieTransport`` does (mixed
clusters keep working). Bookie info always goes over gRPC.

Everything above the wire is the gRPC transport's: the same ``AddBatcher`` (runs,
batching without delay when one add waits, bounded in-flight bytes, the Nagle-like send
window), the same deadlines (an add sweep answers TIMEOUT; reads carry
``read_timeout_s``), the same failure handling (a broken link answers every pending add
UNAVAILABLE, which the write core turns into an ensemble change; the next add redials
after a bounded backoff). Only four hooks differ: the add "call" is the link (its
``write_parts`` frames an ADD around the message's parts, which the socket write joins:
the entries are copied once; answers arrive in ``data_received`` and are dispatched
directly, with no reader task in between), runs are encoded as binary runs, reads are
request/answer frames matched by request id (a tailing reader's long polls without a
coroutine: ``long_poll_lac_soon`` sends over an open link and hands the decoded answer
to a callback from the link's dispatch, its deadline a ``call_later`` timer), and adds are framed and written without
the sender task when waiting gains nothing (``_send_now``): a bookie with nothing
unanswered gets its adds at the end of the loop turn that queued them (a ``call_soon``,
with whatever else that turn adds); the appends made by callbacks while one ADD_ACK
frame is handled (every ledger it answers: a writer calls back its appends' owners as
it processes a confirmation, and they append again) are held (``cork``) and leave when
the frame's handling ends, one message per bookie, to every bookie whose send rule lets
a message go, busy or not (``uncork``: no loop turn; at one append in flight the bookie
slowest on the last entry is not left to its task, a turn behind the others). Other
adds to a busy bookie keep batching in its sender task.

A link's states: DIALING (TCP connect + HELLO/HELLO_OK, bounded by ``read_timeout_s``)
-> OPEN -> CLOSED (socket lost, ERROR frame, protocol error, or closed by the
transport): every read waiting on it fails ``UnavailableError``, its add stream breaks.
The next use dials a new link. The link itself (framing, dispatch of answers, its
states) is ``binary_link.py``'s; dialing, the add stream hooks and the reads are here.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Final

from scriba import tcp
from scriba.client.add_batcher import AddRun
from scriba.client.binary_link import BinaryLink, VersionRefused
from scriba.client.grpc_channels import _Connection, _message
from scriba.client.grpc_reads import LONG_POLL_MARGIN_S, follow_runs
from scriba.client.grpc_transport import GrpcBookieTransport
from scriba.client.transport import (
    BookieTransport,
    EntryRun,
    LacAnswer,
    LacResult,
    TransportConfig,
    Withdraw,
    poll_in_task,
)
from scriba.errors import (
    DeadlineExceededError,
    InternalError,
    ScribaError,
    Status,
    UnavailableError,
    error_for_status,
)
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.log import get_logger
from scriba.proto import binary as wire

log = get_logger(__name__)

_UNAVAILABLE: Final = Status.UNAVAILABLE
LINK_CLOSE_TIMEOUT_S: Final = 1.0


def _encode_run(run: AddRun, parts: list[bytes]) -> None:
    wire.encode_run(run.ledger_id, run.flags, run.master_key, run.entry_ids, run.entries, parts)  # type: ignore[arg-type]


class BinaryTransport(GrpcBookieTransport):
    """``BookieTransport`` over the binary data path where offered, gRPC elsewhere
    (module docstring). ``resolve_binary(bookie_id)``: the bookie's binary address or
    "" (gRPC); ``ssl_context``: the TLS hook for the links (None: plain TCP)."""

    def __init__(
        self,
        resolve: Callable[[BookieId], str],
        config: TransportConfig | None = None,
        *,
        resolve_binary: Callable[[BookieId], str],
        ssl_context: ssl.SSLContext | None = None,
        frame_bytes_max: int = wire.FRAME_BYTES_MAX,
    ) -> None:
        super().__init__(resolve, config)
        self._resolve_binary = resolve_binary
        tls = self._tls  # TransportConfig.tls: the links use TLS too, with the same certificates
        self._ssl = ssl_context or (tls.client_ssl_context() if tls is not None else None)
        self._server_name = tls.config.server_name if tls is not None else None
        self._frame_bytes_max = frame_bytes_max
        self._links: dict[BookieId, BinaryLink] = {}
        self._dialing: dict[BookieId, asyncio.Task[BinaryLink | None]] = {}
        self._grpc_only: set[BookieId] = set()  # refused every version we speak
        self.links_opened = 0

    def wire_of(self, bookie_id: BookieId) -> str:
        """"binary" while a link to ``bookie_id`` is open, else "grpc" (what it uses now)."""
        link = self._links.get(bookie_id)
        return "binary" if link is not None and not link.closed else "grpc"

    # --- links ------------------------------------------------------------------------------
    def _binary_address(self, bookie_id: BookieId) -> str:
        if bookie_id in self._grpc_only:
            return ""
        try:
            return self._resolve_binary(bookie_id)
        except ScribaError:
            return ""

    async def _link(self, bookie_id: BookieId) -> BinaryLink | None:
        """The open link to ``bookie_id`` (dialled if needed), None for a gRPC bookie."""
        if self._closed:
            raise UnavailableError("transport is closed")
        link = self._links.get(bookie_id)
        if link is not None and not link.closed:
            return link
        dialing = self._dialing.get(bookie_id)
        if dialing is None:
            dialing = asyncio.get_running_loop().create_task(self._dial(bookie_id))
            self._dialing[bookie_id] = dialing
            dialing.add_done_callback(lambda t: self._dial_done(bookie_id, t))
        return await asyncio.shield(dialing)

    def _dial_done(self, bookie_id: BookieId, task: asyncio.Task[BinaryLink | None]) -> None:
        if self._dialing.get(bookie_id) is task:
            del self._dialing[bookie_id]
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have gone (their own deadlines)

    async def _dial(self, bookie_id: BookieId) -> BinaryLink | None:
        address = self._binary_address(bookie_id)
        if not address:
            return None
        try:
            link = await self._connect(bookie_id, address)
        except VersionRefused as exc:
            log.warning("binary_version_refused", bookie_id=bookie_id, address=address, reason=str(exc))
            self._grpc_only.add(bookie_id)
            return None
        except TimeoutError:  # as a read's deadline would (a blackhole accepts, then is silent)
            raise DeadlineExceededError(f"bookie {bookie_id} ({address}): binary connect timed out") from None
        except OSError as exc:
            raise UnavailableError(f"bookie {bookie_id} ({address}): binary connect: {exc}") from None
        if self._closed:
            link.cancel()
            raise UnavailableError("transport is closed")
        self._links[bookie_id] = link
        self.links_opened += 1
        return link

    async def _connect(self, bookie_id: BookieId, address: str) -> BinaryLink:
        """TCP connect + HELLO within ``read_timeout_s`` (a link that fails is closed)."""
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        link: BinaryLink | None = None
        try:
            async with asyncio.timeout(self.read_timeout_s):
                _, link = await tcp.dial(lambda: BinaryLink(bookie_id, self._frame_bytes_max), host, int(port),
                                         ssl_context=self._ssl, server_hostname=self._server_name)
                await link.handshake()
        except BaseException:
            if link is not None:
                link.cancel()
            raise
        return link

    # --- the add stream hooks ---------------------------------------------------------------------
    async def _open_add_call(self, conn: _Connection) -> Any:
        link = await self._link(conn.bookie_id)
        if link is None:
            return await super()._open_add_call(conn)

        def on_answers(answers: list[wire.AddAnswer], conn: _Connection = conn, link: BinaryLink = link) -> None:
            if conn.call is not link:
                return
            on_answer = self._on_answer
            self._corked += 1  # cork(): the appends the answers' callbacks make leave together
            try:
                for a in answers:
                    on_answer(conn, a.ledger_id, a.entry_ids, a.status)  # type: ignore[arg-type]
            finally:
                self.uncork()

        link.on_answers = on_answers
        return link

    def _run_encoder(self, call: Any) -> Callable[[AddRun, list[bytes]], None] | None:
        return _encode_run if isinstance(call, BinaryLink) else None

    def _parts_writer(self, call: Any) -> Callable[[list[bytes]], Awaitable[None]] | None:
        return call.write_parts if isinstance(call, BinaryLink) else None

    def _sends_now(self, conn: _Connection) -> bool:
        return type(conn.call) is BinaryLink

    def _send_now(self, conn: _Connection) -> bool:
        """An idle link takes the message in this call: no sender task wake-up and no
        loop turn between an append and its frame (one append in flight)."""
        link = conn.call
        if type(link) is not BinaryLink or not link.sendable or not conn.adds.ready():
            return False
        parts: list[bytes] = []
        count = conn.adds.take_message(parts, _encode_run)
        self.batches_sent += 1
        self.entries_sent += count
        link.send_parts(parts)
        return True

    async def _read_loop(self, conn: _Connection, call: Any) -> None:
        if not isinstance(call, BinaryLink):
            return await super()._read_loop(conn, call)
        reason = await call.wait_closed()  # answers come through on_answers
        if conn.call is call:
            self._break(conn, _UNAVAILABLE, f"link: {reason}", drop_channel=False)

    # --- reads ----------------------------------------------------------------------------------
    async def _ask(self, bookie_id: BookieId, link: BinaryLink, timeout_s: float,
                   make: Callable[[int], list[wire.Buffer]], what: str) -> memoryview:
        try:
            async with asyncio.timeout(timeout_s):
                return await link.request(make)
        except TimeoutError:
            self._deadline_passed(bookie_id, link)
            raise DeadlineExceededError(f"bookie {bookie_id} {what}: no answer within {timeout_s} s") from None

    def _deadline_passed(self, bookie_id: BookieId, link: BinaryLink) -> None:
        """A read deadline passed: a link that carries no adds may sit behind a silent
        drop; close it so the next use dials afresh (the add sweep handles the others)."""
        conn = self._conns.get(bookie_id)
        if conn is None or conn.call is not link:
            link.cancel()

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
        link = await self._link(bookie_id)
        if link is None:
            return await super().read_entry(bookie_id, ledger_id, entry_id, fence=fence, master_key=master_key,
                                            timeout_s=timeout_s)
        flags = wire.READ_FENCE if fence else 0
        body = await self._ask(
            bookie_id, link, self._timeout(timeout_s),
            lambda rid: wire.encode_read_entry(rid, ledger_id, entry_id, flags, master_key), "read_entry",
        )
        status, _eid, message, entry = wire.decode_entry_answer(body)
        if status != 0:
            raise error_for_status(status, _message(message, bookie_id, ledger_id, entry_id))
        return bytes(entry)

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
        link = await self._link(bookie_id)
        if link is None:
            runs = super().read_runs(bookie_id, ledger_id, first_entry_id, last_entry_id, max_entries=max_entries,
                                     max_bytes=max_bytes, master_key=master_key, timeout_s=timeout_s)
            async with contextlib.aclosing(runs):
                async for run in runs:
                    yield run
            return
        timeout = self._timeout(timeout_s)
        key = master_key if link.version >= wire.KEYED_RANGE_VERSION else None  # older bookies: no key

        async def timed() -> AsyncGenerator[wire.RangeChunk, None]:
            """The link's chunks, each within the read's deadline."""
            chunks = link.chunks(lambda rid: wire.encode_read_range(
                rid, ledger_id, first_entry_id, last_entry_id, max_entries, max_bytes, key))
            async with contextlib.aclosing(chunks):
                while True:
                    try:
                        async with asyncio.timeout(timeout):
                            chunk = await anext(chunks)
                    except StopAsyncIteration:
                        return
                    except TimeoutError:
                        self._deadline_passed(bookie_id, link)
                        raise DeadlineExceededError(
                            f"bookie {bookie_id} read_range: no answer within {timeout} s") from None
                    yield chunk

        runs = follow_runs(
            timed(), lambda chunk, next_id, count_max: (
                chunk.status, chunk.message, _chunk_run(chunk, bookie_id, ledger_id, next_id, count_max)),
            bookie_id, ledger_id, first_entry_id, last_entry_id, max_entries,
        )
        async with contextlib.aclosing(runs):
            async for run in runs:
                yield run

    async def read_lac(
        self,
        bookie_id: BookieId,
        ledger_id: LedgerId,
        *,
        fence: bool = False,
        master_key: bytes = b"",
        timeout_s: float | None = None,
    ) -> LacResult:
        link = await self._link(bookie_id)
        if link is None:
            return await super().read_lac(bookie_id, ledger_id, fence=fence, master_key=master_key,
                                          timeout_s=timeout_s)
        flags = wire.READ_FENCE if fence else 0
        return await self._binary_lac(bookie_id, link, ledger_id, self._timeout(timeout_s),
                                      lambda rid: wire.encode_read_lac(rid, ledger_id, flags, -1, 0, master_key))

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
        link = await self._link(bookie_id)
        if link is None:
            return await super().long_poll_lac(bookie_id, ledger_id, previous_lac, wait_s=wait_s,
                                               piggyback_entries_max=piggyback_entries_max, master_key=master_key)
        timeout_ms = max(0, int(wait_s * 1000))
        entries_max = max(0, min(piggyback_entries_max, 0xFFFF))
        return await self._binary_lac(
            bookie_id, link, ledger_id, wait_s + LONG_POLL_MARGIN_S,
            lambda rid: wire.encode_read_lac(rid, ledger_id, wire.LAC_LONG_POLL, previous_lac, timeout_ms, master_key,
                                             entries_max),
        )

    def long_poll_lac_soon(
        self,
        bookie_id: BookieId,
        ledger_id: LedgerId,
        previous_lac: EntryId,
        on_answer: LacAnswer,
        *,
        wait_s: float,
        piggyback_entries_max: int = 1,
        master_key: bytes = b"",
    ) -> Withdraw:
        """``long_poll_lac`` as a callback (``PollSoonTransport``): over an open link, the
        request goes out now and its answer is decoded and handed on from the link's
        dispatch, its deadline a ``call_later`` timer (as ``_ask``'s: the link closed
        if it carries no adds); any other case (a link still to dial, a gRPC bookie, a
        ``long_poll_lac`` replaced by a subclass or a tracer) runs ``long_poll_lac`` in
        a task."""
        link = self._links.get(bookie_id)
        if link is None or link.closed or self._closed or type(self).long_poll_lac is not _LONG_POLL_LAC:
            return poll_in_task(self.long_poll_lac(
                bookie_id, ledger_id, previous_lac, wait_s=wait_s, piggyback_entries_max=piggyback_entries_max,
                master_key=master_key), on_answer)
        timeout_s = wait_s + LONG_POLL_MARGIN_S
        timeout_ms = max(0, int(wait_s * 1000))
        entries_max = max(0, min(piggyback_entries_max, 0xFFFF))

        def answered(body: memoryview | BaseException) -> None:
            timer.cancel()
            if isinstance(body, BaseException):
                on_answer(body)
                return
            try:
                result: LacResult | BaseException = self._lac_result(body, bookie_id, ledger_id)
            except Exception as exc:  # a malformed answer: the caller's error, as from long_poll_lac
                result = exc
            on_answer(result)

        def deadline() -> None:
            link.forget(rid)
            self._deadline_passed(bookie_id, link)
            on_answer(DeadlineExceededError(f"bookie {bookie_id} read_lac: no answer within {timeout_s} s"))

        def withdraw() -> None:
            timer.cancel()
            link.forget(rid)

        rid = link.request_soon(
            lambda rid: wire.encode_read_lac(rid, ledger_id, wire.LAC_LONG_POLL, previous_lac, timeout_ms, master_key,
                                             entries_max),
            answered,
        )
        timer = asyncio.get_running_loop().call_later(timeout_s, deadline)
        return withdraw

    async def _binary_lac(self, bookie_id: BookieId, link: BinaryLink, ledger_id: LedgerId, timeout_s: float,
                          make: Callable[[int], list[wire.Buffer]]) -> LacResult:
        body = await self._ask(bookie_id, link, timeout_s, make, "read_lac")
        return self._lac_result(body, bookie_id, ledger_id)

    @staticmethod
    def _lac_result(body: memoryview, bookie_id: BookieId, ledger_id: LedgerId) -> LacResult:
        """A LAC answer's ``LacResult`` (its non-OK status raised as the typed error)."""
        r = wire.decode_lac_answer(body)
        if r.status != 0:
            raise error_for_status(r.status, _message(r.message, bookie_id, ledger_id, None))
        return LacResult(
            lac=EntryId(r.lac),
            last_entry_id=EntryId(r.last_entry_id),
            last_entry=bytes(r.last_entry),
            piggybacked_entries=tuple(map(bytes, r.piggybacked_entries)),
            fenced=r.fenced,
        )

    async def write_lac(
        self, bookie_id: BookieId, ledger_id: LedgerId, lac: EntryId, master_key: bytes,
        *, hint_only: bool = False,
    ) -> None:
        link = await self._link(bookie_id)
        if link is None or link.version < wire.WRITE_LAC_VERSION:
            return await super().write_lac(bookie_id, ledger_id, lac, master_key, hint_only=hint_only)
        flags = wire.LAC_HINT_ONLY if hint_only else 0
        body = await self._ask(bookie_id, link, self.read_timeout_s,
                               lambda rid: wire.encode_write_lac(rid, ledger_id, lac, flags, master_key), "write_lac")
        status, message = wire.decode_lac_written(body)
        if status != 0:
            raise error_for_status(status, _message(message, bookie_id, ledger_id, None))

    async def close(self) -> None:
        await super().close()
        for task in list(self._dialing.values()):
            task.cancel()
        links = list(self._links.values())
        self._links.clear()
        for link in links:
            link.cancel()
        await asyncio.gather(*(link.wait_lost(LINK_CLOSE_TIMEOUT_S) for link in links))


_LONG_POLL_LAC: Final = BinaryTransport.long_poll_lac  # as defined here (long_poll_lac_soon: replaced?)


def _chunk_run(chunk: wire.RangeChunk, bookie_id: BookieId, ledger_id: int, next_id: int,
               count_max: int) -> EntryRun | None:
    """A RANGE_CHUNK's entries as a run of at most ``count_max`` (None: it has none)."""
    sizes = chunk.sizes
    if not sizes:
        return None
    if chunk.first_entry_id != next_id:
        raise InternalError(_message(f"malformed range answer: chunk starts at entry {chunk.first_entry_id}, "
                                     f"expected {next_id}", bookie_id, ledger_id, next_id))
    ends: list[int] = []
    total = 0
    for size in sizes[:count_max]:
        total += size
        ends.append(total)
    return EntryRun(EntryId(next_id), ends, bytes(chunk.blob))


def new_transport(registry: Any, config: TransportConfig | None = None, *,
                  ssl_context: ssl.SSLContext | None = None) -> BookieTransport:
    """The transport ``config.protocol`` names, resolving bookies through ``registry``
    (a ``BookieRegistry``: ``address`` and ``binary_address``)."""
    config = (config or TransportConfig()).validate()
    if config.protocol == "grpc":
        return GrpcBookieTransport(registry.address, config)
    return BinaryTransport(registry.address, config, resolve_binary=registry.binary_address,
                           ssl_context=ssl_context)
