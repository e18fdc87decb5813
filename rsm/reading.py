"""Reads on a replica: ``linearizable``, ``sequential`` and ``after`` — the part of
``ReplicatedStateMachine`` that answers queries (a mixin; its methods run on the replica).

A ``linearizable`` read needs a read index from a leadership confirmation that started
after it arrived (``read_index``): on the leader ``LeaderTerm.read_index`` — by default a
round of plain LAC reads asking the leader's ledger's bookies whether it is fenced (no
fsync; ``Qa`` "not fenced" answers of one write set prove that no newer leader had
confirmed anything when they were sent), falling back to a barrier append; with
``leader_read_check="barrier"`` always the barrier append not yet sent — shared by every
read waiting at that moment (the argument is in ``scriba.rsm.term``); on a follower a
``READ_INDEX`` round trip to the leader, shared the same way (``ReadIndexRounds``). The read is answered once the replica has applied up to the
index. ``read_many`` answers a frame of reads (``wire.Op.READ_MANY``) on one read index;
each read gets its own result or error. ``sequential`` answers from local state;
``after`` waits until the given position is applied.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from scriba.errors import BadConsistencyError, DeadlineExceededError, ScribaError, StateMachineError
from scriba.rsm import wire
from scriba.rsm.config import CONSISTENCY_LEVELS
from scriba.stream import Position

if TYPE_CHECKING:
    from scriba.rsm.replica import ReplicatedStateMachine


class Reading:
    async def read(self: ReplicatedStateMachine, request: bytes, consistency: str = "linearizable", *,  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
                   after: Position | str | None = None) -> bytes:
        if consistency not in CONSISTENCY_LEVELS:
            raise BadConsistencyError(f"consistency {consistency!r}: one of {', '.join(CONSISTENCY_LEVELS)}")
        self._check_running()
        index = await self._linearizable_index() if consistency == "linearizable" else None
        return await self._answer_read(request, consistency, after, index)

    async def read_many(self: ReplicatedStateMachine, reads: list[tuple[str, Position | None, bytes]]  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
                        ) -> list[tuple[bool, bytes]]:
        """Answer several reads on one read index; per read its result or its error body.

        A failed leadership confirmation, or the index not applied in time, fails the whole
        call (every read may be sent elsewhere); a read's own failure (its query raised, its
        ``after`` position was not reached in time) is its answer.
        """
        self._check_running()
        linearizable = any(consistency == "linearizable" for consistency, _, _ in reads)
        index = await self._linearizable_index() if linearizable else None
        if index is not None:
            await self._wait_applied(index, self.config.read_timeout_s)
        answers: list[tuple[bool, bytes]] = []
        for consistency, after, request in reads:
            try:
                if consistency == "after":
                    answers.append((True, await self._answer_read(request, consistency, after, None)))
                else:  # linearizable (applied up to the index above) or sequential
                    answers.append((True, self._query(request)))
            except ScribaError as exc:
                answers.append((False, wire.error_body(exc)))
        return answers

    async def _linearizable_index(self: ReplicatedStateMachine) -> Position | None:  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
        if self.config.unsafe_local_linearizable_reads:
            return None  # the negative control: no leadership confirmation
        return await self.read_index(forwarded=False)

    async def _answer_read(self: ReplicatedStateMachine, request: bytes, consistency: str,  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
                           after: Position | str | None, index: Position | None) -> bytes:
        if consistency == "after":
            if after is None:
                raise BadConsistencyError('consistency "after" needs after=<position> (e.g. a session\'s '
                                          "last_position)")
            await self._wait_applied(Position.parse(after), self.config.read_timeout_s)
        elif consistency == "linearizable" and index is not None:
            await self._wait_applied(index, self.config.read_timeout_s)
        return self._query(request)

    def _query(self: ReplicatedStateMachine, request: bytes) -> bytes:  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
        try:
            return bytes(self.state.machine.query(request))
        except Exception as exc:
            raise StateMachineError(f"state machine query raised: {type(exc).__name__}: {exc}") from exc

    async def read_index(self: ReplicatedStateMachine, *, forwarded: bool) -> Position | None:  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
        """A position every write confirmed before this call is at or below, from a
        leadership confirmation that started after this call."""
        term = self._term
        if term is not None and self.role.accepts(term.token):
            try:
                return await asyncio.wait_for(term.read_index(), self.config.read_timeout_s)
            except TimeoutError:
                raise DeadlineExceededError(f"leadership not confirmed within {self.config.read_timeout_s} s") from None
        if forwarded:
            raise self._not_leader()
        return await self._follower_rounds.read_index()

    async def _leader_read_index(self: ReplicatedStateMachine) -> Position | None:  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
        """One follower round: ask the leader for a read index (``READ_INDEX``)."""
        leader = self._leader
        if leader is None or not leader[1] or leader[0] == self.replica_id:
            raise self._not_leader()
        answer = await self._peers.get(leader[1]).call(wire.Op.READ_INDEX, b"", self.config.read_timeout_s,
                                                       wire.FORWARDED)
        return wire.parse_position(answer)
