"""The RSM cores under the seeded simulation (``sim_rsm.py``): crashes, pauses past the
session lease, concurrent candidates, client retries; invariants after every event.

CI runs ``SEEDS_CI`` seeds; ``SCRIBA_SOAK=1`` runs ``SEEDS_SOAK``. A failure prints each
failing seed and the command that replays it::

    SCRIBA_SIM_SEED=123 .venv/bin/pytest tests/rsm/test_rsm_sim.py -k replay
"""

from __future__ import annotations

import os

import pytest
from sim_rsm import run_seed

SEEDS_CI = 300
SEEDS_SOAK = 5_000
CHUNK = 50
SOAK = os.environ.get("SCRIBA_SOAK") == "1"
SEEDS_TOTAL = SEEDS_SOAK if SOAK else SEEDS_CI


@pytest.mark.parametrize("first", range(0, SEEDS_TOTAL, CHUNK))
def test_seeds(first: int) -> None:
    failures = []
    faults = {"crashes": 0, "pauses": 0, "terms": 0, "acks": 0, "unknown": 0}
    for seed in range(first, min(first + CHUNK, SEEDS_TOTAL)):
        result = run_seed(seed)
        for key in faults:
            faults[key] += result.stats[key]
        if result.violations:
            failures.append(result.explain())
    assert not failures, "rsm simulation violations:\n" + "\n".join(failures)
    # the faults the run claims to exercise did happen
    assert faults["crashes"] > CHUNK and faults["pauses"] > CHUNK and faults["terms"] > 2 * CHUNK, faults
    assert faults["unknown"] > 0 and faults["acks"] > 20 * CHUNK, faults


def test_replay() -> None:
    seed = int(os.environ.get("SCRIBA_SIM_SEED", "0"))
    result = run_seed(seed)
    assert not result.violations, result.explain()


@pytest.mark.parametrize("seed", range(5))
def test_negative_control_without_fencing_is_caught(seed: int) -> None:
    """The stream accepts a deposed leader's batches: divergence must be found."""
    result = run_seed(seed, fencing=False)
    assert result.violations, result.explain()


@pytest.mark.parametrize("seed", range(5))
def test_negative_control_without_dedup_is_caught(seed: int) -> None:
    """The session table never reports a duplicate: a retried command runs twice, found."""
    result = run_seed(seed, dedup=False)
    assert any("twice" in v for v in result.violations), result.explain()
