"""R17 for geo: the link core (``LinkCore``, ``resume_point``) in a seeded simulation (``geo_sim``).

Crashes of the replicator at any event, broken and indeterminate appends, two replicators
racing for one target: the target ends with every shippable source record exactly once,
in source order, over ``SIM_SEEDS_CI`` seeds (``SCRIBA_SOAK=1``: ``SIM_SEEDS_SOAK``) plus
one random seed printed for replay. Negative controls: resuming from a checkpoint
committed after the append, or reading the resume point before fencing the old writer,
must be caught duplicating.

Replay a seed: ``SCRIBA_SIM_SEED=123 [SCRIBA_GEO_SIM_MODE=checkpoint] .venv/bin/pytest
tests/geo/test_geo_sim.py -k replay``.
"""

from __future__ import annotations

import os

import pytest
from geo_sim import MODES, run_link

from scriba.testing.sim import check_seeds, random_seed, replay_seed, run_seeds

SIM_SEEDS_CI = 300
SIM_SEEDS_SOAK = 5_000
SOAK = os.environ.get("SCRIBA_SOAK") == "1"
CONTROL_SEEDS = 100


def test_geo_link_sim_seeds_exactly_once() -> None:
    reports = check_seeds(run_link, range(SIM_SEEDS_SOAK if SOAK else SIM_SEEDS_CI), what="geo link simulation")
    assert any("racing=True" in r.description for r in reports) and any("racing=False" in r.description
                                                                          for r in reports)


def test_geo_link_sim_random_seed_printed() -> None:
    seed = random_seed()
    print(f"\n[geo sim] random seed {seed} (replay: SCRIBA_SIM_SEED={seed} .venv/bin/pytest "
          "tests/geo/test_geo_sim.py -k replay)")
    check_seeds(run_link, [seed], what="geo link simulation (random seed)")


@pytest.mark.parametrize("mode", ["checkpoint", "scan_before_fence"])
def test_geo_link_sim_negative_controls_are_caught_duplicating(mode: str) -> None:
    reports = run_seeds(lambda seed: run_link(seed, mode), range(CONTROL_SEEDS))
    caught = [r for r in reports if any("duplicated" in v for v in r.violations)]
    print(f"\n[geo sim] {mode}: duplication caught in {len(caught)}/{len(reports)} seeds")
    assert len(caught) >= CONTROL_SEEDS // 10, f"{mode}: the checker caught duplication in only {len(caught)} seeds"


def test_geo_link_sim_replay() -> None:
    seed = replay_seed()
    if seed is None:
        pytest.skip("set SCRIBA_SIM_SEED (and SCRIBA_GEO_SIM_MODE) to replay one seed")
    mode = os.environ.get("SCRIBA_GEO_SIM_MODE", "target")
    assert mode in MODES, f"SCRIBA_GEO_SIM_MODE must be one of {MODES}"
    check_seeds(lambda s: run_link(s, mode), [seed], what=f"geo link simulation ({mode})")
