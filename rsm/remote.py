"""``RsmClient``: propose and read through the replica service, from outside the group.

    client = RsmClient(["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"])
    session = await client.open_session()
    result = await client.propose(b"incr", session=session)
    value = await client.read(b"get")                      # linearizable: the replica proves it
    await client.close()

Reads are pipelined: every ``read`` called while the event loop runs one step goes into
one ``READ_MANY`` frame (at most ``reads_per_frame_max``), and frames do not wait for the
answers of earlier ones; the replica answers a frame's linearizable reads on one read
index (one leadership confirmation). A frame the replica refuses as too large (answers
beyond the frame limit) is sent again read by read. ``pipeline_reads=False`` sends each
read in its own ``READ`` request (the behaviour before pipelining; benchmarks compare).

A request goes to the replica that answered last; an ``RsmNotLeaderError`` naming the
leader's address sends it there next, an unreachable replica the next address. With a
session, a proposal whose outcome is unknown (the connection dropped, the leader was
deposed) is sent again with the same sequence number — applied at most once — until
``timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from typing import Any

from scriba.errors import (
    BadRequestError,
    CommandOutcomeUnknownError,
    ConfigError,
    DeadlineExceededError,
    ReplicaStoppedError,
    RsmNotLeaderError,
    ScribaError,
    UnavailableError,
)
from scriba.rsm import wire
from scriba.rsm.client_session import ClientSession, Committed
from scriba.rsm.peer import PeerPool
from scriba.stream import Position
from scriba.tls import TlsConfig

PendingRead = tuple[bytes, "asyncio.Future[bytes]"]  # a READ body and its caller's future
RETRIABLE = (RsmNotLeaderError, UnavailableError, CommandOutcomeUnknownError, DeadlineExceededError, ReplicaStoppedError)


class RsmClient:
    def __init__(self, addresses: Sequence[str], *, timeout_s: float = 30.0, attempt_timeout_s: float = 5.0,
                 retry_pause_s: float = 0.05, tls: TlsConfig | None = None, pipeline_reads: bool = True,
                 reads_per_frame_max: int = 1024) -> None:
        if not addresses:
            raise ConfigError("RsmClient needs at least one replica address")
        if not 1 <= reads_per_frame_max <= wire.READS_PER_FRAME_MAX:
            raise ConfigError(f"reads_per_frame_max must be in [1, {wire.READS_PER_FRAME_MAX}]")
        self.addresses = list(addresses)
        self.timeout_s = timeout_s
        self.attempt_timeout_s = attempt_timeout_s
        self.retry_pause_s = retry_pause_s
        self._pool = PeerPool(tls.load() if tls is not None else None)
        self._current = 0
        self._hint: str | None = None
        self.pipeline_reads = pipeline_reads
        self.reads_per_frame_max = reads_per_frame_max
        self._reads: dict[str | None, list[PendingRead]] = {}  # by target address (None: the leader's)
        self._frames: set[asyncio.Task[None]] = set()
        self.read_frames_sent = 0

    async def _call(self, op: wire.Op, body: bytes, *, retry: bool = True) -> bytes:
        deadline = time.monotonic() + self.timeout_s
        while True:
            address = self._hint or self.addresses[self._current % len(self.addresses)]
            try:
                return await self._pool.get(address).call(op, body, self.attempt_timeout_s)
            except RsmNotLeaderError as exc:
                self._hint = exc.leader_address if exc.leader_address and exc.leader_address != address else None
                if self._hint is None:
                    self._current += 1
                error: ScribaError = exc
            except RETRIABLE as exc:
                self._hint = None
                self._current += 1
                error = exc
            if not retry or time.monotonic() > deadline:
                raise error
            await asyncio.sleep(self.retry_pause_s)

    async def open_session(self) -> ClientSession:
        position, result = wire.parse_committed(await self._call(wire.Op.OPEN_SESSION, b""))
        return ClientSession(int.from_bytes(result, "big"), last_position=position)

    async def submit(self, command: bytes, *, session: ClientSession | None = None, seq: int | None = None
                     ) -> Committed:
        if session is None:  # without a session a retry could apply twice: one attempt per replica hop
            body = wire.propose_body(0, 0, 0, command)
            position, result = wire.parse_committed(await self._call(wire.Op.PROPOSE, body, retry=False))
            return Committed(result, position)
        seq = session.allocate() if seq is None else seq
        body = wire.propose_body(session.session_id, seq, session.acked_below, command)
        position, result = wire.parse_committed(await self._call(wire.Op.PROPOSE, body))
        session.answered(seq, position)
        return Committed(result, position)

    async def propose(self, command: bytes, *, session: ClientSession | None = None, seq: int | None = None
                      ) -> bytes:
        return (await self.submit(command, session=session, seq=seq)).result

    async def read(self, request: bytes, consistency: str = "linearizable", *, after: Position | None = None,
                   address: str | None = None) -> bytes:
        body = wire.read_body(consistency, after, request)
        if not self.pipeline_reads:
            if address is not None:
                return await self._pool.get(address).call(wire.Op.READ, body, self.attempt_timeout_s)
            return await self._call(wire.Op.READ, body)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        pending = self._reads.setdefault(address, [])
        pending.append((body, future))
        if len(pending) == 1:
            loop.call_soon(self._send_reads, address)
        return await future

    def _send_reads(self, address: str | None) -> None:
        pending = self._reads.pop(address, [])
        for start in range(0, len(pending), self.reads_per_frame_max):
            task = asyncio.get_running_loop().create_task(
                self._read_frame(address, pending[start:start + self.reads_per_frame_max]))
            self._frames.add(task)
            task.add_done_callback(self._frames.discard)

    async def _read_frame(self, address: str | None, reads: list[PendingRead]) -> None:
        self.read_frames_sent += 1
        try:
            body = wire.read_many_body([b for b, _ in reads])
            if address is not None:
                answer = await self._pool.get(address).call(wire.Op.READ_MANY, body, self.attempt_timeout_s)
            else:
                answer = await self._call(wire.Op.READ_MANY, body)
            answers = wire.parse_read_many_answer(answer, len(reads))
        except BadRequestError as exc:
            if len(reads) > 1 and "exceeds" in str(exc):  # the answers outgrew a frame: read by read
                await asyncio.gather(*(self._read_frame(address, [one]) for one in reads))
                return
            answers = [(False, b"")] * len(reads)
            error: ScribaError | None = exc
        except ScribaError as exc:
            answers = [(False, b"")] * len(reads)
            error = exc
        except asyncio.CancelledError:  # close(): no caller may hang on a frame that will not be answered
            for _, future in reads:
                if not future.done():
                    future.set_exception(UnavailableError("the RsmClient was closed with the read in flight"))
            raise
        else:
            error = None
        for (_, future), (ok, out) in zip(reads, answers, strict=True):
            if future.done():
                continue  # its caller gave up
            if ok:
                future.set_result(out)
            else:
                future.set_exception(error if error is not None else wire.error_from(out))

    async def status(self, address: str) -> dict[str, Any]:
        return dict(json.loads(await self._pool.get(address).call(wire.Op.STATUS, b"", self.attempt_timeout_s)))

    async def close(self) -> None:
        for task in list(self._frames):
            task.cancel()
        for task in list(self._frames):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._pool.close()
