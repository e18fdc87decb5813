"""``scriba.testing.waiting.eventually``: returns when the condition holds, fails by its deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from scriba.errors import DeadlineExceededError
from scriba.testing.waiting import eventually


async def test_eventually_returns_once_the_condition_holds() -> None:
    flips: list[int] = []
    asyncio.get_running_loop().call_later(0.05, flips.append, 1)
    await eventually(lambda: bool(flips), 5.0, what="the flip")
    assert flips == [1]


async def test_eventually_awaits_a_coroutine_condition() -> None:
    calls = [0]

    async def third_time() -> bool:
        calls[0] += 1
        return calls[0] >= 3

    await eventually(third_time, 5.0, interval_s=0.001)
    assert calls[0] == 3


async def test_eventually_raises_by_its_deadline_naming_what() -> None:
    with pytest.raises(DeadlineExceededError, match=r"the impossible did not hold within 0\.1 s"):
        await eventually(lambda: False, 0.1, what="the impossible")


async def test_eventually_returns_the_first_true_value_of_either_kind() -> None:
    values: Iterator[object] = iter([None, [], {"ready": 3}])
    assert await eventually(lambda: next(values), 5.0, interval_s=0.001) == {"ready": 3}
    answers: Iterator[str | int] = iter([0, "", "leader-2"])

    async def leader() -> str | int:
        return next(answers)

    assert await eventually(leader, 5.0, interval_s=0.001) == "leader-2"


async def test_eventually_names_the_last_value_it_saw() -> None:
    with pytest.raises(DeadlineExceededError, match=r"the queue did not hold within 0\.1 s \(last: \[\]\)"):
        await eventually(lambda: [], 0.1, what="the queue")
