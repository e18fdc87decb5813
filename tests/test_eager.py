"""scriba.eager: a coroutine that need not wait finishes inside ``start_eagerly``; one that
waits goes on in a task exactly as it would in its own (results, errors, cancellation,
context)."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from scriba.eager import start_eagerly, wait_until, within

T = TypeVar("T")
VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="caller")


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))


async def outside(fn: Callable[[], T]) -> T:
    """``fn()`` from a plain loop callback, outside any task (as ``data_received`` runs)."""
    loop = asyncio.get_running_loop()
    result: asyncio.Future[T] = loop.create_future()

    def callback() -> None:
        try:
            result.set_result(fn())
        except BaseException as exc:  # handed to the awaiting test
            result.set_exception(exc)

    loop.call_soon(callback)
    return await result


def test_a_coroutine_that_need_not_wait_finishes_before_start_returns_without_a_task() -> None:
    async def main() -> None:
        done: list[str] = []

        async def quick() -> None:
            done.append("ran")

        started, seen = await outside(lambda: (start_eagerly(quick()), list(done)))
        assert started is None
        assert seen == ["ran"]  # before start_eagerly returned, without a loop turn

    run(main())


def test_inside_a_task_it_starts_an_ordinary_task() -> None:
    """The first step must not see the caller's task as its own (asyncio.timeout would
    arm against it): from inside a task the coroutine starts in a task of its own."""

    async def main() -> None:
        ran: list[str] = []

        async def quick() -> None:
            ran.append(asyncio.current_task().get_name())  # type: ignore[union-attr]

        task = start_eagerly(quick(), name="own")
        assert task is not None and ran == []
        await task
        assert ran == ["own"]

    run(main())


def test_a_coroutine_that_waits_is_continued_by_a_task_with_its_results_and_errors() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        bad: asyncio.Future[int] = loop.create_future()
        steps: list[str] = []

        async def waits(f: asyncio.Future[int]) -> int:
            steps.append("before")
            value = await f
            steps.append("after")
            await asyncio.sleep(0)  # a bare yield, as the loop's own tasks take it
            return value * 2

        task = await outside(lambda: start_eagerly(waits(fut), name="w"))
        assert task is not None and task.get_name() == "w"
        assert steps == ["before"] and not task.done()
        fut.set_result(21)
        assert await task == 42 and steps == ["before", "after"]

        failing = await outside(lambda: start_eagerly(waits(bad)))
        assert failing is not None
        bad.set_exception(ValueError("boom"))
        with pytest.raises(ValueError, match="boom"):
            await failing

    run(main())


def test_an_error_before_the_first_wait_propagates_to_the_caller() -> None:
    async def main() -> None:
        async def raises() -> None:
            raise KeyError("now")

        with pytest.raises(KeyError, match="now"):
            await outside(lambda: start_eagerly(raises()))

    run(main())


def test_cancelling_the_continuing_task_cancels_the_coroutine_at_its_await() -> None:
    async def main() -> None:
        cleaned: list[str] = []
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def waits_forever() -> None:
            try:
                await never
            except asyncio.CancelledError:
                cleaned.append("cancelled at the await")
                raise

        task = await outside(lambda: start_eagerly(waits_forever()))
        assert task is not None
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled() and never.cancelled()
        assert cleaned == ["cancelled at the await"]

    run(main())


def test_context_variables_set_by_the_coroutine_stay_its_own_across_the_wait() -> None:
    async def main() -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        seen: list[str] = []

        async def sets() -> None:
            VAR.set("coroutine")
            await fut
            seen.append(VAR.get())

        task, seen_by_caller = await outside(lambda: (start_eagerly(sets()), VAR.get()))
        assert seen_by_caller == "caller"  # the eager step ran in a copy of the caller's context
        assert task is not None
        fut.set_result(None)
        await task
        assert seen == ["coroutine"]  # the task went on in that same copy

    run(main())


def test_within_returns_the_outcome_or_at_its_deadline_cancels_the_future_outside_a_task() -> None:
    """The timer fires with no current task (an eager step), where ``asyncio.timeout`` raises."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        never: asyncio.Future[int] = loop.create_future()
        soon: asyncio.Future[int] = loop.create_future()

        async def bounded(fut: asyncio.Future[int], timeout_s: float) -> int:
            return await within(fut, timeout_s)

        timed = await outside(lambda: start_eagerly(bounded(never, 0.02)))
        assert timed is not None
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(timed, 10)
        assert never.cancelled()  # as asyncio.timeout around the await would have left it

        answered = await outside(lambda: start_eagerly(bounded(soon, 10.0)))
        assert answered is not None
        soon.set_result(7)
        assert await answered == 7

        with pytest.raises(TimeoutError):  # a deadline already past: the timer fires at the next turn
            await within(loop.create_future(), 0.0)

    run(main())


def test_within_keeps_a_cancellation_from_elsewhere_a_cancellation() -> None:
    async def main() -> None:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.get_running_loop().create_task(within(fut, 10.0))
        await asyncio.sleep(0)  # one turn: the task is now awaiting fut (not a wait on time)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert fut.cancelled()

    run(main())


def test_wait_until_returns_when_done_or_raises_at_its_timer_outside_a_task() -> None:
    async def main() -> None:
        event = asyncio.Event()
        state = {"n": 0}

        async def waits(timeout_s: float) -> None:
            await wait_until(event, lambda: state["n"] >= 2, timeout_s)

        finishing = await outside(lambda: start_eagerly(waits(10.0)))
        assert finishing is not None
        for _ in range(2):
            await asyncio.sleep(0)  # one turn: the waiter is parked on the event again (not a wait on time)
            state["n"] += 1
            event.set()
        await asyncio.wait_for(finishing, 10)

        state["n"] = 0
        expiring = await outside(lambda: start_eagerly(waits(0.02)))
        assert expiring is not None
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(expiring, 10)
        state["n"] = 5
        assert await outside(lambda: start_eagerly(waits(0.0))) is None  # already done: no wait, no task

    run(main())
