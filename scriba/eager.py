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

Deadlines without a task. :func:`within` and :func:`wait_until` bound a wait with a
``loop.call_later`` timer instead of ``asyncio.timeout``, so code that may run in an eager
first step can keep its deadline. ``within(future, s)`` awaits ``future`` itself (no helper
future, no extra loop turn when it resolves) and at the deadline cancels it, as
``asyncio.timeout`` around the same ``await`` would (the task's cancellation reaches the
awaited future), raising ``TimeoutError``; a future already resolved when the timer fires
keeps its outcome. ``wait_until(event, done, s)`` waits for ``done()`` re-checked at
each ``event.set()``; the timer sets the event one last time.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine, Generator
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


async def within(future: asyncio.Future[T], timeout_s: float) -> T:
    """``await future``, but past ``timeout_s`` cancel it and raise ``TimeoutError`` (module
    docstring); needs no current task. A cancellation from elsewhere stays a cancellation."""
    expiry = _Expiry(future)
    timer = asyncio.get_running_loop().call_later(max(timeout_s, 0.0), expiry.fire)
    try:
        return await future
    except asyncio.CancelledError:
        if expiry.fired:
            raise TimeoutError from None
        raise
    finally:
        timer.cancel()


class _Expiry:
    __slots__ = ("_future", "fired")

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self._future = future
        self.fired = False

    def fire(self) -> None:
        if not self._future.done():
            self.fired = True
            self._future.cancel()


async def wait_until(event: asyncio.Event, done: Callable[[], bool], timeout_s: float) -> None:
    """Until ``done()`` is true, re-checked whenever ``event`` is set (an exception from
    ``done`` propagates); ``TimeoutError`` after ``timeout_s``. Needs no current task."""
    if done():
        return
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        event.set()

    timer = asyncio.get_running_loop().call_later(max(timeout_s, 0.0), expire)
    try:
        while True:
            event.clear()
            await event.wait()
            if done():
                return
            if expired:
                raise TimeoutError
    finally:
        timer.cancel()
