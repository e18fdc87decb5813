"""A process's start-up metadata steps (connect, cookie check, registration, ...), retried
within a bound: shared by the bookie, the autorecovery process and the RSM replicas.

Why: a process starved of CPU while it starts (a loaded machine) misses its metadata
session's heartbeats. ZooKeeper's client drops the connection ("outstanding heartbeat
ping not received") and the next request fails with ConnectionLoss; etcd's lease expires
before a registration is written; a connect finds the store not answering yet. Those
failures mean "not now", not "never": like BookKeeper's bookie, which retries its
registration within its session timeout, a step that fails that way is tried again until
it succeeds or a bound is reached.

Rule (:func:`start_verdict`, no I/O):

- ``RETRY``: the store could not be reached or did not answer in time (an error whose
  class is ``retriable``, e.g. ``MetadataUnavailableError``, and asyncio's ``TimeoutError``
  from a step's own deadline): back off (jittered, ``scriba.retry``) and try again.
- ``RENEW``: the session is gone (``SessionExpiredError``: ZooKeeper session expired,
  etcd lease lost). The driver opens a new session by itself; the next attempt waits
  until the session is CONNECTED again (within the bound), then tries.
- ``FAIL``: anything else (``CookieMismatchError``, ``ConfigError``, ``UnauthorizedError``,
  ``StorageError``, ``BadRequestError``, ...): raised at once, unchanged.

Bound: each step keeps trying for ``timeout_s`` from its first attempt (the bookie's
``BookieConfig.metadata_start_timeout_s``, the autorecovery process's and the RSM
replica's ``start_timeout_s``); an attempt started before the bound runs to its own
deadline. Then :class:`~scriba.errors.MetadataUnavailableError` says whose step, which,
for how long, after how many attempts, and the last cause (chained as ``__cause__``).
Every retry is logged (the caller's event, e.g. ``bookie_start_retry``, with its fields
and ``step``, ``attempt``, ``delay_ms``, ``error``).

A step given to this must be safe to repeat. The callers' steps are: a connect opens a
new store (a failed open closes what it opened); the bookie's cookie check's decision
table (``bookie/cookie.py``) accepts the cookie an earlier attempt wrote; its
registration recognises a record its own session created before an answer was lost, by
the record's owner (``bookie/registration.py``), so nothing registers twice; the
autorecovery process's client connect closes what a failed attempt opened.

A start that is still retrying must not outlive the SIGTERM a supervisor sends:
:func:`start_unless_stopped` gives it up (cancels it; it closes what it opened) when the
process's stop event is set first, and raises :class:`StartAbandoned` so the process can
exit 0.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Mapping
from typing import Final, TypeVar

from scriba.clock import Clock, SystemClock
from scriba.errors import MetadataUnavailableError, SessionExpiredError
from scriba.log import get_logger
from scriba.meta.session import wait_connected
from scriba.meta.store import Session
from scriba.retry import RetryPolicy, is_retriable, retry_async

log = get_logger(__name__)

T = TypeVar("T")

START_RETRY: Final = RetryPolicy(attempts_max=10_000, delay_s_min=0.1, delay_s_max=2.0).validate()
"""Backoff between attempts; the attempt bound is far beyond what the time bound allows."""


class StartVerdict(enum.Enum):
    RETRY = "retry"  # back off and try again
    RENEW = "renew"  # wait for a new session, then try again
    FAIL = "fail"  # raise at once


def start_verdict(error: BaseException) -> StartVerdict:
    """What a start-up step does after ``error`` (see the module docstring)."""
    if isinstance(error, SessionExpiredError):
        return StartVerdict.RENEW
    if isinstance(error, TimeoutError) or is_retriable(error):
        return StartVerdict.RETRY
    return StartVerdict.FAIL


async def retry_start_step(
    step: str,
    call: Callable[[], Awaitable[T]],
    *,
    owner: str,
    timeout_s: float,
    log_event: str = "start_retry",
    log_fields: Mapping[str, object] | None = None,
    session: Callable[[], Session] | None = None,
    clock: Clock | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """``await call()``, tried again after RETRY / RENEW failures until ``timeout_s`` has passed.

    ``owner`` names the process in the final error (``"bookie b1"``); ``log_event`` and
    ``log_fields`` name each retry's log line (``"bookie_start_retry"``, ``{"bookie_id":
    "b1"}``). ``session``: the session the step needs (None for a connect step); an
    attempt waits for it to be CONNECTED first. A FAIL error is raised unchanged; a step still
    failing at the bound raises ``MetadataUnavailableError`` naming the last cause.
    """
    clock = clock or SystemClock()
    fields = dict(log_fields or {})
    deadline = clock.monotonic() + timeout_s
    attempts = 0

    async def attempt() -> T:
        nonlocal attempts
        attempts += 1
        if session is not None:
            await wait_connected(session(), deadline - clock.monotonic())
        return await call()

    def on_retry(attempt_no: int, error: BaseException, delay_s: float) -> None:
        log.warning(log_event, **fields, step=step, attempt=attempt_no, delay_ms=round(delay_s * 1000),
                    error=_describe(error))

    try:
        return await retry_async(
            attempt, policy=START_RETRY, what=step, deadline=deadline, clock=clock, sleep=sleep,
            retry_if=lambda e: start_verdict(e) is not StartVerdict.FAIL, on_retry=on_retry,
        )
    except Exception as exc:
        if start_verdict(exc) is StartVerdict.FAIL:
            raise
        raise MetadataUnavailableError(
            f"{owner}: {step} still failing at the end of its {timeout_s:g}s bound ({attempts} attempts); "
            f"last error: {_describe(exc)}"
        ) from exc


class StartAbandoned(Exception):
    """The process was told to stop (SIGTERM) before its start finished; the start was cancelled."""


async def start_unless_stopped(start: Awaitable[T], stop: asyncio.Event) -> T:
    """``await start``, unless ``stop`` is set first: then the start is cancelled (and
    awaited, so it closes what it opened) and :class:`StartAbandoned` is raised."""
    starting = asyncio.ensure_future(start)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not starting.done():
        starting.cancel()
        try:
            await starting
        except asyncio.CancelledError:
            raise StartAbandoned("stopped before the start finished") from None
    return starting.result()  # a failed start raises here


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
