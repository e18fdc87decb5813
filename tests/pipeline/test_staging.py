"""The exactly-once write's staging rules (I/O-free): the commit point and the collector's plan."""

from __future__ import annotations

import pytest

from scriba.errors import BadRequestError
from scriba.pipeline.staging import (
    Collect,
    DeleteLoose,
    RollForward,
    StagedLedger,
    StagingRecord,
    StagingRow,
    begin_commit,
    plan_gc,
    staging_key,
)

GRACE_MS = 1000


def _row(job: str, created_ms: int, state: str = "staging", ledgers: tuple[int, ...] = ()) -> StagingRow:
    record = StagingRecord(job, "a/b/s", created_ms, "h:1", state, ledgers)  # type: ignore[arg-type]
    return StagingRow(staging_key("a/b/s", job), 7, record)


def test_record_round_trip_key_and_commit_point() -> None:
    rec = StagingRecord("j1", "a/b/s", 5, "h:1")
    assert StagingRecord.from_bytes(rec.to_bytes()) == rec
    assert staging_key("a/b/s", "j1") == "pipeline/staging/a.b/s/j1"
    committing = begin_commit(rec, [3, 4])
    assert committing.state == "committing" and committing.ledgers == (3, 4)
    assert begin_commit(committing, [3, 4]) is committing  # a repeated commit
    with pytest.raises(BadRequestError, match="already committing"):
        begin_commit(committing, [3])
    with pytest.raises(BadRequestError, match="unknown state"):
        StagingRecord.from_bytes(rec.to_bytes().replace(b'"staging"', b'"done"'))


def test_plan_collects_old_staging_rolls_forward_committing_and_keeps_young() -> None:
    now = 10_000
    ledgers = [StagedLedger(1, "old", "a/b/s", 0), StagedLedger(2, "old", "a/b/s", 0),
               StagedLedger(3, "young", "a/b/s", 0), StagedLedger(4, "done", "a/b/s", 0),
               StagedLedger(5, "done", "a/b/s", 0), StagedLedger(6, "gone", "a/b/s", 0),
               StagedLedger(7, "gone", "a/b/s", now - 10), StagedLedger(8, "adopted", "a/b/s", 0)]
    rows = [_row("old", 0), _row("young", now - 10), _row("done", 0, "committing", (4,))]
    steps = plan_gc(ledgers, rows, {"a/b/s": {8}}, now_ms=now, grace_ms=GRACE_MS)
    assert steps == [
        Collect(rows[0].key, 7, rows[0].record, (1, 2)),
        RollForward(rows[2].key, 7, rows[2].record, (5,)),
        DeleteLoose((6,)),  # 7 is younger than the grace; 8 is a segment of its stream
    ]
    # negative control: with a grace longer than everything's age nothing is touched
    assert plan_gc(ledgers, rows, {"a/b/s": {8}}, now_ms=now, grace_ms=now + 1) == []


def test_plan_never_deletes_what_a_committing_record_lists() -> None:
    """A streaming batch's commit point deletes its tasks' records and lists their ledgers in the
    batch's committing record: those ledgers have no job record but are not loose."""
    ledgers = [StagedLedger(1, "task1", "a/b/s", 0), StagedLedger(2, "task2", "a/b/s", 0)]
    batch = _row("q1-0", 10_000, "committing", (1,))  # young: not rolled forward yet
    assert plan_gc(ledgers, [batch], {"a/b/s": set()}, now_ms=10_000, grace_ms=GRACE_MS) == [DeleteLoose((2,))]
