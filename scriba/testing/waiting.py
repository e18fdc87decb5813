"""Waiting on a condition with a deadline: the only way tests synchronise with time.

A test that needs "the server has received the adds" or "the bookie is read-only now"
polls the condition with :func:`eventually` instead of sleeping for a guessed while: it
returns as soon as the condition holds (fast on a quiet machine) and fails with a message
naming what did not happen after ``timeout_s`` (robust on a loaded one).

Synchronous code (a test driving child processes from a thread, no event loop) uses
:func:`wait_until`, the same poll-until-deadline loop kept next to the process launcher
that needs it too (``scriba.embedded.process``) and re-exported here, so that tests import
both waits from one place.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar, overload

from scriba.embedded.process import wait_until
from scriba.errors import DeadlineExceededError

__all__ = ["INTERVAL_S_DEFAULT", "eventually", "wait_until"]

INTERVAL_S_DEFAULT: Final = 0.01
T = TypeVar("T")


@overload
async def eventually(condition: Callable[[], Awaitable[T]], timeout_s: float = ..., *, what: str = ...,
                     interval_s: float = ...) -> T: ...
@overload
async def eventually(condition: Callable[[], T], timeout_s: float = ..., *, what: str = ...,
                     interval_s: float = ...) -> T: ...
async def eventually(
    condition: Callable[[], Any],
    timeout_s: float = 10.0,
    *,
    what: str = "condition",
    interval_s: float = INTERVAL_S_DEFAULT,
) -> Any:
    """Return ``condition()``'s first true value (it may be a coroutine function); raise
    ``DeadlineExceededError``, naming ``what`` and the last value, after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return held
        if loop.time() >= deadline:
            raise DeadlineExceededError(f"{what} did not hold within {timeout_s:.1f} s (last: {held!r})")
        await asyncio.sleep(interval_s)
