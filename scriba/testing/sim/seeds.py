"""Seeds: run a seeded simulation many times; report each failure with the command that replays it.

A simulation run is a function ``seed -> SeedReport``: it builds a ``World(seed)``, runs
it, checks its invariants and returns the report (``violations`` empty when they held).
``check_seeds`` runs many seeds and raises one ``AssertionError`` listing every failing
seed with its replay command; ``replay_seed`` reads the seed (and flags) to replay
from the environment, so one test function replays any seed::

    SCRIBA_SIM_SEED=123 .venv/bin/pytest tests/sim -k replay

Deterministic by construction: the report must depend on nothing but the seed (and
the flags in ``replay_env``), so the same command fails the same way every time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

SEED_ENV = "SCRIBA_SIM_SEED"
"""The environment variable a replay reads its seed from."""

VIOLATIONS_SHOWN_MAX = 10


@dataclass
class SeedReport:
    """What one seeded run found. Subclass it to add figures of your own."""

    seed: int
    description: str = ""  # the shape the seed drew (sizes, fault rates, ...)
    violations: list[str] = field(default_factory=list)
    replay_env: dict[str, str] = field(default_factory=dict)  # flags besides the seed
    replay_target: str = "tests/sim -k replay"  # what pytest runs to replay

    @property
    def ok(self) -> bool:
        return not self.violations

    def replay_command(self) -> str:
        flags = "".join(f" {name}={value}" for name, value in sorted(self.replay_env.items()))
        return f"{SEED_ENV}={self.seed}{flags} .venv/bin/pytest {self.replay_target}"

    def explain(self) -> str:
        lines = [f"seed {self.seed}: {self.description}"]
        lines += [f"  violation: {v}" for v in self.violations[:VIOLATIONS_SHOWN_MAX]]
        if len(self.violations) > VIOLATIONS_SHOWN_MAX:
            lines.append(f"  ... {len(self.violations) - VIOLATIONS_SHOWN_MAX} more")
        lines.append(f"  replay: {self.replay_command()}")
        return "\n".join(lines)


R = TypeVar("R", bound=SeedReport)


def run_seeds(run: Callable[[int], R], seeds: Iterable[int]) -> list[R]:
    """Run every seed; returns all reports (failing ones have violations)."""
    return [run(seed) for seed in seeds]


def check_seeds(run: Callable[[int], R], seeds: Iterable[int], *, what: str = "simulation") -> list[R]:
    """Run every seed; raise ``AssertionError`` naming each failing seed and its replay."""
    reports = run_seeds(run, seeds)
    failures = [r.explain() for r in reports if not r.ok]
    if failures:
        raise AssertionError(f"{what} violations:\n" + "\n".join(failures))
    return reports


def random_seed() -> int:
    """A fresh seed for one extra run per CI job (print it: a failure must be replayable)."""
    return int.from_bytes(os.urandom(4), "big")


def replay_seed(environ: Mapping[str, str] | None = None) -> int | None:
    """The seed to replay from ``SCRIBA_SIM_SEED``, or None when none is set."""
    value = (os.environ if environ is None else environ).get(SEED_ENV)
    return None if value is None else int(value)


def env_flag(name: str, *, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """A replay flag (``NAME=1`` / ``NAME=0``) from the environment."""
    value = (os.environ if environ is None else environ).get(name)
    return default if value is None else value not in ("0", "", "false", "no")
