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
from collections.abc import Awaitable, Callable
from typing import Final

from scriba.embedded.process import wait_until
from scriba.errors import DeadlineExceededError

__all__ = ["INTERVAL_S_DEFAULT", "eventually", "wait_until"]

INTERVAL_S_DEFAULT: Final = 0.01


async def eventually(
    condition: Callable[[], bool | Awaitable[bool]],
    timeout_s: float = 10.0,
    *,
    what: str = "condition",
    interval_s: float = INTERVAL_S_DEFAULT,
) -> None:
    """Return once ``condition()`` is true (it may be a coroutine function); raise after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        held = condition()
        if not isinstance(held, bool):
            held = await held
        if held:
            return
        if loop.time() >= deadline:
            raise DeadlineExceededError(f"{what} did not hold within {timeout_s:.1f} s")
        await asyncio.sleep(interval_s)
