"""The stream writer's core (``scriba.stream.writer_core``) driven by hand: every rule one event at a time."""

from __future__ import annotations

from typing import Any

import pytest

from scriba.clock import ManualClock
from scriba.errors import (
    ConfigError,
    DeadlineExceededError,
    LedgerFencedError,
    RecordTooLargeError,
    StreamWriterClosedError,
    TooManyRequestsError,
    WriterFencedError,
)
from scriba.stream import record_set
from scriba.stream.segments import SegmentSummary, StreamRecord, add_segment
from scriba.stream.settings import StreamSettings
from scriba.stream.writer_core import (
    AbandonSegment,
    CloseSegment,
    ConfirmRecords,
    CreateLedger,
    DiscardLedger,
    FailRecords,
    RecoverSegment,
    SendSet,
    StartRoll,
    UpdateStream,
    WriterCore,
    WriterFailed,
    add_segment_steps,
    as_stream_error,
    open_steps,
)


def core(*, inflight: int = 4, waiting: int = 100, **settings: Any) -> WriterCore[str]:
    s = StreamSettings(**{"record_set_bytes_max": 1024, **settings}).validate()
    return WriterCore("ns/s", s, ManualClock(), segment_seq=0, publish_ms=0, sets_inflight_max=inflight,
                      records_waiting_max=waiting)


def queue(c: WriterCore[str], *names: str, size: int = 10) -> None:
    for name in names:
        c.append(c.check_record(name.encode().ljust(size, b"."), None), name)


def of(effects: list[Any], kind: type) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


def test_packs_waiting_records_into_sets_bounded_by_bytes_and_sets_in_flight() -> None:
    c = core(inflight=2)
    queue(c, *(f"r{i}" for i in range(10)), size=300)  # 306 bytes each: 3 fit in a 1 KiB set
    sends = of(c.flush(), SendSet)
    assert len(sends) == 2 and c.waiting == 4  # two sets in flight, the rest waits
    header, _items = record_set.decode(sends[1].data)
    assert header.count == 3 and header.records_before == 3 and header.bytes_before == len(sends[0].data)
    done = c.on_set_confirmed(sends[0].set_id, 0)
    assert done == [ConfirmRecords(0, 0, ["r0", "r1", "r2"])]
    more = of(c.flush(), SendSet)
    assert len(more) == 1 and c.waiting == 1


def test_confirms_leave_in_order_and_the_entry_must_match() -> None:
    c = core()
    queue(c, "a")
    (first,) = of(c.flush(), SendSet)
    queue(c, "b")
    (second,) = of(c.flush(), SendSet)
    assert c.on_set_confirmed(first.set_id, 0) == [ConfirmRecords(0, 0, ["a"])]
    from scriba.invariant import InvariantViolation

    with pytest.raises(InvariantViolation, match="expected 1"):
        c.on_set_confirmed(second.set_id, 7)


def test_a_failed_set_fails_every_later_record_and_the_writer() -> None:
    c = core()
    queue(c, "a")
    (a,) = of(c.flush(), SendSet)
    queue(c, "b")
    (b,) = of(c.flush(), SendSet)
    queue(c, "c")  # still waiting
    error = as_stream_error(LedgerFencedError("fenced"), "ns/s")
    assert isinstance(error, WriterFencedError)
    effects = c.on_set_failed(a.set_id, error)
    assert of(effects, WriterFailed) == [WriterFailed(error)]
    assert {h for e in of(effects, FailRecords) for h in e.handles} == {"a", "c"}
    assert c.on_set_confirmed(b.set_id, 1) == [FailRecords(["b"], error)]  # landed, but after a failure
    with pytest.raises(WriterFencedError):
        queue(c, "d")


def test_a_roll_that_fails_unfenced_lets_sets_in_flight_confirm() -> None:
    c = core(segment_records_max=2)
    queue(c, "a", "b")
    effects = c.flush()
    (send,) = of(effects, SendSet)
    assert of(effects, StartRoll) == [StartRoll("records", 0)]
    queue(c, "c")
    assert of(c.flush(), SendSet) == []  # nothing more to the rolling segment
    failed = c.on_roll_failed(DeadlineExceededError("store slow"))
    assert [h for e in of(failed, FailRecords) for h in e.handles] == ["c"]
    assert c.on_set_confirmed(send.set_id, 0) == [ConfirmRecords(0, 0, ["a", "b"])]


def test_a_fenced_roll_or_a_lost_lock_confirms_nothing_more() -> None:
    for fail in ("roll", "lock"):
        c = core()
        queue(c, "a")
        (send,) = of(c.flush(), SendSet)
        if fail == "roll":
            c.on_roll_failed(WriterFencedError("newer token"))
        else:
            c.on_lock_lost("session expired")
        (result,) = c.on_set_confirmed(send.set_id, 0)
        assert isinstance(result, FailRecords) and isinstance(result.error, WriterFencedError)


def test_roll_switches_after_the_old_segment_drains_and_defers_the_next_roll_until_closed() -> None:
    c = core(segment_records_max=1, inflight=4)
    queue(c, "a")
    effects = c.flush()
    (a,) = of(effects, SendSet)
    assert of(effects, StartRoll) == [StartRoll("records", 0)]
    queue(c, "b", "c")
    assert c.on_segment_added(1) == []  # "a" still in flight: no switch yet
    assert c.segment_seq == 0 and of(c.flush(), SendSet) == []
    effects = c.on_set_confirmed(a.set_id, 0)
    assert effects[0] == ConfirmRecords(0, 0, ["a"])
    (close,) = of(effects, CloseSegment)
    assert close.segment_seq == 0 and close.summary.record_count == 1 and close.summary.last_entry_id == 0
    assert c.segment_seq == 1
    effects = c.flush()
    (b,) = of(effects, SendSet)
    assert b.segment_seq == 1 and len(record_set.decode(b.data)[1]) == 2
    assert of(effects, StartRoll) == []  # segment 0 is not closed yet: the next roll waits
    assert not c.idle
    assert c.on_segment_closed(0) == [StartRoll("records", 1)]


def test_a_writer_failing_during_a_roll_abandons_the_new_segment() -> None:
    c = core(segment_records_max=1)
    queue(c, "a")
    (_a, _roll) = c.flush()
    assert c.on_segment_added(1) == []
    effects = c.on_lock_lost("session expired")
    assert AbandonSegment(1) in effects
    c2 = core(segment_records_max=1)
    queue(c2, "a")
    c2.flush()
    c2.on_lock_lost("gone")
    assert c2.on_segment_added(1) == [AbandonSegment(1)]


def test_close_gives_the_segment_summary_and_refuses_appends() -> None:
    clock = ManualClock()
    c: WriterCore[str] = WriterCore("ns/s", StreamSettings(), clock, segment_seq=3, publish_ms=0,
                                    sets_inflight_max=4, records_waiting_max=10)
    c.append(c.check_record(b"x" * 10, {"k": b"v"}), "a")
    (send,) = of(c.flush(), SendSet)
    c.begin_close()
    with pytest.raises(StreamWriterClosedError, match="close"):
        c.append(c.check_record(b"late", None), "late")
    assert not c.idle
    c.on_set_confirmed(send.set_id, 0)
    assert c.idle
    close = c.close()
    header = record_set.decode_header(send.data)
    assert close == CloseSegment(3, SegmentSummary(0, 0, 1, len(send.data), header.publish_time_ms))
    assert header.publish_time_ms == int(clock.wall() * 1000)


def test_bad_records_and_full_queue_are_typed_and_queue_nothing() -> None:
    c = core(waiting=2, record_bytes_max=100)
    with pytest.raises(ConfigError):
        c.check_record("text", None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        c.check_record(b"x", {"k": "str"})  # type: ignore[dict-item]
    with pytest.raises(RecordTooLargeError):
        c.check_record(b"x" * 200, None)
    assert c.check_record(bytearray(b"ok"), None)[0] == b"ok"
    queue(c, "a", "b")
    with pytest.raises(TooManyRequestsError):
        queue(c, "c")
    assert c.waiting == 2 and c.room() == 0


def test_publish_times_never_go_back() -> None:
    clock = ManualClock()
    c: WriterCore[str] = WriterCore("ns/s", StreamSettings(), clock, segment_seq=0, publish_ms=int(clock.wall() * 1000) + 5000,
                                    sets_inflight_max=4, records_waiting_max=10)
    queue(c, "a")
    (send,) = of(c.flush(), SendSet)
    assert record_set.decode_header(send.data).publish_time_ms == int(clock.wall() * 1000) + 5000


# --- opening and roll steps ------------------------------------------------------------------
def _drive(steps: Any, answers: dict[type, Any]) -> tuple[list[Any], Any]:
    """Run the steps, answering each from ``answers`` (a callable gets the step); returns
    the steps seen and the result (or the exception raised)."""
    seen: list[Any] = []
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(result) if error is None else steps.throw(error)
        except StopIteration as stop:
            return seen, stop.value
        except BaseException as exc:
            return seen, exc
        seen.append(step)
        answer = answers[type(step)]
        result, error = None, None
        try:
            result = answer(step) if callable(answer) else answer
        except BaseException as exc:
            error = exc


def test_open_steps_fence_then_recover_every_open_segment_then_add_one() -> None:
    record = StreamRecord("s", writer_epoch=3)
    record = add_segment(record, 3, 11, 0)
    record = add_segment(record, 3, 12, 0)  # a roll that crashed after its CAS: two OPEN
    state = {"record": record}

    def update(step: UpdateStream) -> StreamRecord:
        if step.needs_update(state["record"]):
            state["record"] = step.transform(state["record"])
        return state["record"]

    summaries = {11: SegmentSummary(4, 0, 5, 100, 9), 12: SegmentSummary()}
    seen, result = _drive(open_steps(7, lambda: 1), {
        UpdateStream: update,
        RecoverSegment: lambda step: summaries[step.segment.ledger_id],
        CreateLedger: 13,
    })
    kinds = [type(s).__name__ for s in seen]
    assert kinds == ["UpdateStream", "RecoverSegment", "UpdateStream", "RecoverSegment", "UpdateStream",
                     "CreateLedger", "UpdateStream"]
    final, seq = result
    assert final.writer_epoch == 7 and seq == 2
    assert [s.summary for s in final.segments[:2]] == [summaries[11], summaries[12]]
    assert [s.is_open for s in final.segments] == [False, False, True]


def test_add_segment_steps_delete_the_ledger_only_when_the_cas_surely_failed() -> None:
    def fenced(step: UpdateStream) -> None:
        raise WriterFencedError("newer token")

    def slow(step: UpdateStream) -> None:
        raise DeadlineExceededError("no answer")

    for failing, delete in ((fenced, True), (slow, False)):
        seen, result = _drive(add_segment_steps(1, lambda: 0), {
            CreateLedger: 21, UpdateStream: failing, DiscardLedger: None,
        })
        assert seen[-1] == DiscardLedger(21, delete=delete)
        assert isinstance(result, WriterFencedError | DeadlineExceededError)


def test_append_all_queues_what_room_allows_in_order_with_one_handle() -> None:
    c = core(waiting=5, record_bytes_max=100)
    records = c.check_records([b"a", (b"b", {"k": b"v"}), bytearray(b"c"), b"d", b"e", b"f", b"g"])
    assert [r[0] for r in records] == [b"a", b"b", b"c", b"d", b"e", b"f", b"g"]
    assert records[1][2] == record_set.encoded_size(b"b", {"k": b"v"}) and records[0][2] == 7
    with pytest.raises(RecordTooLargeError):
        c.check_records([b"ok", b"x" * 200])
    assert c.append_all(records, "group") == 5 and c.room() == 0
    assert c.append_all(records[5:], "group") == 0
    (send,) = of(c.flush(), SendSet)
    assert c.append_all(records[5:], "group") == 2
    (confirmed,) = c.on_set_confirmed(send.set_id, 0)
    assert confirmed == ConfirmRecords(0, 0, ["group"] * 5)
    assert [p for p, _ in record_set.decode(send.data)[1]] == [b"a", b"b", b"c", b"d", b"e"]


def test_after_a_roll_failed_unfenced_a_failed_set_still_fails_every_later_one() -> None:
    """Sets in flight may confirm after an unfenced roll failure, but only until one fails:
    confirms leave in order, so nothing after a failed set may be confirmed."""
    c = core(inflight=4)
    queue(c, "a")
    (a,) = of(c.flush(), SendSet)
    queue(c, "b")
    (b,) = of(c.flush(), SendSet)
    c.on_roll_failed(DeadlineExceededError("store slow"))
    failed = c.on_set_failed(a.set_id, DeadlineExceededError("bookies slow"))
    assert [h for e in of(failed, FailRecords) for h in e.handles] == ["a"]
    (later,) = c.on_set_confirmed(b.set_id, 1)
    assert isinstance(later, FailRecords) and later.handles == ["b"]
