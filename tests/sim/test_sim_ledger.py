"""R17: the ledger cores under a seeded simulation of bookies, network and metadata.

CI runs ``SIM_SEEDS_CI`` seeds; ``SCRIBA_SOAK=1`` runs ``SIM_SEEDS_SOAK``. A failure
prints each failing seed and the command that replays it::

    SCRIBA_SIM_SEED=123 .venv/bin/pytest tests/sim -k replay
"""

from __future__ import annotations

import os
import time

import pytest
from sim_scenario import run_seed

from scriba.testing.sim import check_seeds, env_flag, random_seed, replay_seed

SIM_SEEDS_CI = 1000
SIM_SEEDS_SOAK = 20_000
CHUNK = 50
SOAK = env_flag("SCRIBA_SOAK", default=False)
SEEDS_TOTAL = SIM_SEEDS_SOAK if SOAK else SIM_SEEDS_CI


@pytest.mark.parametrize("first", range(0, SEEDS_TOTAL, CHUNK))
def test_sim_seeds(first: int) -> None:
    check_seeds(run_seed, range(first, min(first + CHUNK, SEEDS_TOTAL)))


def test_sim_random_seed_printed() -> None:
    seed = random_seed()
    print(f"random simulation seed {seed}")  # shown with -rA / on failure
    result = run_seed(seed)
    assert not result.violations, result.explain()


@pytest.mark.skipif(replay_seed() is None, reason="set SCRIBA_SIM_SEED to replay")
def test_sim_replay() -> None:
    seed = replay_seed()
    assert seed is not None
    result = run_seed(
        seed,
        race=env_flag("SCRIBA_SIM_RACE", default=False),
        fencing=env_flag("SCRIBA_SIM_FENCING", default=True),
        ack_early=env_flag("SCRIBA_SIM_ACK_EARLY", default=False),
        writer_fault=os.environ.get("SCRIBA_SIM_WRITER_FAULT", ""),
        probes=env_flag("SCRIBA_SIM_PROBES", default=False),
        probe_fault=os.environ.get("SCRIBA_SIM_PROBE_FAULT", ""),
    )
    print(result.explain())
    assert not result.violations, result.explain()


def test_sim_negative_control_fencing_off_is_caught() -> None:
    """With fencing disabled on every bookie the checkers must find a violation."""
    caught = [r for r in (run_seed(seed, fencing=False) for seed in range(60)) if r.violations]
    assert caught, "fencing off went unnoticed for 60 seeds: the checkers are too weak"
    assert any("lost" in v or "fenced writer" in v for r in caught for v in r.violations)


def test_sim_negative_control_ack_before_fsync_is_caught() -> None:
    """Bookies that acknowledge before fsync lose confirmed entries in a power failure."""
    caught = [r for r in (run_seed(seed, ack_early=True) for seed in range(200)) if r.violations]
    assert caught, "ack-before-fsync went unnoticed for 200 seeds: the checkers are too weak"
    assert any("lost" in v for r in caught for v in r.violations)


def test_sim_negative_control_lac_ahead_of_the_writer_is_caught() -> None:
    """A writer that piggybacks LAC + 1 must trip "no bookie's LAC exceeds the writer's"."""
    results = [run_seed(seed, writer_fault="lac_ahead") for seed in range(20)]
    caught = [r for r in results if any("beyond the writer's confirmed LAC" in v for v in r.violations)]
    assert len(caught) >= 15, "a piggybacked LAC + 1 went unnoticed"
    assert "SCRIBA_SIM_WRITER_FAULT=lac_ahead" in caught[0].explain()


def test_sim_negative_control_length_not_accumulated_is_caught() -> None:
    """A writer that does not accumulate the ledger length must trip the length check
    (the closed length agrees with the last entry's header: only the payload sum shows it)."""
    results = [run_seed(seed, writer_fault="length_reset") for seed in range(20)]
    caught = [r for r in results if any("the sum of the payloads" in v for v in r.violations)]
    assert len(caught) >= 15, "a length that is not accumulated went unnoticed"
    assert not any("!= last entry's length" in v for r in results for v in r.violations)


def test_sim_is_deterministic() -> None:
    a, b = run_seed(4242), run_seed(4242)
    assert (a.events, a.confirmed, a.closed_last, a.violations) == (
        b.events, b.confirmed, b.closed_last, b.violations,
    )


def test_sim_exercises_the_interesting_paths() -> None:
    """Across seeds the simulation must hit ensemble changes, fencing and writer failures."""
    started = time.monotonic()
    results = [run_seed(seed) for seed in range(100, 160)]
    assert sum(r.ensemble_changes > 0 for r in results) >= 5
    assert sum(r.writer_error == "LedgerFencedError" for r in results) >= 5
    assert sum(r.closed_last is not None and r.closed_last >= 0 for r in results) >= 30
    assert time.monotonic() - started < 60


R3_TRIALS = 1000


def test_sim_r3_recovery_racing_inflight_adds_never_closes_below_a_confirmed_entry() -> None:
    """R3: recovery lands while appends are in flight; 1,000 forced interleavings."""
    results = [run_seed(seed, race=True) for seed in range(R3_TRIALS)]
    failures = [r.explain() for r in results if r.violations]
    assert not failures, "R3 violations:\n" + "\n".join(failures)
    # The interleavings are real: writers were fenced mid-stream, and recoveries kept
    # entries the writer never saw confirmed.
    assert sum(r.writer_error == "LedgerFencedError" for r in results) >= R3_TRIALS // 2
    assert sum((r.closed_last if r.closed_last is not None else -1) > r.confirmed for r in results) >= 50
