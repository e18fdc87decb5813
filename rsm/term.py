"""One leader term: the stream writer, the group-commit batcher and the shared barrier.

A :class:`LeaderTerm` exists from ``Serve`` to ``StepDown``. ``propose`` queues an
envelope and returns a future; ``flush`` sends every batch the batcher allows as one
``append_many`` (one record set when it fits); when an append confirms, the replica's
``confirm`` callback applies the released proposals in stream order, and only while
the role core still ``accepts`` this term. ``barrier`` returns the future of the
barrier not yet sent, or queues a new one: every linearizable read waiting at that
moment shares one append. ``end`` fails everything not released with
``CommandOutcomeUnknownError`` (each may or may not be in the stream).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scriba.errors import CommandOutcomeUnknownError, ScribaError, TooManyRequestsError
from scriba.log import get_logger
from scriba.rsm.batching import Batch, ProposalBatcher
from scriba.rsm.config import RsmConfig
from scriba.rsm.envelope import NO_SESSION, Envelope, Kind
from scriba.rsm.state import Outcome
from scriba.stream import Position, StreamWriter

log = get_logger(__name__)


@dataclass(eq=False, slots=True)
class Proposal:
    envelope: Envelope
    future: asyncio.Future[tuple[Outcome, Position]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


Confirm = Callable[["LeaderTerm", list[tuple[Proposal, Position]]], None]
Depose = Callable[["LeaderTerm", str], None]


class LeaderTerm:
    def __init__(self, token: int, writer: StreamWriter, config: RsmConfig, confirm: Confirm, depose: Depose,
                 clock_ms: int, *, on_batch: Callable[[int], object] | None = None) -> None:
        self.token = token  # the election's token (the role core's term)
        self.writer = writer
        self.writer_token = writer.token  # stamped on every envelope: non-decreasing along the stream
        self.config = config
        self.batcher: ProposalBatcher[Proposal] = ProposalBatcher(
            records_max=config.batch_records_max, bytes_max=config.batch_bytes_max,
            inflight_max=config.batches_inflight_max,
        )
        self._confirm = confirm
        self._depose = depose
        self._on_batch = on_batch  # called with each record set's size (metrics)
        self._last_stamp_ms = clock_ms
        self._by_key: dict[tuple[int, int], Proposal] = {}
        self._open_barrier: Proposal | None = None
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.ended = False
        self.batches_sent = 0
        self.records_sent = 0

    def stamp(self, now_ms: int) -> int:
        self._last_stamp_ms = max(self._last_stamp_ms, now_ms)
        return self._last_stamp_ms

    def propose(self, kind: Kind, payload: bytes, now_ms: int, session_id: int = NO_SESSION, seq: int = 0,
                acked_below: int = 0) -> asyncio.Future[tuple[Outcome, Position]]:
        if session_id != NO_SESSION:
            same = self._by_key.get((session_id, seq))
            if same is not None:  # a retry while the first attempt is in flight: one append
                return same.future
        if self.batcher.queued >= self.config.proposals_waiting_max:
            raise TooManyRequestsError(f"{self.batcher.queued} proposals waiting (proposals_waiting_max)")
        envelope = Envelope(kind, self.writer_token, self.stamp(now_ms), payload, session_id, seq, acked_below)
        proposal = Proposal(envelope)
        if session_id != NO_SESSION:
            key = (session_id, seq)
            self._by_key[key] = proposal
            proposal.future.add_done_callback(lambda _f: self._by_key.pop(key, None))
        self.batcher.add(proposal, envelope.size_bytes)
        self._schedule_flush()
        return proposal.future

    def barrier(self, now_ms: int) -> asyncio.Future[tuple[Outcome, Position]]:
        if self._open_barrier is None:
            self._open_barrier = Proposal(Envelope(Kind.BARRIER, self.writer_token, self.stamp(now_ms)))
            self.batcher.add(self._open_barrier, self._open_barrier.envelope.size_bytes)
            self._schedule_flush()
        return self._open_barrier.future

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        while not self.ended:
            batch = self.batcher.take()
            if batch is None:
                return
            if self._open_barrier is not None and self._open_barrier in batch.items:
                self._open_barrier = None  # later reads need a later barrier
            task = asyncio.get_running_loop().create_task(self._append(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _append(self, batch: Batch[Proposal]) -> None:
        self.batches_sent += 1
        self.records_sent += len(batch.items)
        if self._on_batch is not None:
            self._on_batch(len(batch.items))
        try:
            positions = await self.writer.append_many([p.envelope.encode() for p in batch.items])
        except ScribaError as exc:
            self._depose(self, f"append failed: {type(exc).__name__}: {exc}")
            return
        if self.ended:
            return  # deposed meanwhile: the tail applies what reached the stream
        self._confirm(self, self.batcher.confirmed(batch.batch_id, positions))
        self.flush()

    async def end(self, reason: str, *, close_writer: bool) -> None:
        """Fail what is not released, stop the appends, close (or abort) the writer."""
        if self.ended:
            return
        self.ended = True
        error = CommandOutcomeUnknownError(
            f"leadership ended ({reason}) with the command in flight: it may or may not be applied; "
            "retry with the same session and seq"
        )
        for proposal in self.batcher.fail_all():
            if not proposal.future.done():
                proposal.future.set_exception(error)
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        try:
            if close_writer and self.writer.error is None:
                await asyncio.wait_for(self.writer.close(), 10.0)
            else:
                await self.writer.abort()
        except (ScribaError, TimeoutError) as exc:
            log.info("rsm_writer_close_failed", error=str(exc))
            with contextlib.suppress(ScribaError):
                await self.writer.abort()
