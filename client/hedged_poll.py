"""``HedgedPoll``: one long poll of a tail, waiting at one or more replicas, built from callbacks.

Theory of operation. A tailing reader (``LedgerReader.tail``) waits for entry
``previous_lac + 1`` at one or two bookies of its write set at once and takes the first
answer that carries it. Built from coroutines, that cost a task per poll, a task per
replica, an ``asyncio.wait`` and an ``asyncio.timeout`` per replica, and four loop turns
between a bookie's answer and the tail: per entry delivered. Here the poll is one future
and nothing else that waits:

- ``bookies()`` names the replicas, asked when the polls are sent (a failure noticed
  meanwhile already moves them); ``start(bookie_id, on_answer)`` issues the poll to each,
  in that order (the
  reader passes ``long_poll_lac_soon``: over an open binary link the request goes out at
  once and its answer is handled in the link's dispatch) and returns how to withdraw it.
  The polls are started in the next loop turn after the poll is made, as the task-built
  poll's replica tasks chose their bookies: a tail arms its next poll before it delivers
  the entry just answered, and a consumer in the tail's task then gets that entry before
  the sends (each wakes a bookie's process, which may take the CPU from it);
- each answer comes to ``_answer``: one with an LAC past ``previous_lac`` that carries
  entries wins (the poll resolves with it, every other replica's poll is withdrawn);
  another is kept if its LAC is the highest so far; an error of the transport
  (``ScribaError``) or a deadline counts as that bookie failing (``on_failed``, which
  moves the reader's polls to the next replica) and the others go on; any other error
  is a bug and fails the poll with it;
- once every replica has answered or failed, the poll resolves with the highest answer
  kept (the entry not yet stored there, or the bookie's wait over), None if all failed;
- one ``call_later`` timer is the deadline of the whole poll (``deadline_s``): each
  replica still waiting then fails with ``TimeoutError`` and the poll resolves as above;
- cancelling the poll (the reader dropping it, or the task awaiting it being
  cancelled: the task cancels the future it waits on) withdraws every replica's poll
  and the timer.

The poll *is* the future the caller awaits (a ``Future`` subclass whose ``cancel``
withdraws), so a cancelled caller ends its polls with no done-callback and no task.
Nothing here does I/O: the transport is behind ``start``, the clock behind the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from functools import partial

from scriba.client.transport import LacAnswer, LacResult, Withdraw
from scriba.errors import ScribaError
from scriba.ids import BookieId, EntryId

__all__ = ["HedgedPoll", "PollFailed", "PollStart"]

PollStart = Callable[[BookieId, LacAnswer], Withdraw]
"""Issues one bookie's long poll; the answer goes to the callback (``long_poll_lac_soon``)."""
PollFailed = Callable[[BookieId, BaseException], None]
"""Told of a bookie whose poll failed (a transport error or the poll's deadline)."""


class HedgedPoll(asyncio.Future[LacResult | None]):
    """A long poll for the entry after ``previous_lac`` at ``bookies()`` (module docstring)."""

    __slots__ = ("_best", "_on_failed", "_previous", "_timer", "_waiting")

    def __init__(
        self,
        bookies: Callable[[], Sequence[BookieId]],
        previous_lac: EntryId,
        start: PollStart,
        on_failed: PollFailed,
        deadline_s: float,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        loop = loop or asyncio.get_running_loop()
        super().__init__(loop=loop)
        self._previous = previous_lac
        self._on_failed = on_failed
        self._best: LacResult | None = None
        self._timer: asyncio.TimerHandle | None = loop.call_later(deadline_s, self._deadline)
        self._waiting: dict[BookieId, Withdraw] = {}
        loop.call_soon(self._start, bookies, start)  # a turn on (module docstring)

    def _start(self, bookies: Callable[[], Sequence[BookieId]], start: PollStart) -> None:
        if self.done():
            return  # cancelled before it was sent
        self._waiting = dict.fromkeys(bookies(), _not_yet)  # all of them, before any answers
        if not self._waiting:
            self._finish(None)  # no replica to ask: as if every one failed
            return
        for bookie_id in list(self._waiting):
            if self.done():
                return  # over already
            try:
                withdraw = start(bookie_id, partial(self._answer, bookie_id))
            except ScribaError as exc:  # could not even be sent: that bookie failed
                self._answer(bookie_id, exc)
                continue
            if bookie_id in self._waiting:
                self._waiting[bookie_id] = withdraw

    @property
    def waiting(self) -> list[BookieId]:
        """The bookies whose answer the poll still waits for."""
        return list(self._waiting)

    def cancel(self, msg: object = None) -> bool:
        """Cancel the poll: every replica's poll and the deadline are withdrawn."""
        if not super().cancel(msg):
            return False
        self._withdraw_all()
        return True

    def _answer(self, bookie_id: BookieId, answer: LacResult | BaseException) -> None:
        if self._waiting.pop(bookie_id, None) is None or self.done():
            return  # withdrawn, or the poll is over
        try:
            if isinstance(answer, LacResult):
                if answer.lac > self._previous and answer.piggybacked_entries:
                    self._finish(answer)
                    return
                if self._best is None or answer.lac > self._best.lac:
                    self._best = answer
            elif isinstance(answer, ScribaError | TimeoutError):
                self._on_failed(bookie_id, answer)
            else:
                self._fail(answer)
                return
            if not self._waiting:
                self._finish(self._best)
        except Exception as exc:  # (a bug in on_failed): the caller sees it, the link does not
            self._fail(exc)

    def _deadline(self) -> None:
        self._timer = None
        if self.done():
            return
        late, self._waiting = self._waiting, {}
        try:
            for bookie_id, withdraw in late.items():
                withdraw()
                self._on_failed(bookie_id, TimeoutError("no answer to the long poll within its deadline"))
        except Exception as exc:
            self._fail(exc)
            return
        self._finish(self._best)

    def _finish(self, result: LacResult | None) -> None:
        self._withdraw_all()
        self.set_result(result)

    def _fail(self, error: BaseException) -> None:
        self._withdraw_all()
        if not self.done():
            self.set_exception(error)

    def _withdraw_all(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting, self._waiting = self._waiting, {}
        for withdraw in waiting.values():
            withdraw()


def _not_yet() -> None:
    """A poll being started (``start`` has not returned): nothing to withdraw yet."""
