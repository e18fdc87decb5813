"""The public simulation kit (``scriba.testing.sim``): its documented example runs, its
seeds machinery reports failures with a working replay command, and runs are deterministic."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

import scriba.testing.sim as kit
from scriba.testing.sim import SeedReport, World, check_seeds, env_flag, replay_seed


def _docstring_example() -> str:
    doc = kit.__doc__ or ""
    start = doc.index("Example (")
    body = doc[doc.index("::\n", start) + 3 :]
    return textwrap.dedent(body)


def test_the_documented_example_runs_as_written() -> None:
    code = _docstring_example()
    assert "check_seeds(run, range(20))" in code
    namespace: dict[str, Any] = {}
    exec(compile(code, "scriba.testing.sim example", "exec"), namespace)  # raises on a violation
    report = namespace["run"](7)
    assert report.ok and report.seed == 7


def test_the_documented_example_catches_a_broken_writer() -> None:
    """Negative control for the example's checker: confirmations reported out of order."""
    namespace: dict[str, Any] = {}
    code = _docstring_example().replace("check_seeds(run, range(20))", "")
    code = code.replace(
        "confirmed.extend(range(first, last + 1))", "confirmed.extend(range(last, first - 1, -1))"
    )
    exec(compile(code, "broken example", "exec"), namespace)
    with pytest.raises(AssertionError) as failed:
        check_seeds(namespace["run"], range(5))
    text = str(failed.value)
    assert "out of order" in text
    assert "replay: SCRIBA_SIM_SEED=" in text and "tests/sim -k replay" in text


def test_seed_report_names_the_command_that_reproduces_it() -> None:
    report = SeedReport(42, description="shape", violations=["it broke"],
                        replay_env={"SCRIBA_SIM_RACE": "1", "SCRIBA_SIM_FENCING": "0"})
    assert not report.ok
    assert report.replay_command() == (
        "SCRIBA_SIM_SEED=42 SCRIBA_SIM_FENCING=0 SCRIBA_SIM_RACE=1 .venv/bin/pytest tests/sim -k replay"
    )
    assert "seed 42: shape" in report.explain() and "violation: it broke" in report.explain()
    assert replay_seed({"SCRIBA_SIM_SEED": "42"}) == 42
    assert replay_seed({}) is None
    assert env_flag("X", default=True, environ={"X": "0"}) is False
    assert env_flag("X", default=False, environ={"X": "1"}) is True
    assert env_flag("X", default=True, environ={}) is True


def test_world_is_a_function_of_its_seed() -> None:
    def trace(seed: int) -> list[tuple[float, int]]:
        world = World(seed)
        out: list[tuple[float, int]] = []
        for i in range(50):
            world.at(world.rng.uniform(0, 1), lambda i=i: out.append((world.clock.monotonic(), i)))
        world.run(2.0)
        return out

    assert trace(3) == trace(3)
    assert trace(3) != trace(4)
    times = [t for t, _ in trace(3)]
    assert times == sorted(times)  # events run in time order, the clock follows them
    world = World(1)
    world.run(5.0)
    assert world.clock.monotonic() == 5.0 and world.clock.wall() > 1e9
