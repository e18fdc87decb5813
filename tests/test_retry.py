"""The retry policy: retriable vs not, the attempt bound, the deadline, the jittered backoff.

Every test injects a manual clock and a sleep that only advances it: nothing sleeps.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from scriba.clock import ManualClock
from scriba.errors import (
    BadVersionError,
    ConfigError,
    MetadataUnavailableError,
    NoSuchKeyError,
    UnavailableError,
)
from scriba.retry import RetryPolicy, is_retriable, retry_async

POLICY = RetryPolicy(attempts_max=5, delay_s_min=0.1, delay_s_max=0.8)


class Harness:
    """A scripted call: raises the listed errors in turn, then returns ``"ok"``."""

    def __init__(self, errors: list[BaseException], clock: ManualClock | None = None) -> None:
        self.errors = list(errors)
        self.clock = clock or ManualClock()
        self.started_at: list[float] = []  # clock time of every attempt
        self.slept: list[float] = []

    async def call(self) -> str:
        self.started_at.append(self.clock.monotonic())
        if self.errors:
            raise self.errors.pop(0)
        return "ok"

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock.advance(seconds)

    async def run(self, policy: RetryPolicy = POLICY, **kwargs: object) -> str:
        return await retry_async(
            self.call, policy=policy, what="test", clock=self.clock, sleep=self.sleep,
            rng=random.Random(7), **kwargs,  # type: ignore[arg-type]
        )


async def test_a_call_that_succeeds_runs_once_and_never_sleeps() -> None:
    h = Harness([])
    assert await h.run() == "ok"
    assert len(h.started_at) == 1 and h.slept == []


async def test_retriable_errors_are_retried_until_the_call_succeeds() -> None:
    h = Harness([MetadataUnavailableError("down"), UnavailableError("down")])
    assert await h.run() == "ok"
    assert len(h.started_at) == 3
    assert len(h.slept) == 2


async def test_a_non_retriable_error_is_raised_at_once() -> None:
    error = NoSuchKeyError("gone")
    h = Harness([error])
    with pytest.raises(NoSuchKeyError) as raised:
        await h.run()
    assert raised.value is error
    assert len(h.started_at) == 1 and h.slept == []


async def test_plain_exceptions_are_not_retriable_by_default() -> None:
    h = Harness([RuntimeError("bug")])
    with pytest.raises(RuntimeError):
        await h.run()
    assert len(h.started_at) == 1


async def test_attempts_are_bounded_and_the_last_error_is_raised_unchanged() -> None:
    errors = [MetadataUnavailableError(f"down {i}") for i in range(10)]
    h = Harness(errors)
    with pytest.raises(MetadataUnavailableError) as raised:
        await h.run()
    assert len(h.started_at) == POLICY.attempts_max
    assert len(h.slept) == POLICY.attempts_max - 1
    assert str(raised.value) == f"down {POLICY.attempts_max - 1}"


async def test_one_attempt_means_no_retry() -> None:
    h = Harness([MetadataUnavailableError("down")])
    with pytest.raises(MetadataUnavailableError):
        await h.run(RetryPolicy(attempts_max=1))
    assert len(h.started_at) == 1


async def test_no_attempt_starts_at_or_after_the_deadline() -> None:
    clock = ManualClock(start=100.0)
    h = Harness([MetadataUnavailableError("down")] * 1000, clock)
    deadline = 101.0
    with pytest.raises(MetadataUnavailableError):
        await h.run(RetryPolicy(attempts_max=1000, delay_s_min=0.1, delay_s_max=0.3), deadline=deadline)
    assert len(h.started_at) > 3  # it did retry while there was time
    assert all(t < deadline for t in h.started_at)
    assert clock.monotonic() < deadline  # and never slept past the deadline either
    assert len(h.started_at) < 1000  # the deadline, not the attempt bound, stopped it


async def test_a_slow_attempt_that_reaches_the_deadline_is_the_last() -> None:
    clock = ManualClock()
    h = Harness([], clock)

    async def slow() -> str:
        h.started_at.append(clock.monotonic())
        clock.advance(2.0)  # the attempt itself runs past the deadline
        raise MetadataUnavailableError("timed out")

    with pytest.raises(MetadataUnavailableError):
        await retry_async(slow, policy=POLICY, what="slow", deadline=1.0, clock=clock, sleep=h.sleep)
    assert h.started_at == [0.0] and h.slept == []


async def test_backoff_doubles_with_equal_jitter_up_to_the_widest_window() -> None:
    h = Harness([MetadataUnavailableError("down")] * 8)
    with pytest.raises(MetadataUnavailableError):
        await h.run(RetryPolicy(attempts_max=8, delay_s_min=0.1, delay_s_max=0.8))
    windows = [0.1, 0.2, 0.4, 0.8, 0.8, 0.8, 0.8]
    assert len(h.slept) == len(windows)
    for slept, window in zip(h.slept, windows, strict=True):
        assert window / 2 <= slept <= window


async def test_jitter_spreads_callers_that_failed_together() -> None:
    first_sleeps = set()
    for seed in range(20):
        h = Harness([MetadataUnavailableError("down")])
        await retry_async(h.call, policy=POLICY, what="t", clock=h.clock, sleep=h.sleep, rng=random.Random(seed))
        first_sleeps.add(round(h.slept[0], 6))
    assert len(first_sleeps) > 10


async def test_retry_if_narrows_or_widens_the_rule() -> None:
    h = Harness([BadVersionError("lost a race")])  # not retriable by the tree: the caller re-reads
    assert await h.run(retry_if=lambda e: isinstance(e, BadVersionError)) == "ok"
    assert len(h.started_at) == 2
    h = Harness([MetadataUnavailableError("outcome unknown")])  # retriable, but not for this caller
    with pytest.raises(MetadataUnavailableError):
        await h.run(retry_if=lambda e: False)
    assert len(h.started_at) == 1


async def test_cancellation_is_never_retried() -> None:
    h = Harness([asyncio.CancelledError()])
    with pytest.raises(asyncio.CancelledError):
        await h.run(retry_if=lambda e: True)
    assert len(h.started_at) == 1
    h = Harness([MetadataUnavailableError("down"), asyncio.CancelledError(), MetadataUnavailableError("x")])
    with pytest.raises(asyncio.CancelledError):
        await h.run(retry_if=lambda e: True)
    assert len(h.started_at) == 2


async def test_on_retry_sees_each_failed_attempt_and_its_sleep() -> None:
    seen: list[tuple[int, str, float]] = []
    h = Harness([MetadataUnavailableError("a"), MetadataUnavailableError("b")])
    await h.run(on_retry=lambda n, e, s: seen.append((n, str(e), s)))
    assert [(n, e) for n, e, _ in seen] == [(1, "a"), (2, "b")]
    assert [s for _, _, s in seen] == h.slept


def test_is_retriable_follows_the_error_tree() -> None:
    assert is_retriable(MetadataUnavailableError("x"))
    assert not is_retriable(BadVersionError("x"))
    assert not is_retriable(TimeoutError("builtin"))


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (RetryPolicy(attempts_max=0), "attempts_max"),
        (RetryPolicy(delay_s_min=-1.0), "delay_s_min"),
        (RetryPolicy(delay_s_min=2.0, delay_s_max=1.0), "delay_s_max"),
    ],
)
def test_validate_names_the_bad_field(policy: RetryPolicy, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        policy.validate()


async def test_an_error_that_is_not_retriable_ends_the_retries_after_a_retriable_one() -> None:
    """Attempt 1 fails retriably, attempt 2 with a fenced/bad-version kind of error: stop there."""
    h = Harness([MetadataUnavailableError("down"), BadVersionError("lost the race"), UnavailableError("x")])
    with pytest.raises(BadVersionError):
        await h.run()
    assert len(h.started_at) == 2 and len(h.slept) == 1
