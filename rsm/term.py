"""One leader term: the stream writer, the group-commit batcher and the leadership check.

A :class:`LeaderTerm` exists from ``Serve`` to ``StepDown``. ``propose`` queues an
envelope and returns a future; ``flush`` sends every batch the batcher allows as one
``append_many`` (one record set when it fits); when an append confirms, the replica's
``confirm`` callback applies the released proposals in stream order, and only while
the role core still ``accepts`` this term. ``end`` fails everything not released with
``CommandOutcomeUnknownError`` (each may or may not be in the stream).

Read index (``read_index``). A linearizable read needs a position at or after every
write confirmed before it arrived, from a check, begun after it arrived, that no newer
leader had confirmed anything by then. Two checks, ``RsmConfig.leader_read_check``:

- ``"barrier"``: ``barrier`` returns the future of the barrier not yet sent, or queues
  a new one: every read waiting at that moment shares one append; its confirmation (by
  ``Qa`` bookies of its write set, a journal fsync on each) proves the ledger unfenced
  after the reads arrived, and its position is the index.
- ``"fence_probe"`` (the default): rounds of :class:`~scriba.rsm.read_index.ReadIndexRounds`
  (one in flight; a read shares only a round that starts after it arrived). A round
  takes the index — the replica's applied position now — and then asks every bookie of
  the writer's current ledger whether it is fenced (plain LAC reads: answered from
  memory, no fsync; ``scriba.client.fence_probe``). ``Qa`` "not fenced" answers in one
  write set prove it; anything else (a bookie says "fenced", fails, does not know the
  ledger yet, is slower than ``fence_probe_timeout_s``, an ensemble change is being
  written) falls back to the barrier, which proves it or deposes the term.

Why a proof makes the index current (Raft's ReadIndex, §6.4 of Ongaro's thesis; etcd's
``ReadOnlySafe``; Ratis' ``ReadIndex``; there the heartbeat acks of a majority of the
*same term* prove that no newer leader was elected before they were sent; here the
ledger's bookies stand in for the voters):

1. A newer leader confirms nothing before it has fenced this leader's current ledger.
   It takes the stream's writer lock with a larger token (``stream.writer``), records
   the token in the stream record, then recovers — fences, with
   ``open_ledger(recovery=True)`` — *every* OPEN segment before it creates its own and
   appends (``writer_core.open_steps``). This leader's current ledger was added to the
   stream record by a CAS fenced by its token, so before the newer leader's open (after
   it the CAS fails), and is marked CLOSED only after this writer switched away from it
   (``current_ledger`` never names a closing one): at the newer leader's open it was
   OPEN, so it was fenced. A roll the leader makes itself keeps this: during the roll
   both the old and the new segment are OPEN (a newer leader fences both), and a round
   asks the ledger current when it starts. An ensemble change of the leader's ledger
   is written before the writer uses it, and none can be written once a recovery has
   marked the record IN_RECOVERY: a writer with no change in flight holds the ensemble
   a recovery fences (``WriteCore.fence_probe_target``).
2. A fence is complete only when every write set's unfenced slots could not confirm
   an entry (``Quorum.covers_every_write_set``), a bookie marks the ledger fenced (in
   memory at once, journaled before it answers the fencing read; replayed on restart)
   and never unmarks it. So ``Qa`` slots of one write set answering "not fenced" to
   requests sent at ``t`` show that no fence was complete at ``t``
   (``Quorum.proves_unfenced``), hence no newer leader had confirmed a write by ``t``.
3. The index is taken after every read of the round arrived and before the requests
   are sent (``t``). Every write confirmed before a read arrived was either this
   leader's — applied before its caller was answered (``confirm``), so at or below the
   index — or an older leader's, which this leader replayed before serving (it serves
   only after applying up to the recovered, closed end of every earlier segment: the
   part Raft's rule "a committed entry of the leader's own term first" plays in etcd's
   ``committedEntryInCurrentTerm`` and Ratis' read index); by 2 none was a newer
   leader's. So the index is at or after every write confirmed before the read arrived:
   answering from state applied up to it is linearizable.

The proof, like the barrier's, needs no clock. It shares the barrier's assumptions:
fencing is durable on a bookie (a wiped disk refuses to start: cookie), and the
regions of the ack rule are the ones fencing counts (an unknown region counts for
neither). Reads that arrive while a round runs wait for the next round, so one round
serves every read that arrived before it was sent, and a read never shares a round
that started before it arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scriba.errors import CommandOutcomeUnknownError, ScribaError, TooManyRequestsError
from scriba.log import get_logger
from scriba.rsm.batching import Batch, ProposalBatcher
from scriba.rsm.config import RsmConfig
from scriba.rsm.envelope import NO_SESSION, Envelope, Kind
from scriba.rsm.read_index import ReadIndexRounds
from scriba.rsm.state import Outcome
from scriba.stream import Position, StreamWriter

log = get_logger(__name__)


@dataclass(eq=False, slots=True)
class Proposal:
    envelope: Envelope
    future: asyncio.Future[tuple[Outcome, Position]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


Confirm = Callable[["LeaderTerm", list[tuple[Proposal, Position]]], None]
Depose = Callable[["LeaderTerm", str], None]


class LeaderTerm:
    def __init__(self, token: int, writer: StreamWriter, config: RsmConfig, confirm: Confirm, depose: Depose,
                 clock_ms: int, *, on_batch: Callable[[int], object] | None = None,
                 applied: Callable[[], Position | None] | None = None) -> None:
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
        self._appends: set[asyncio.Future[list[Position]]] = set()  # record sets sent, not yet confirmed
        self._applied = applied  # the replica's applied position (the read index of a probe)
        self._read_rounds = ReadIndexRounds(self._prove_leadership)
        self.ended = False
        self.batches_sent = 0
        self.records_sent = 0
        self.probes_proven = 0  # read-index rounds proven by the fence probe
        self.probes_unproven = 0  # rounds that fell back to a barrier

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
        # its caller may be cancelled after the outcome is set and before it resumes (awaited
        # directly, ``ReplicatedStateMachine._submit``): the outcome is then nobody's to retrieve
        proposal.future.add_done_callback(_retrieve)
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
            self._open_barrier.future.add_done_callback(_retrieve)  # its readers may all have gone
            self.batcher.add(self._open_barrier, self._open_barrier.envelope.size_bytes)
            self._schedule_flush()
        return self._open_barrier.future

    async def read_index(self) -> Position | None:
        """A position at or after every write confirmed before this call, from a check
        that began after it (see the module docstring)."""
        if self.config.leader_read_check == "barrier" or self._applied is None:
            _, position = await asyncio.shield(self.barrier(int(time.time() * 1000)))
            return position
        return await self._read_rounds.read_index()

    async def _prove_leadership(self) -> Position | None:
        """One round: the index now, then the probe sent; the barrier if it proves nothing."""
        assert self._applied is not None
        if self.ended:
            raise CommandOutcomeUnknownError("leadership ended before the read's leadership check")
        index = self._applied()
        ledger = self.writer.current_ledger
        if ledger is not None and await ledger.prove_unfenced(self.config.fence_probe_timeout_s):
            self.probes_proven += 1
            return index
        self.probes_unproven += 1
        _, position = await asyncio.shield(self.barrier(int(time.time() * 1000)))
        return position

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Send every batch the batcher allows: each one record set, sent now
        (``append_many_nowait``: no task to start, no loop turn before the bookies get
        it); a batch that does not fit in the writer's queue now waits for room in a task."""
        self._flush_scheduled = False
        while not self.ended:
            batch = self.batcher.take()
            if batch is None:
                return
            if self._open_barrier is not None and self._open_barrier in batch.items:
                self._open_barrier = None  # later reads need a later barrier
            self.batches_sent += 1
            self.records_sent += len(batch.items)
            if self._on_batch is not None:
                self._on_batch(len(batch.items))
            records = [p.envelope.encode() for p in batch.items]
            try:
                appended = self.writer.append_many_nowait(records)
            except TooManyRequestsError:
                task = asyncio.get_running_loop().create_task(self._append(batch, records))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                continue
            except ScribaError as exc:
                self._depose(self, f"append failed: {type(exc).__name__}: {exc}")
                return
            self._appends.add(appended)
            appended.add_done_callback(functools.partial(self._appended, batch))

    def _appended(self, batch: Batch[Proposal], appended: asyncio.Future[list[Position]]) -> None:
        self._appends.discard(appended)
        if appended.cancelled():
            return  # the term ended
        error = appended.exception()
        if error is not None:
            self._depose(self, f"append failed: {type(error).__name__}: {error}")
            return
        self._confirmed(batch, appended.result())

    async def _append(self, batch: Batch[Proposal], records: list[bytes]) -> None:
        try:
            positions = await self.writer.append_many(records)
        except ScribaError as exc:
            self._depose(self, f"append failed: {type(exc).__name__}: {exc}")
            return
        self._confirmed(batch, positions)

    def _confirmed(self, batch: Batch[Proposal], positions: list[Position]) -> None:
        if self.ended:
            return  # deposed meanwhile: the tail applies what reached the stream
        self._confirm(self, self.batcher.confirmed(batch.batch_id, positions))
        self.flush()

    async def end(self, reason: str, *, close_writer: bool) -> None:
        """Fail what is not released, stop the appends, close (or abort) the writer."""
        if self.ended:
            return
        self.ended = True
        await self._read_rounds.close()
        error = CommandOutcomeUnknownError(
            f"leadership ended ({reason}) with the command in flight: it may or may not be applied; "
            "retry with the same session and seq"
        )
        for proposal in self.batcher.fail_all():
            if not proposal.future.done():
                proposal.future.set_exception(error)
        for appended in list(self._appends):
            appended.cancel()
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
