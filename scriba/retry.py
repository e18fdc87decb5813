"""Bounded retries, on tenacity: the one retry policy Scriba's call sites share.

A failed call is tried again only if ``retry_if(error)`` says so — by default the
error tree's flag (``ScribaError.retriable``), so retry policy follows the error, not
the call site. A call site narrows the rule where the flag is not enough (a write
whose outcome is unknown must not be sent twice) or widens it where its loop re-reads
before the next try (a compare-and-set that lost its race).

Every retry has two bounds:

- at most ``attempts_max`` attempts in all;
- never past the caller's ``deadline`` (on ``clock.monotonic()``): an attempt is not
  started if the sleep before it would end at or after the deadline.

Sleeps back off exponentially with "equal jitter": before attempt n+1 the window is
``w = min(delay_s_max, delay_s_min * 2**(n-1))`` and the sleep is drawn uniformly from
``[w/2, w]``. Callers that failed together spread out, and ``attempts_max`` attempts
still cover at least half the planned backoff.

When the retries stop, the last error is raised unchanged, so callers see the same
exception types with or without a policy. The first attempt runs outside tenacity:
a call that succeeds at once costs one ``await`` more, nothing else.

Clock, sleep and random source are parameters, so tests do not sleep and simulations
run the policy on their own clock.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from scriba.clock import Clock, SystemClock
from scriba.config import require
from scriba.errors import ScribaError
from scriba.log import get_logger

log = get_logger(__name__)

T = TypeVar("T")

RetryHook = Callable[[int, BaseException, float], None]
"""``on_retry(failed_attempt, error, delay_s)``: called before each sleep."""

_SYSTEM_CLOCK = SystemClock()


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently to retry (see the module docstring)."""

    attempts_max: int = 5
    delay_s_min: float = 0.05  # the first backoff window
    delay_s_max: float = 1.0  # the widest backoff window

    def validate(self) -> RetryPolicy:
        require(self.attempts_max >= 1, "attempts_max", "must be >= 1")
        require(self.delay_s_min >= 0, "delay_s_min", "must be >= 0")
        require(self.delay_s_max >= self.delay_s_min, "delay_s_max", "must be >= delay_s_min")
        return self

    def window_s(self, failed_attempt: int) -> float:
        """The backoff window after attempt ``failed_attempt`` (1-based) failed."""
        return float(min(self.delay_s_max, self.delay_s_min * 2 ** min(failed_attempt - 1, 62)))


def is_retriable(error: BaseException) -> bool:
    """The error tree's rule: a ``ScribaError`` whose class says trying again may succeed."""
    return isinstance(error, ScribaError) and error.retriable


class _EqualJitter(wait_base):
    def __init__(self, policy: RetryPolicy, rng: random.Random | None) -> None:
        self._policy = policy
        self._uniform = (rng or random.Random()).uniform

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        window = self._policy.window_s(retry_state.attempt_number)
        return self._uniform(window / 2, window)


class _StopAtDeadline(stop_base):
    """Stop when the coming sleep would end at or past the deadline."""

    def __init__(self, deadline: float, clock: Clock) -> None:
        self._deadline = deadline
        self._clock = clock

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self._clock.monotonic() + retry_state.upcoming_sleep >= self._deadline


def _log_retry(what: str) -> RetryHook:
    def hook(attempt: int, error: BaseException, delay_s: float) -> None:
        log.debug("call_retry", what=what, attempt=attempt, delay_ms=round(delay_s * 1000, 1), error=str(error))

    return hook


async def retry_async(
    call: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    what: str,
    deadline: float | None = None,
    retry_if: Callable[[BaseException], bool] = is_retriable,
    clock: Clock | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rng: random.Random | None = None,
    on_retry: RetryHook | None = None,
) -> T:
    """``await call()``, retried under ``policy`` until it succeeds or a bound is reached.

    ``call`` is a fresh attempt each time (a coroutine function, not a coroutine).
    Raises ``call``'s last error when it is not retriable, after ``attempts_max``
    attempts, or when the deadline leaves no room for another attempt.
    ``CancelledError`` is never retried.
    """
    try:
        return await call()
    except Exception as exc:
        if policy.attempts_max <= 1 or not retry_if(exc):
            raise
        first_error: list[BaseException] = [exc]

    async def attempt() -> T:
        if first_error:  # attempt 1 already ran above: let tenacity count it and back off
            raise first_error.pop()
        return await call()

    stop: stop_base = tenacity.stop_after_attempt(policy.attempts_max)
    if deadline is not None:
        stop = stop | _StopAtDeadline(deadline, clock or _SYSTEM_CLOCK)
    hook = on_retry or _log_retry(what)

    def before_sleep(state: tenacity.RetryCallState) -> None:
        if state.outcome is not None and (error := state.outcome.exception()) is not None:
            hook(state.attempt_number, error, state.upcoming_sleep)

    retrying = tenacity.AsyncRetrying(
        stop=stop,
        wait=_EqualJitter(policy, rng),
        retry=tenacity.retry_if_exception(lambda e: isinstance(e, Exception) and retry_if(e)),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    result: T = await retrying(attempt)
    return result
