"""The fence probe (``scriba.client.fence_probe``, an RSM leader's leadership check for
linearizable reads) under the ledger simulation: the writer probes its ensemble every few
milliseconds while recoverers fence the ledger, bookies crash and messages drop or
reorder; a probe proven unfenced must have been sent before any recovery completed
fencing. A failing seed prints its replay command (``SCRIBA_SIM_PROBES=1``)."""

from __future__ import annotations

from sim_scenario import run_seed

from scriba.testing.sim import check_seeds, env_flag

SEEDS = 2000 if env_flag("SCRIBA_SOAK", default=False) else 300


def test_no_probe_proves_a_ledger_unfenced_after_fencing_completed() -> None:
    check_seeds(lambda seed: run_seed(seed, probes=True), range(SEEDS))


def test_the_probes_are_exercised_on_both_sides_of_the_fence() -> None:
    results = [run_seed(seed, probes=True) for seed in range(60)]
    assert sum(r.probes_proven > 0 for r in results) >= 40  # proven while the writer still wrote
    assert sum(r.probes_unproven_after_fence > 0 for r in results) >= 20  # and refused once fenced


def test_negative_control_a_probe_counting_qa_minus_one_answers_is_caught() -> None:
    results = [run_seed(seed, probe_fault="qa_minus_one") for seed in range(100)]
    caught = [r for r in results if any("proved the ledger unfenced" in v for v in r.violations)]
    assert len(caught) >= 5, "a probe counting Qa - 1 answers went unnoticed"
    assert "SCRIBA_SIM_PROBE_FAULT=qa_minus_one" in caught[0].explain()
