"""Leading: the election campaign, a term's start (open the writer, catch up, serve), the
leader watch and leadership transfer — the part of ``ReplicatedStateMachine`` that wins,
holds and hands over leadership (a mixin; its methods run on the replica).

A won election makes the role core say ``OpenWriter``: the replica opens the stream's
writer (fencing the previous leader's segment), finds the last record before its own
segment, lets the tail apply up to it, and only then serves. The term ends at the first
of: leadership lost, a deposing effect, a transfer. A pending transfer to another
replica keeps this one out of the campaign until the transfer's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import TYPE_CHECKING

from scriba.eager import wait_until
from scriba.errors import (
    DeadlineExceededError,
    NoSuchKeyError,
    ReplicaNotFoundError,
    ReplicaStoppedError,
    ScribaError,
    StateMachineError,
)
from scriba.meta.election import Leadership
from scriba.rsm import membership as mb
from scriba.rsm.role import Role
from scriba.rsm.term import LeaderTerm, Proposal
from scriba.stream import Position, WriterOptions

if TYPE_CHECKING:
    from scriba.rsm.replica import ReplicatedStateMachine


class Leading:
    _leadership: Leadership | None

    async def _campaign_loop(self: ReplicatedStateMachine) -> None:  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
        claim = mb.LeaderClaim(self.replica_id, self.address).to_bytes()
        while self._stopped is None:
            try:
                if self.role.role is not Role.FOLLOWER or await self._transfer_blocks():
                    await asyncio.sleep(self.config.campaign_backoff_s)
                    continue
                leadership = await self._election.campaign(self.replica_id, claim)
            except ScribaError as exc:
                # The store out of reach past a call's deadline or the campaign's retries (a cut that
                # outlasts them): try again. Ending here would leave this replica out of every later
                # election without a word, and a group whose replicas were all cut once leaderless.
                self._log.warning("rsm_campaign_retry", error=str(exc))
                await asyncio.sleep(self.config.campaign_backoff_s)
                continue
            try:
                blocked = await self._transfer_blocks()
            except ScribaError as exc:
                self._log.warning("rsm_campaign_retry", error=str(exc))
                blocked = True  # cannot tell: hand the election back rather than lead past a transfer
            if blocked:
                with contextlib.suppress(ScribaError):
                    await self._election.resign()
                await asyncio.sleep(self.config.campaign_backoff_s)
                continue
            try:
                await self._lead(leadership)
            except (StateMachineError, ReplicaStoppedError):
                return
            except ScribaError as exc:
                self._log.warning("rsm_term_failed", error=str(exc))
                self._run(self.role.deposed(leadership.token, str(exc)))
                with contextlib.suppress(ScribaError):
                    await self._election.resign()
            await asyncio.sleep(self.config.campaign_backoff_s)

    async def _transfer_blocks(self: ReplicatedStateMachine) -> bool:  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
        """A leadership transfer to another replica is pending: do not campaign."""
        try:
            doc = json.loads((await self.client.store.get(mb.transfer_key(self.group))).value)
        except (NoSuchKeyError, ValueError):
            return False
        return bool(doc.get("target") != self.replica_id and doc.get("deadline_ms", 0) > time.time() * 1000)

    async def _lead(self: ReplicatedStateMachine, leadership: Leadership) -> None:  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
        assert self._ns is not None
        token = leadership.token
        self._leadership = leadership
        self._run(self.role.elected(token))
        writer = await self._ns.open_writer(
            self.name, options=WriterOptions(lock_timeout_s=self.config.writer_lock_timeout_s,
                                             lac_push_delay_s=self.config.lac_push_delay_s)
        )
        if leadership.lost.is_set() or self.role.token != token:
            await writer.abort()
            self._run(self.role.deposed(token, "leadership lost while opening the writer"))
            return
        term = LeaderTerm(token, writer, self.config, self._confirm, self._depose, self.state.clock_ms,
                          on_batch=self.metrics.batch_records.observe, applied=lambda: self.state.applied)
        self._term = term
        end = await self._stream_end(writer.segment_seq)
        self._run(self.role.writer_opened(token, end))
        self._log.info("rsm_writer_opened", token=token, writer_token=writer.token, end=str(end))
        while self.role.role is Role.CATCHING_UP and self.role.token == token and not leadership.lost.is_set():
            self._changed.clear()
            await self._changed.wait()
        if self.role.accepts(token):
            self._log.info("rsm_leading", token=token, applied=str(self.state.applied))
            await mb.update_member(self.client.store, self.group, self._member())
            await self._clear_transfer()
        lost = self._spawn(leadership.lost.wait())
        while self.role.accepts(token) and not lost.done():
            self._role_moved.clear()
            await asyncio.wait({lost, self._spawn(self._role_moved.wait())}, return_when=asyncio.FIRST_COMPLETED)
        if lost.done():
            self._run(self.role.deposed(token, f"leadership lost ({leadership.reason})"))
        lost.cancel()

    async def _stream_end(self: ReplicatedStateMachine, own_seq: int) -> Position | None:  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
        """The last record before the writer's first segment (None: there is none)."""
        assert self._ns is not None
        info = await self._ns.info(self.name)
        ends = [s.last_position for s in info.record.segments if s.seq < own_seq and s.last_position is not None]
        truncated = info.record.truncated_before
        if truncated > Position(0, 0, 0) and (self.state.applied is None or self.state.applied < truncated):
            if not ends:
                await self._restore_newer()
        return max(ends) if ends else None

    def _confirm(self: ReplicatedStateMachine, term: LeaderTerm, ready: list[tuple[Proposal, Position]]) -> None:  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
        for proposal, position in ready:
            if not self.role.accepts(term.token):
                return  # term.end fails the rest
            try:
                outcome = self._apply(position, proposal.envelope)
            except ScribaError as exc:
                if not proposal.future.done():
                    proposal.future.set_exception(exc)
                return
            if not proposal.future.done():
                proposal.future.set_result((outcome, position))

    async def _clear_transfer(self: ReplicatedStateMachine) -> None:  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
        key = mb.transfer_key(self.group)
        with contextlib.suppress(NoSuchKeyError, ScribaError):
            record = await self.client.store.get(key)
            if json.loads(record.value).get("target") == self.replica_id:
                await self.client.store.delete(key, expected_version=record.version)

    async def _watch_leader(self: ReplicatedStateMachine) -> None:  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
        while self._stopped is None:
            try:
                async for current in self._election.observe():
                    if current is None:
                        self._leader = None
                        continue
                    address = ""
                    with contextlib.suppress(NoSuchKeyError):
                        raw = await self.client.store.get(mb.member_key(self.group, current[0]))
                        address = mb.Member.from_bytes(raw.value).address
                    self._leader = (current[0], address)
                    self._changed.set()
            except ScribaError as exc:
                self._log.info("rsm_leader_watch_failed", error=str(exc))
            await asyncio.sleep(self.config.campaign_backoff_s)


    async def transfer_leadership(self: ReplicatedStateMachine, replica_id: str) -> None:  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
        """Hand leadership to ``replica_id`` (the old leader stops proposing; the target catches up)."""
        self._check_running()
        if replica_id == self.replica_id and self.is_leader:
            return
        term = self._term
        if term is None or not self.role.accepts(term.token):
            raise self._not_leader()
        if replica_id not in {m.replica_id for m in await self.members()}:
            raise ReplicaNotFoundError(f"no live replica {replica_id!r} of {self.namespace}/{self.name}")
        doc = {"target": replica_id, "deadline_ms": int(time.time() * 1000 + self.config.transfer_timeout_s * 1000)}
        key = mb.transfer_key(self.group)
        with contextlib.suppress(NoSuchKeyError):
            await self.client.store.delete(key)
        await self.client.store.create(key, json.dumps(doc).encode())
        self._depose(term, f"leadership transferred to {replica_id}")
        try:  # a timer, not asyncio.timeout: requests start eagerly, outside a task (peer)
            await wait_until(self._changed, lambda: self._leader is not None and self._leader[0] == replica_id,
                             self.config.transfer_timeout_s)
        except TimeoutError:
            raise DeadlineExceededError(f"{replica_id} did not take over within {self.config.transfer_timeout_s} s")\
                from None

