"""Start a coroutine now, in the caller's turn of the loop; make a task of it only if it waits.

Theory of operation. ``loop.create_task(coro)`` does not run ``coro``: it schedules the
task's first step with ``call_soon``, so the coroutine starts in the next turn of the
loop, after an ``epoll_wait`` and a pass over every other ready callback. A request
that needs nothing it must wait for (a bookie's add answered by the journal's idle
path, which syncs and settles before ``submit`` returns; a long poll whose entry is
already there) then costs a task, a scheduled callback and a whole loop turn more than
the work itself. Python 3.12 answers this with ``asyncio.eager_task_factory``; Scriba
runs on 3.11, so :func:`start_eagerly` does it for one call:

- It runs the coroutine's first step at once, in a copy of the caller's context (as a
  task would: context variables it sets stay its own).
- If the coroutine returns, there is no task at all and ``start_eagerly`` returns None;
  if it raises, the exception propagates to the caller, as from a function call.
- If it yields (it awaits something not yet done), a task takes it over from that very
  point, in the same context: the task's first step hands the task exactly what the
  coroutine yielded (the future it waits on, or None for a bare yield), and from then on
  the task drives the coroutine: results and exceptions (a cancellation too) reach
  the coroutine at its ``await`` exactly as they would in a task of its own.

What differs from a task started the usual way: code in the eager first step runs with
no current task, so ``asyncio.timeout`` there raises ``RuntimeError`` (use a
``call_later`` timer on the future awaited instead); and it runs before
``start_eagerly`` returns, so the caller must be ready for its effects (a reply written,
a connection closed) by then. It is for callers outside any task (a protocol's
``data_received``): called from inside a task, whose ``current_task()`` the first step
would see as its own (``asyncio.timeout`` would then arm against the wrong task), it
starts an ordinary task instead.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")


def start_eagerly(coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T] | None:
    """Run ``coro`` until it first waits; None if it finished, else the task that goes on
    with it (module docstring). Must be called with a running loop, outside a task."""
    if asyncio.current_task() is not None:
        return asyncio.get_running_loop().create_task(coro, name=name)
    context = contextvars.copy_context()
    try:
        pending = context.run(coro.send, None)
    except StopIteration:
        return None
    return asyncio.get_running_loop().create_task(_Continued(coro, pending).run(), name=name, context=context)


class _Continued:
    """A coroutine that already took its first step, and what that step yielded."""

    __slots__ = ("_coro", "_pending")

    def __init__(self, coro: Coroutine[Any, Any, Any], pending: Any) -> None:
        self._coro = coro
        self._pending = pending

    async def run(self) -> Any:
        return await self

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, pending = self._coro, self._pending
        self._pending = None
        while True:
            try:
                sent = yield pending  # the task waits for it, as it would in coro's own task
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation or a thrown error goes on into coro
                try:
                    pending = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    pending = coro.send(sent)
                except StopIteration as stop:
                    return stop.value
