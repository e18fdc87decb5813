"""Read-index rounds: one leadership confirmation shared by every read waiting for one.

A linearizable read needs a *read index* — a position at or after every write confirmed
before the read arrived — obtained by a leadership confirmation that **started after the
read arrived** (Raft's ReadIndex, hashicorp/raft's ``VerifyLeader``, Ratis' read index).
Confirmations cost a round trip (on the leader a fence probe to its ledger's bookies, or
a barrier append to the ack quorum; on a follower a round trip to the leader, which
makes one), so reads share them:

- reads that arrive while no round runs start one at once and share it;
- reads that arrive while a round runs wait in the *next* group and share the round
  started when the current one ends — never the running one, which began before they
  arrived and so proves nothing about writes confirmed after it began.

The leader runs these rounds around its fence probe (``LeaderTerm.read_index``; in
``"barrier"`` mode reads join instead the barrier not yet handed to the batcher,
``LeaderTerm.barrier``); a follower runs them around its ``READ_INDEX`` call to the leader. One round in flight at a time, so the waiting
group is bounded by the reads the replica accepts (``connections_max`` connections, each its frames).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from scriba.errors import ReplicaStoppedError
from scriba.stream import Position

Confirm = Callable[[], Awaitable[Position | None]]


def _retrieve(future: asyncio.Future[Position | None]) -> None:
    """Mark a round's outcome seen: its readers may all have gone (timed out) meanwhile."""
    if not future.cancelled():
        future.exception()


class ReadIndexRounds:
    def __init__(self, confirm: Confirm) -> None:
        self._confirm = confirm
        self._next: asyncio.Future[Position | None] | None = None  # the group waiting for a round
        self._running = False
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.rounds = 0  # rounds started (a figure for tests and metrics)

    async def read_index(self) -> Position | None:
        """A read index from a confirmation that started after this call."""
        group = self._next
        if group is None:
            group = self._next = asyncio.get_running_loop().create_future()
            group.add_done_callback(_retrieve)
            if not self._running:
                self._start()
        return await asyncio.shield(group)

    def _start(self) -> None:
        """Start a round for the waiting group; reads arriving until the round's task first
        runs still join the group (the confirmation has not started yet)."""
        group = self._next
        assert group is not None
        if self._closed:
            self._next = None
            group.set_exception(ReplicaStoppedError("the replica stopped before its read index round"))
            return
        self._running = True
        self.rounds += 1
        task = asyncio.get_running_loop().create_task(self._round(group))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _round(self, group: asyncio.Future[Position | None]) -> None:
        if self._next is group:
            self._next = None  # from here on, arriving reads wait for the next round
        try:
            index = await self._confirm()
        except Exception as exc:  # ScribaError, or a bug: the group must not hang either way
            if not group.done():
                group.set_exception(exc)
        except asyncio.CancelledError:
            if not group.done():
                group.set_exception(ReplicaStoppedError("read index round cancelled (the replica stops)"))
            raise
        else:
            if not group.done():
                group.set_result(index)
        finally:
            self._running = False
            if self._next is not None:
                self._start()

    async def close(self) -> None:
        """Cancel the running round (its readers get ``ReplicaStoppedError``); start no more."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
