"""The I/O-free parts of entry-log GC: schedule, pass plan, throttle, accounting table, config."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scriba.bookie.compaction import (
    CompactionPolicy,
    CompactionSchedule,
    PassKind,
    Throttle,
    plan_pass,
)
from scriba.bookie.config import BookieConfig
from scriba.bookie.entry_log_meta import LogMetaTable, LogUsage
from scriba.errors import ConfigError


def test_schedule_runs_major_then_minor_by_their_intervals() -> None:
    sched = CompactionSchedule(CompactionPolicy(minor_interval_s=10, major_interval_s=100), now=0)
    assert sched.due(5).kind is PassKind.NONE  # nothing is due at start (as BookKeeper)
    due = sched.due(10)
    assert (due.kind, due.threshold) == (PassKind.MINOR, 0.2)
    sched.ran(due.kind, 10)
    assert sched.due(15).kind is PassKind.NONE
    due = sched.due(100)
    assert (due.kind, due.threshold) == (PassKind.MAJOR, 0.8)
    sched.ran(due.kind, 100)
    assert sched.due(105).kind is PassKind.NONE  # a major pass counts as a minor one
    assert sched.due(110).kind is PassKind.MINOR


def test_schedule_forced_passes_and_disabled_kinds() -> None:
    forced_only = CompactionSchedule(CompactionPolicy(minor_interval_s=0, major_interval_s=0), now=0)
    assert forced_only.due(1e9).kind is PassKind.NONE
    assert forced_only.due(1, force_minor=True).kind is PassKind.MINOR
    assert forced_only.due(1, force_major=True).kind is PassKind.MAJOR
    no_major = CompactionSchedule(CompactionPolicy(major_threshold=0), now=0)
    assert no_major.due(1e9, force_major=True).kind is PassKind.MINOR  # off: the minor one runs
    off = CompactionSchedule(CompactionPolicy(minor_threshold=0, major_threshold=0), now=0)
    assert off.due(1e9, force_major=True, force_minor=True).kind is PassKind.NONE


def test_plan_removes_dead_compacts_sparse_least_live_first() -> None:
    usages = [
        LogUsage(1, 1000, 0),  # dead
        LogUsage(2, 1000, 500),
        LogUsage(3, 1000, 100),
        LogUsage(4, 1000, 900),  # above the threshold
        LogUsage(5, 0, 0),  # empty, not current: nothing to give back but a file
    ]
    plan = plan_pass(usages, current_id=9, threshold=0.8)
    assert plan.remove == (1, 5) and plan.compact == (3, 2) and not plan.roll_current
    assert plan_pass(usages, current_id=9, threshold=0).compact == ()  # dead logs only


def test_plan_rolls_the_current_log_when_it_is_mostly_dead_but_not_when_empty() -> None:
    assert plan_pass([LogUsage(7, 1000, 0)], 7, 0).roll_current  # all dead: roll, remove
    assert plan_pass([LogUsage(7, 1000, 0)], 7, 0).remove == (7,)
    plan = plan_pass([LogUsage(7, 1000, 100)], 7, 0.2)
    assert plan.roll_current and plan.compact == (7,)
    assert not plan_pass([LogUsage(7, 1000, 300)], 7, 0.2).roll_current
    empty = plan_pass([LogUsage(7, 0, 0)], 7, 0.9)
    assert not empty.roll_current and empty.remove == ()


@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)), max_size=30),
       st.floats(0, 1), st.integers(0, 30))
def test_plan_never_removes_a_log_with_live_bytes(
    sizes: list[tuple[int, int]], threshold: float, current: int
) -> None:
    usages = [LogUsage(i, max(t, lv), min(t, lv)) for i, (t, lv) in enumerate(sizes)]
    plan = plan_pass(usages, current, threshold)
    by_id = {u.log_id: u for u in usages}
    assert all(by_id[i].live_bytes == 0 for i in plan.remove)
    assert all(by_id[i].live_bytes > 0 and by_id[i].live_ratio < threshold for i in plan.compact)
    ratios = [by_id[i].live_ratio for i in plan.compact]
    assert ratios == sorted(ratios)
    assert plan.roll_current == (current in plan.remove or current in plan.compact)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_throttle_keeps_the_average_within_both_rates() -> None:
    clock = FakeClock()
    throttle = Throttle(1_000_000, 500, clock)
    rnd = random.Random(3)
    done_bytes = done_entries = 0
    for _ in range(200):
        nbytes, nentries = rnd.randrange(1, 200_000), rnd.randrange(0, 100)
        clock.now += rnd.random() * 0.01  # the work itself takes a little time
        clock.now += throttle.delay_s(nbytes, nentries)
        done_bytes += nbytes
        done_entries += nentries
    # within the rates, give or take one step
    assert done_bytes <= 1_000_000 * clock.now + 200_000
    assert done_entries <= 500 * clock.now + 100
    assert done_bytes >= 0.5 * 1_000_000 * clock.now or done_entries >= 0.5 * 500 * clock.now
    unlimited = Throttle(0, 0, clock)
    assert unlimited.delay_s(10**9, 10**6) == 0 and unlimited.step_bytes(4096) == 4096
    assert Throttle(1_000_000, 0, clock).step_bytes(4 << 20) == 250_000


def test_throttle_does_not_save_idle_time_for_a_burst() -> None:
    clock = FakeClock()
    throttle = Throttle(1000, 0, clock)
    assert throttle.delay_s(1000, 0) == 0  # one step's worth may go at once
    clock.now = 1000.0  # idle for long
    assert throttle.delay_s(1000, 0) == 0
    assert throttle.delay_s(1000, 0) == pytest.approx(1.0)  # the next step waits its cost


def test_config_validates_compaction_settings_by_field_name(tmp_path: object) -> None:
    def cfg(**kw: object) -> BookieConfig:
        return BookieConfig(metadata_uri="memory://x", data_dir=tmp_path, gc_interval_s=60, **kw)  # type: ignore[arg-type]

    assert cfg().compaction_policy == CompactionPolicy()
    cases = {
        "minor_compaction_interval_s": {"minor_compaction_interval_s": 30},  # below gc_interval_s
        "major_compaction_threshold": {"major_compaction_threshold": 1.5},
        "minor_compaction_threshold": {"minor_compaction_threshold": 0.9, "major_compaction_threshold": 0.5},
        "compaction_rate_bytes_per_s": {"compaction_rate_bytes_per_s": -1},
        "compaction_rate_entries_per_s": {"compaction_rate_entries_per_s": -1},
    }
    for field, kw in cases.items():
        with pytest.raises(ConfigError, match=field):
            cfg(**kw).validate()
    cfg(minor_compaction_interval_s=0, major_compaction_threshold=0).validate()  # forced only; off


def test_log_meta_table_stage_apply_drop_reconcile() -> None:
    table = LogMetaTable({1: 1000}, {1: {10: 400, 11: 300}})
    update = table.stage({1: 200, 2: 500}, {(1, 12): 200, (2, 10): 100}, {(1, 10): 100})
    assert table.usage(1) == LogUsage(1, 1000, 700)  # staged only
    table.apply(update)
    assert table.usage(1) == LogUsage(1, 1200, 800) and table.usage(2) == LogUsage(2, 500, 100)
    assert table.drop_ledgers([10]) == 400 and table.ledgers_in(1) == {11: 300, 12: 200}
    assert table.ledgers_in(2) == {}
    fix = table.reconcile({1: 1500, 3: 64})  # 1 grew (uncommitted bytes), 2 gone, 3 new
    assert dict(fix.totals) == {1: 1500, 3: 64} and fix.removed_logs == (2,)
    assert table.usages() == [LogUsage(1, 1500, 500), LogUsage(3, 64, 0)]
    table.apply(table.forget_live(1))
    assert table.usage(1) == LogUsage(1, 1500, 0) and table.live() == {}
