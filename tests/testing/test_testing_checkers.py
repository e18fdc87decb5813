"""Known-good and known-bad histories for every checker."""

from __future__ import annotations

import random
import time

import pytest

from scriba.errors import DeadlineExceededError, LedgerFencedError, UnauthorizedError
from scriba.invariant import InvariantViolation
from scriba.testing.checkers import (
    UNKNOWN,
    Applied,
    LogRead,
    Operation,
    ReplicaTrace,
    check_acked_set,
    check_acked_set_history,
    check_kv,
    check_log,
    check_register,
    check_rsm,
    operations_from_history,
)
from scriba.testing.history import History

INF = float("inf")


def op(process: str, f: str, arg: object, out: object, call: float, ret: float = INF) -> Operation:
    return Operation(process, f, arg, out, call, ret)


def _counter_clock() -> object:
    ticks = iter(range(0, 10**9, 10))
    return lambda: next(ticks)


# --- acked set ---------------------------------------------------------------------------


def test_checkers_acked_set_good_with_recovered_indeterminate() -> None:
    result = check_acked_set(attempted=range(10), acknowledged=range(8), read=range(9))
    assert result.ok, result.explain()
    assert result.recovered == frozenset({8})
    assert "OK" in result.explain()


def test_checkers_acked_set_finds_lost_and_unexpected() -> None:
    result = check_acked_set(attempted=range(10), acknowledged=range(8), read=[0, 1, 2, 3, 4, 6, 7, 42])
    assert not result.ok
    assert result.lost == frozenset({5})
    assert result.unexpected == frozenset({42})
    text = result.explain()
    assert "VIOLATED" in text and "lost (acknowledged, not read): 1 [5]" in text and "42" in text


def test_checkers_acked_set_from_history_rejected_but_read() -> None:
    history = History(_counter_clock())  # type: ignore[arg-type]
    for value in range(4):
        op_id = history.invoke("w", "add", value)
        if value == 0:
            history.ok(op_id)
        elif value == 1:
            history.fail(op_id, UnauthorizedError("bad password"))
        elif value == 2:
            history.info(op_id, DeadlineExceededError("deadline"))
        # value 3 never completes: indeterminate
    good = check_acked_set_history(history, read=[0, 2])
    assert good.ok, good.explain()
    assert good.recovered == frozenset({2})
    bad = check_acked_set_history(history, read=[0, 1])  # 1 was definitely rejected
    assert not bad.ok and bad.rejected_but_read == frozenset({1})
    assert not check_acked_set_history(history, read=[2, 3]).ok  # acked 0 lost


# --- log ---------------------------------------------------------------------------------


def _values(n: int) -> list[bytes]:
    return [f"entry-{i}".encode() for i in range(n)]


def test_checkers_log_good_closed_ledger() -> None:
    values = _values(10)
    confirmed = {i: values[i] for i in range(8)}  # 8 and 9 were indeterminate, recovery kept them
    reads = [
        LogRead.from_values("r1", values, closed_last=9),
        LogRead.from_values("r2", values, closed_last=9),
        LogRead.from_values("tailer", values[:6]),  # an open-ledger reader may see a prefix
        LogRead.from_values("late", values[4:], first=4, closed_last=9),
    ]
    result = check_log(reads, confirmed, attempted=values, closed_last=9)
    assert result.ok, result.explain()
    assert result.positions == 10 and result.closed_last == 9


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("conflict", "position 3: r2 read"),
        ("gap", "expected position 3, got 4"),
        ("disagree", "disagree on the closed ledger's last position"),
        ("confirmed_beyond", "position 9 was confirmed but the ledger closed at 7"),
        ("short_read", "read only up to 5"),
        ("beyond_close", "beyond the closed last position"),
        ("never_attempted", "was never attempted"),
        ("confirmed_mismatch", "writer (confirmed)"),
    ],
)
def test_checkers_log_bad(case: str, needle: str) -> None:
    values = _values(10)
    confirmed = {i: values[i] for i in range(8)}
    r1 = LogRead.from_values("r1", values[:8], closed_last=7)
    closed = 7
    other = LogRead.from_values("r2", values[:8], closed_last=7)
    attempted: list[bytes] = values
    if case == "conflict":
        other = LogRead.from_values("r2", [*values[:3], b"forged", *values[4:8]], closed_last=7)
        attempted = [*values, b"forged"]
    elif case == "gap":
        other = LogRead("r2", tuple((i, values[i]) for i in (0, 1, 2, 4, 5, 6, 7)), closed_last=7)
    elif case == "disagree":
        other = LogRead.from_values("r2", values[:7], closed_last=6)
    elif case == "confirmed_beyond":
        confirmed = {i: values[i] for i in range(10)}
    elif case == "short_read":
        other = LogRead.from_values("r2", values[:6], closed_last=7)
    elif case == "beyond_close":
        other = LogRead.from_values("r2", values[:9], closed_last=None)
    elif case == "never_attempted":
        other = LogRead.from_values("r2", [*values[:7], b"invented"], closed_last=7)
        confirmed = {i: values[i] for i in range(7)}
    elif case == "confirmed_mismatch":
        confirmed = {**confirmed, 2: b"other"}
    result = check_log([r1, other], confirmed, attempted=attempted, closed_last=closed)
    assert not result.ok
    assert needle in result.explain(), result.explain()


@pytest.mark.parametrize("who_saw_the_close", ["metadata", "readers", "both"])
def test_checkers_log_reports_a_close_one_entry_early(who_saw_the_close: str) -> None:
    """Confirmed 0..3, closed at 2: the most common lost write (a close one entry early)
    loses exactly the last confirmed entry, at ``closed_last + 1``."""
    values = _values(4)
    confirmed = {i: values[i] for i in range(4)}
    seen = 2 if who_saw_the_close in ("readers", "both") else None
    metadata = 2 if who_saw_the_close in ("metadata", "both") else None
    reads = [LogRead.from_values("r1", values[:3], closed_last=seen),
             LogRead.from_values("r2", values[:3], closed_last=seen)]
    result = check_log(reads, confirmed, attempted=values, closed_last=metadata)
    assert not result.ok and result.closed_last == 2
    assert result.violations == ("position 3 was confirmed but the ledger closed at 2 (confirmed entry lost)",)
    # the control: closed at 3, nothing is lost
    fine = check_log([LogRead.from_values("r1", values, closed_last=3)], confirmed, attempted=values, closed_last=3)
    assert fine.ok, fine.explain()


# --- linearizability: registers ----------------------------------------------------------


def test_checkers_register_good_concurrent_and_sequential() -> None:
    ops = [
        op("a", "write", 1, None, 0, 10),
        op("b", "read", None, 1, 5, 15),  # concurrent with the write: may see it
        op("c", "read", None, None, 2, 4),  # ... or not
        op("a", "write", 2, None, 20, 30),
        op("b", "read", None, 2, 31, 40),
        op("c", "cas", (2, 3), True, 41, 50),
        op("a", "cas", (2, 4), False, 51, 60),
        op("b", "read", None, 3, 61, 70),
    ]
    result = check_register(ops)
    assert result.ok, result.explain()


def test_checkers_register_stale_read_after_write_is_illegal() -> None:
    ops = [op("a", "write", 1, None, 0, 10), op("b", "read", None, None, 20, 30)]
    result = check_register(ops)
    assert not result.ok and result.verdict == "illegal"
    text = result.explain()
    assert "NOT LINEARIZABLE" in text and "minimal counter-example" in text
    assert "b: read() -> None" in text


def test_checkers_register_new_old_inversion_is_illegal_and_shrunk() -> None:
    # Two reads, one after the other, both concurrent with write(1): seeing 1 then 0 is not
    # linearizable. Unrelated reads around it are dropped from the counter-example.
    ops = [
        op("w", "write", 0, None, 0, 1),
        op("x", "read", None, 0, 2, 3),
        op("w", "write", 1, None, 10, 100),
        op("r", "read", None, 1, 20, 30),
        op("s", "read", None, 0, 40, 50),
        op("x", "read", None, 0, 5, 8),
        op("y", "read", None, 1, 120, 130),
    ]
    result = check_register(ops)
    assert result.verdict == "illegal", result.explain()
    ce = result.partitions[0].counterexample
    assert {(o.process, o.f, o.out) for o in ce if o.f == "read"} == {("r", "read", 1), ("s", "read", 0)}
    assert len(ce) < len(ops)
    assert len(ce) == 4  # both writes, both inverted reads


def test_checkers_register_cas_double_success_is_illegal() -> None:
    ops = [
        op("a", "write", 0, None, 0, 1),
        op("b", "cas", (0, 1), True, 2, 10),
        op("c", "cas", (0, 2), True, 3, 11),
    ]
    assert check_register(ops).verdict == "illegal"
    mismatch = [op("a", "write", 0, None, 0, 1), op("b", "cas", (0, 1), False, 2, 3)]
    assert check_register(mismatch).verdict == "illegal"


def test_checkers_register_info_write_may_or_may_not_take_effect() -> None:
    base = [op("a", "write", 0, None, 0, 1), op("a2", "write", 1, UNKNOWN, 2)]  # indeterminate
    took_effect = [*base, op("b", "read", None, 1, 100, 110)]
    did_not = [*base, op("b", "read", None, 0, 100, 110)]
    assert check_register(took_effect).ok
    assert check_register(did_not).ok
    # ... but once seen it cannot be undone
    flip = [*base, op("b", "read", None, 1, 100, 110), op("b", "read", None, 0, 120, 130)]
    assert check_register(flip).verdict == "illegal"
    # an indeterminate read constrains nothing
    assert check_register([*base, op("c", "read", None, UNKNOWN, 3)]).ok


def test_checkers_register_from_history_with_info_and_fail() -> None:
    history = History(_counter_clock())  # type: ignore[arg-type]
    w = history.invoke("p1", "write", 5)
    history.ok(w)
    f = history.invoke("p1", "write", 6)
    history.fail(f, UnauthorizedError("no"))  # did not happen: dropped
    i = history.invoke("p2", "write", 7)
    assert history.error(i, LedgerFencedError("fenced")) == "info"
    r = history.invoke("p3", "read")
    history.ok(r, 7)
    assert len(operations_from_history(history)) == 3
    assert check_register(history).ok
    r2 = history.invoke("p3", "read")
    history.ok(r2, 6)  # the failed write's value appears: illegal
    assert check_register(history).verdict == "illegal"


def test_checkers_budget_exhaustion_is_unknown_and_fails() -> None:
    # 14 concurrent writes of distinct values, then reads that no order explains: the search
    # must try many orders before giving up; a tiny budget runs out first.
    writes = [op(f"w{i}", "write", i, None, 0, 100) for i in range(10)]
    reads = [op("r", "read", None, 9, 200, 210), op("r", "read", None, 0, 220, 230)]
    result = check_register(writes + reads, steps_max=500)
    assert result.verdict == "unknown"
    assert not result.ok
    assert "step budget of 500 exhausted" in result.explain()
    decided = check_register(writes + reads)  # the default budget is enough to decide it
    assert decided.verdict == "illegal" and decided.partitions[0].steps > 500


def test_checkers_register_random_linearizable_histories_pass_and_mutations_fail() -> None:
    for seed in range(30):
        rng = random.Random(seed)
        ops, value = [], None
        events: list[float] = []
        for i in range(40):  # a linearization point every 10 units; intervals overlap around it
            point = i * 10.0
            call, ret = point - rng.uniform(0, 25), point + rng.uniform(0, 25)
            events.append(point)
            if rng.random() < 0.5:
                value = rng.randrange(5)
                ops.append(op(f"p{i % 4}-{i}", "write", value, None, call, ret))
            else:
                ops.append(op(f"p{i % 4}-{i}", "read", None, value, call, ret))
        result = check_register(ops)
        assert result.ok, f"seed {seed}: {result.explain()}"
        reads = [k for k, o in enumerate(ops) if o.f == "read"]
        victim = rng.choice(reads)
        ops[victim] = Operation(ops[victim].process, "read", None, 99, ops[victim].call, ops[victim].ret)
        assert check_register(ops).verdict == "illegal", f"seed {seed}"


def test_checkers_register_long_history_is_fast() -> None:
    ops = []
    for i in range(2000):
        ops.append(op("w", "write", i, None, i * 10, i * 10 + 6))
        ops.append(op("r", "read", None, i, i * 10 + 4, i * 10 + 9))
    start = time.monotonic()
    assert check_register(ops).ok
    assert time.monotonic() - start < 10.0


# --- linearizability: KV -----------------------------------------------------------------


def test_checkers_kv_per_key_good_and_bad() -> None:
    good = [
        op("a", "put", ("x", 1), None, 0, 10),
        op("b", "put", ("y", 2), None, 0, 10),
        op("c", "get", "x", 1, 11, 12),
        op("c", "get", "y", 2, 13, 14),
        op("d", "get", "z", None, 15, 16),
        op("a", "cas", ("x", 1, 3), True, 20, 30),
        op("b", "get", "x", 3, 31, 32),
    ]
    result = check_kv(good)
    assert result.ok, result.explain()
    assert len(result.partitions) == 3
    bad = [*good, op("e", "get", "y", None, 40, 41)]  # y's write was lost
    result = check_kv(bad)
    assert result.verdict == "illegal"
    failing = [p for p in result.partitions if p.verdict != "ok"]
    assert [p.label for p in failing] == ["key 'y'"]
    assert "key 'y': NOT LINEARIZABLE" in result.explain()


def test_checkers_kv_from_history_json_round_trip(tmp_path: object) -> None:
    history = History(_counter_clock())  # type: ignore[arg-type]
    w = history.invoke("p1", "put", ["k", "v1"])
    history.ok(w)
    r = history.invoke("p2", "get", "k")
    history.ok(r, "v1")
    loaded = History.from_jsonl(history.to_jsonl())  # lists come back as lists: frozen by the checker
    assert check_kv(loaded).ok
    r2 = history.invoke("p2", "get", "k")
    history.ok(r2, "v0")
    assert not check_kv(History.from_jsonl(history.to_jsonl())).ok


# --- RSM convergence -----------------------------------------------------------------------


def _trace(name: str, n: int, *, digest_at: dict[int, str] | None = None, start: int = 0) -> ReplicaTrace:
    applied = [Applied(p, f"cmd-{p}", f"digest-{p}") for p in range(start, n)]
    return ReplicaTrace.build(name, applied, digest_at)


def test_checkers_rsm_good_with_lagging_and_restored_replica() -> None:
    traces = [
        _trace("leader", 20),
        _trace("follower", 15),  # lagging is fine
        _trace("restored", 20, start=12, digest_at={11: "digest-11"}),  # snapshot at 11, then applies
    ]
    result = check_rsm(traces)
    assert result.ok, result.explain()
    assert result.compared_digests > 0


def test_checkers_rsm_bad() -> None:
    divergent = ReplicaTrace.build("b", [*_trace("b", 5).applied, Applied(5, "cmd-5", "other")])
    result = check_rsm([_trace("a", 10), divergent])
    assert not result.ok and "state digest" in result.explain()
    reordered = ReplicaTrace.build("b", [Applied(0, "cmd-1"), Applied(1, "cmd-0")])
    assert "applied 'cmd-1' but a applied 'cmd-0'" in check_rsm([_trace("a", 3), reordered]).explain()
    twice = ReplicaTrace.build("a", [Applied(0, "c0"), Applied(1, "c1"), Applied(2, "c1")])
    assert "applied twice" in check_rsm([twice]).explain()
    backwards = ReplicaTrace.build("a", [Applied(0, "c0"), Applied(2, "c2"), Applied(1, "c1")])
    assert "not increasing" in check_rsm([backwards]).explain()


# --- history recorder --------------------------------------------------------------------


def test_checkers_history_one_op_in_flight_per_process() -> None:
    history = History()
    history.invoke("p", "write", 1)
    with pytest.raises(InvariantViolation):
        history.invoke("p", "write", 2)
    with pytest.raises(InvariantViolation):
        history.ok(12345)


def _random_linearizable_history(rng: random.Random, n: int) -> list[Operation]:
    """Ops executed one at a time at points 10 apart, with intervals overlapping the points.
    Some ops are indeterminate (they did or did not take effect; return at infinity)."""
    ops, state = [], None
    for i in range(n):
        point = i * 10.0
        call, ret = point - rng.uniform(0, 25), point + rng.uniform(0, 25)
        process = f"p{i}"
        info = rng.random() < 0.1
        kind = rng.random()
        if kind < 0.4:
            ops.append(op(process, "read", None, UNKNOWN if info else state, call, INF if info else ret))
            continue
        if kind < 0.7:
            value = rng.randrange(4)
            if not info or rng.random() < 0.5:
                state = value
            ops.append(op(process, "write", value, UNKNOWN if info else None, call, INF if info else ret))
            continue
        old, new = rng.choice([state, rng.randrange(4)]), rng.randrange(4)
        if info:
            if old == state and rng.random() < 0.5:
                state = new
            ops.append(op(process, "cas", (old, new), UNKNOWN, call, INF))
        else:
            ops.append(op(process, "cas", (old, new), old == state, call, ret))
            state = new if old == state else state
    return ops


def test_checkers_shrink_removals_are_sound() -> None:
    """Removing what the shrinker may remove, again and again, never breaks a linearizable history
    (so a shrunk counter-example is a real witness against the original)."""
    from scriba.testing.checkers.linearizability import RegisterModel, _removable

    model = RegisterModel()
    removed_writes = removed = 0
    for seed in range(80):
        rng = random.Random(seed)
        current = _random_linearizable_history(rng, 16)
        assert check_register(current).ok, f"seed {seed}: generator produced a bad history"
        while candidates := _removable(current, model):
            i = rng.choice(candidates)
            gone = current[i]
            current = current[:i] + current[i + 1 :]
            result = check_register(current)
            assert result.ok, f"seed {seed}: removing {gone} broke a linearizable history\n{result.explain()}"
            removed += 1
            removed_writes += not model.is_read(gone)
    assert removed > 500 and removed_writes > 50


def test_checkers_large_history_gets_a_minimal_counterexample() -> None:
    ops = []
    for i in range(2000):
        ops.append(op("w", "write", i, None, i * 10, i * 10 + 6))
        ops.append(op("r", "read", None, i if i != 1500 else 1498, i * 10 + 4, i * 10 + 9))
    start = time.monotonic()
    result = check_register(ops)
    assert result.verdict == "illegal"
    ce = result.partitions[0].counterexample
    assert [(o.f, o.arg, o.out) for o in ce] == [("write", 1498, None), ("write", 1499, None), ("read", None, 1498)]
    assert time.monotonic() - start < 10.0


def test_checkers_kv_5000_operations_with_indeterminate_ops_is_fast() -> None:
    rng = random.Random(5)
    state: dict[int, int] = {}
    ops = []
    for i in range(5000):  # 8 keys, ~20 operations in flight at any time, 2% indeterminate
        call, ret = i - rng.uniform(0, 20), i + rng.uniform(0, 20)
        key, info = rng.randrange(8), rng.random() < 0.02
        if rng.random() < 0.5:
            if not info:
                ops.append(op(f"p{i}", "get", key, state.get(key), call, ret))
        elif not info:
            state[key] = i
            ops.append(op(f"p{i}", "put", (key, i), None, call, ret))
        else:
            if rng.random() < 0.5:
                state[key] = i
            ops.append(op(f"p{i}", "put", (key, i), UNKNOWN, call))
    start = time.monotonic()
    result = check_kv(ops)
    assert result.ok, result.explain()
    assert time.monotonic() - start < 20.0
