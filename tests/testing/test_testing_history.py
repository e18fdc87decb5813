"""The history recorder: records, classification of errors, persistence, concurrency."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from pathlib import Path

import pytest

from scriba import errors
from scriba.invariant import InvariantViolation
from scriba.testing.history import History, classify_error


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (errors.LedgerFencedError("fenced"), "info"),
        (errors.DeadlineExceededError("deadline"), "info"),
        (errors.UnavailableError("down"), "info"),
        (errors.MetadataUnavailableError("etcd down"), "info"),
        (TimeoutError(), "info"),
        (ConnectionResetError(), "info"),
        (errors.InternalError("?"), "info"),  # unknown outcome stays indeterminate
        (RuntimeError("bug?"), "info"),
        (errors.UnauthorizedError("bad password"), "fail"),
        (errors.BadRequestError("malformed"), "fail"),
        (errors.NoSuchLedgerError("gone"), "fail"),
        (errors.BadVersionError("lost cas"), "fail"),
    ],
)
def test_history_classify_error(exc: BaseException, kind: str) -> None:
    assert classify_error(exc) == kind


def test_history_classify_error_caller_definite() -> None:
    assert classify_error(errors.BookieReadOnlyError("ro")) == "info"
    assert classify_error(errors.BookieReadOnlyError("ro"), definite=(errors.BookieReadOnlyError,)) == "fail"
    # timeouts stay indeterminate whatever the caller says
    assert classify_error(errors.DeadlineExceededError("t"), definite=(errors.ScribaError,)) == "info"


def test_history_records_and_round_trips(tmp_path: Path) -> None:
    ticks = iter(range(100, 10_000, 7))
    history = History(lambda: next(ticks))
    a = history.invoke("p1", "add", b"\x00\xffpayload")
    history.ok(a, {"entry_id": 0})
    b = history.invoke(2, "add", b"two")
    history.info(b, errors.DeadlineExceededError("deadline passed"))
    c = history.invoke("p3", "cas", [1, 2])
    history.fail(c, "mismatch")
    d = history.invoke("p4", "read")  # never completes
    ops = history.ops
    assert [o.type for o in ops] == ["invoke", "ok", "invoke", "info", "invoke", "fail", "invoke"]
    assert [o.index for o in ops] == list(range(7))
    assert all(x.time_ns < y.time_ns for x, y in itertools.pairwise(ops))
    assert ops[3].error == "DeadlineExceededError: deadline passed" and ops[3].process == "2"
    assert [p.status for p in history.pairs()] == ["ok", "info", "fail", "info"]
    assert history.pairs()[3].completion is None and history.pairs()[3].invoke.op_id == d
    path = tmp_path / "history.jsonl"
    history.save(path)
    lines = path.read_text().splitlines()
    assert len(lines) == 7 and json.loads(lines[0])["type"] == "invoke"
    loaded = History.load(path)
    assert loaded.ops[0].value == b"\x00\xffpayload"
    assert [o.to_json() for o in loaded.ops][1:] == [o.to_json() for o in ops][1:]
    # a loaded history keeps recording: p4's read is still in flight
    loaded.ok(d, 5)
    assert loaded.pairs()[3].status == "ok"
    with pytest.raises(InvariantViolation):
        loaded.ok(a)  # a completed long ago


def test_history_op_context_manager_classifies() -> None:
    history = History()
    with history.op("p", "write", 1) as done:
        done.ok()
    with pytest.raises(errors.LedgerFencedError), history.op("p", "write", 2):
        raise errors.LedgerFencedError("fenced")
    with pytest.raises(errors.UnauthorizedError), history.op("p", "write", 3):
        raise errors.UnauthorizedError("no")
    with history.op("p", "write", 4):
        pass  # no result: indeterminate
    assert [p.status for p in history.pairs()] == ["ok", "info", "fail", "info"]
    assert history.pairs()[1].completion is not None
    assert history.pairs()[1].completion.error == "LedgerFencedError: fenced"


def test_history_is_bounded() -> None:
    history = History(ops_max=3)
    op_id = history.invoke("p", "w", 1)
    history.ok(op_id)
    history.invoke("p", "w", 2)
    with pytest.raises(InvariantViolation, match="history is full"):
        history.invoke("q", "w", 3)


def test_history_threads_record_consistently() -> None:
    history = History()
    per_thread = 300

    def worker(name: str) -> None:
        for i in range(per_thread):
            with history.op(name, "add", f"{name}-{i}") as done:
                done.ok(i)

    threads = [threading.Thread(target=worker, args=(f"t{k}",)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    ops = history.ops
    assert len(ops) == 8 * per_thread * 2
    assert sorted(o.index for o in ops) == list(range(len(ops)))
    assert all(x.time_ns <= y.time_ns for x, y in itertools.pairwise(ops))
    pairs = history.pairs()
    assert len({p.invoke.op_id for p in pairs}) == len(pairs) == 8 * per_thread
    assert all(p.status == "ok" and p.completion is not None and p.completion.time_ns >= p.invoke.time_ns for p in pairs)


async def test_history_asyncio_tasks_record_consistently() -> None:
    history = History()

    async def client(name: str) -> None:
        for i in range(100):
            op_id = history.invoke(name, "add", i)
            await asyncio.sleep(0)
            if i % 10 == 9:
                history.error(op_id, errors.DeadlineExceededError("late"))
            else:
                history.ok(op_id)

    await asyncio.wait_for(asyncio.gather(*(client(f"c{k}") for k in range(10))), 30)
    statuses = [p.status for p in history.pairs()]
    assert len(statuses) == 1000
    assert statuses.count("info") == 100 and statuses.count("ok") == 900


def test_history_merge_orders_by_time_and_renumbers(tmp_path: Path) -> None:
    clock = iter(range(0, 1000, 10))
    shared = lambda: next(clock)  # noqa: E731 - one clock, as CLOCK_MONOTONIC is across processes
    a, b = History(shared), History(shared)
    a1 = a.invoke("a", "add", 1)
    b1 = b.invoke("b", "add", 2)
    a.ok(a1)
    a2 = a.invoke("a", "add", 3)  # never completes
    b.info(b1, "timeout")
    a.save(tmp_path / "a.jsonl")
    b.save(tmp_path / "b.jsonl")
    merged = History.merge([History.load(tmp_path / "a.jsonl"), History.load(tmp_path / "b.jsonl")])
    ops = merged.ops
    assert [(o.process, o.type, o.value if o.type == "invoke" else None) for o in ops] == [
        ("a", "invoke", 1), ("b", "invoke", 2), ("a", "ok", None), ("a", "invoke", 3), ("b", "info", None),
    ]
    assert [o.index for o in ops] == list(range(5))
    assert [p.status for p in merged.pairs()] == ["ok", "info", "info"]
    assert len({p.invoke.op_id for p in merged.pairs()}) == 3
    assert a1 == b1 == 0 and a2 == 1  # the inputs reused op ids; the merge did not
    with pytest.raises(InvariantViolation, match="two histories"):
        History.merge([a, a])
