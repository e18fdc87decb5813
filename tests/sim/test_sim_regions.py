"""The synchronous geo mode under the seeded simulation: a whole region lost during appends.

``min_regions_for_durability = 2`` on ensembles whose ack quorum fits inside one region;
a bookie outside the doomed region stops for a while, then the doomed region loses
every bookie and disk for good; recoverers close the ledger from the surviving regions.
Checked: no confirmed entry lost (acked-set and log checkers), recoverers agree. The
negative control (an ack rule that counts acks only) must be caught losing entries.

Replay: ``SCRIBA_SIM_SEED=123 .venv/bin/pytest tests/sim/test_sim_regions.py -k replay``.
"""

from __future__ import annotations

import pytest
from sim_regions import run_region_seed

from scriba.testing.sim import check_seeds, env_flag, random_seed, replay_seed

SEEDS_CI = 500
SEEDS_SOAK = 10_000
CHUNK = 100
SEEDS_TOTAL = SEEDS_SOAK if env_flag("SCRIBA_SOAK", default=False) else SEEDS_CI


@pytest.mark.parametrize("first", range(0, SEEDS_TOTAL, CHUNK))
def test_sim_region_loss_loses_nothing_confirmed(first: int) -> None:
    reports = check_seeds(run_region_seed, range(first, min(first + CHUNK, SEEDS_TOTAL)),
                          what="region-loss simulation")
    # The seeds must confirm entries and change ensembles, or they prove nothing.
    assert sum(r.confirmed + 1 for r in reports) > 10 * len(reports)
    assert sum(r.ensemble_changes for r in reports) > 0


def test_sim_region_loss_random_seed_printed() -> None:
    seed = random_seed()
    print(f"random region-loss seed {seed}")
    result = run_region_seed(seed)
    assert not result.violations, result.explain()


@pytest.mark.skipif(replay_seed() is None, reason="set SCRIBA_SIM_SEED to replay")
def test_sim_region_loss_replay() -> None:
    seed = replay_seed()
    assert seed is not None
    result = run_region_seed(seed, region_check=env_flag("SCRIBA_SIM_REGION_CHECK", default=True))
    print(result.explain())
    assert not result.violations, result.explain()


def test_sim_negative_control_ack_rule_without_regions_is_caught() -> None:
    """With regions left out of the ack rule, losing a region must lose confirmed entries."""
    results = [run_region_seed(seed, region_check=False) for seed in range(60)]
    caught = [r for r in results if r.violations]
    assert caught, "an ack rule blind to regions went unnoticed for 60 seeds: the checks are too weak"
    assert any(r.lost or any("lost" in v for v in r.violations) for r in caught)
