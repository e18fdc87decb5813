"""The stream's I/O-free core: positions, record sets, settings, names and segment rules."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scriba.errors import (
    BadRequestError,
    ConfigError,
    CursorRegressionError,
    InvalidPositionError,
    PositionOutOfRangeError,
    RecordSetCorruptError,
    StreamNotFoundError,
    WriterFencedError,
)
from scriba.invariant import InvariantViolation
from scriba.stream import record_set
from scriba.stream.position import Position
from scriba.stream.segments import (
    CursorRecord,
    NamespaceRecord,
    Segment,
    SegmentState,
    SegmentStats,
    SegmentSummary,
    StagedSegment,
    StreamRecord,
    StreamState,
    add_segment,
    adopt_segments,
    advance_cursor,
    close_segment,
    fence,
    finish_deletes,
    lock_name,
    namespace_key,
    open_segments,
    retention_point,
    roll_due,
    stream_key,
    truncate,
)
from scriba.stream.settings import (
    StreamSettings,
    check_name,
    check_namespace_name,
    effective_settings,
)

positions = st.builds(Position, st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))


# --- positions ----------------------------------------------------------------------
@given(positions)
def test_position_text_round_trip(p: Position) -> None:
    assert Position.parse(str(p)) == p
    assert hash(Position.parse(str(p))) == hash(p)


@given(positions, positions)
def test_position_order_is_tuple_order(a: Position, b: Position) -> None:
    ta = (a.segment_seq, a.entry_id, a.slot)
    tb = (b.segment_seq, b.entry_id, b.slot)
    assert (a < b) == (ta < tb)
    assert (a == b) == (ta == tb)


def test_position_examples_and_successor() -> None:
    p = Position.parse("3:1200:0")
    assert p == Position(3, 1200, 0) and str(p) == "3:1200:0"
    assert p.successor() == Position(3, 1200, 1) > p
    assert Position(3, 1200, 99) < Position(3, 1201, 0) < Position(4, 0, 0)


@pytest.mark.parametrize("text", ["", "3", "3:1", "3:1:2:4", "a:b:c", "-1:0:0", "1:2:x", " : : ", 12, None,
                                  "99999999999999999999:0:0", "3.0:1:2"])
def test_position_bad_text_is_typed_error(text: object) -> None:
    with pytest.raises(InvalidPositionError):
        Position.parse(text)  # type: ignore[arg-type]


@pytest.mark.parametrize("parts", [(-1, 0, 0), (0, -1, 0), (0, 0, 2**63), (1.0, 0, 0), ("1", 0, 0), (True, 0, 0)])
def test_position_bad_parts(parts: tuple[object, object, object]) -> None:
    with pytest.raises(InvalidPositionError):
        Position(*parts)  # type: ignore[arg-type]


# --- record sets --------------------------------------------------------------------
header_maps = st.dictionaries(st.text(min_size=1, max_size=20), st.binary(max_size=40), max_size=5)
records = st.lists(st.tuples(st.binary(max_size=300), header_maps), min_size=1, max_size=40)


@given(records, st.integers(0, 2**40), st.integers(0, 2**40), st.integers(0, 2**50))
def test_record_set_round_trip(recs: list[tuple[bytes, dict[str, bytes]]], before: int, bytes_before: int,
                               publish: int) -> None:
    inputs = [(p, record_set.check_headers(h)) for p, h in recs]
    data = record_set.encode(inputs, records_before=before, bytes_before=bytes_before, publish_time_ms=publish)
    assert len(data) == record_set.HEADER_BYTES + sum(record_set.encoded_size(p, h) for p, h in inputs)
    header, got = record_set.decode(data)
    assert header == record_set.RecordSetHeader(len(recs), before, bytes_before, publish)
    assert [(p, dict(h)) for p, h in got] == [(p, dict(h)) for p, h in recs]


@settings(max_examples=300)
@given(records, st.data())
def test_record_set_every_cut_or_extension_is_corrupt(recs: list[tuple[bytes, dict[str, bytes]]],
                                                        data: st.DataObject) -> None:
    inputs = [(p, record_set.check_headers(h)) for p, h in recs]
    encoded = record_set.encode(inputs, records_before=0, bytes_before=0, publish_time_ms=1)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(RecordSetCorruptError):
        record_set.decode(encoded[:cut])
    with pytest.raises(RecordSetCorruptError):
        record_set.decode(encoded + data.draw(st.binary(min_size=1, max_size=8)))


@given(st.binary(max_size=200))
def test_record_set_garbage_is_typed_error_or_valid(garbage: bytes) -> None:
    try:
        header, got = record_set.decode(garbage)
    except RecordSetCorruptError:
        return
    assert len(got) == header.count


def test_record_set_unknown_version_and_flags() -> None:
    good = record_set.encode([(b"x", record_set.NO_HEADERS)], records_before=0, bytes_before=0, publish_time_ms=0)
    newer = good[:2] + bytes([2]) + good[3:]
    with pytest.raises(RecordSetCorruptError, match="version 2"):
        record_set.decode(newer)
    flagged = good[:3] + bytes([1]) + good[4:]
    with pytest.raises(RecordSetCorruptError, match="flags"):
        record_set.decode(flagged)
    with pytest.raises(RecordSetCorruptError, match="magic"):
        record_set.decode(b"XX" + good[2:])
    zero = good[:4] + struct.pack("<I", 0) + good[8:]
    with pytest.raises(RecordSetCorruptError, match="0 records"):
        record_set.decode(zero)


@pytest.mark.parametrize("headers", [{"": b"v"}, {"k": "str"}, {1: b"v"}, {"k" * 300: b"v"},
                                     {f"k{i}": b"" for i in range(65)}, [("k", b"v")]])
def test_record_headers_bad_input(headers: object) -> None:
    with pytest.raises(ConfigError):
        record_set.check_headers(headers)  # type: ignore[arg-type]


# --- names and settings ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["prod", "prod/payments", "a-b_c/D9", "/".join(["x"] * 8)])
def test_namespace_names_ok(name: str) -> None:
    assert check_namespace_name(name) == name


@pytest.mark.parametrize("name", ["", "/prod", "prod/", "prod//x", "pro.d", "-x", "a b", "é",
                                  "/".join(["x"] * 9), "x" * 65, None, 3])
def test_namespace_names_bad(name: object) -> None:
    with pytest.raises(ConfigError, match="namespace"):
        check_namespace_name(name)


@pytest.mark.parametrize("name", ["", ".x", "a/b", "a~b", "x" * 129, "a b", None])
def test_stream_names_bad(name: object) -> None:
    with pytest.raises(ConfigError, match="stream name"):
        check_name(name)


def test_keys_are_injective_and_lock_names_distinct() -> None:
    assert namespace_key("a/b") != namespace_key("ab")
    assert stream_key("a/b", "c") != stream_key("a", "b.c")
    assert lock_name("a/b", "c") != lock_name("a", "b.c")


def test_settings_inherit_and_override() -> None:
    s = effective_settings({"ensemble_size": 5, "segment_records_max": 10}, {"segment_records_max": 20})
    assert (s.ensemble_size, s.segment_records_max, s.ack_quorum_size) == (5, 20, 2)
    with pytest.raises(ConfigError, match="unknown stream setting"):
        effective_settings({"ensemble": 3}, {})
    with pytest.raises(ConfigError, match="quorums"):
        effective_settings({"ack_quorum_size": 4}, {})
    with pytest.raises(ConfigError, match="record_set_bytes_max"):
        StreamSettings(record_set_bytes_max=10).validate()
    with pytest.raises(ConfigError, match="segment_records_max"):
        StreamSettings(segment_records_max=0).validate()


# --- records and rules ------------------------------------------------------------------
def _stream(*segments: Segment, epoch: int = 7) -> StreamRecord:
    return StreamRecord("s", writer_epoch=epoch, next_seq=(segments[-1].seq + 1) if segments else 0,
                        segments=tuple(segments))


def _closed(seq: int, records: int = 10, size: int = 100, publish: int = 1000) -> Segment:
    return Segment(seq, 100 + seq, SegmentState.CLOSED, 7, 0, publish,
                   SegmentSummary(records - 1, 0, records, size, publish))


def test_records_round_trip() -> None:
    stream = StreamRecord("orders", {"segment_records_max": 5}, 12, StreamState.ACTIVE, 44, 3,
                          (_closed(1), Segment(2, 9, writer_epoch=44, ctime_ms=5)), Position(1, 0, 0), (77,))
    assert StreamRecord.from_bytes(stream.to_bytes()) == stream
    ns = NamespaceRecord("prod/payments", {"ensemble_size": 3}, 5)
    assert NamespaceRecord.from_bytes(ns.to_bytes()) == ns
    cur = CursorRecord("eu", Position(3, 4, 5), 9)
    assert CursorRecord.from_bytes(cur.to_bytes()) == cur


def test_writer_fencing_rules() -> None:
    stream = _stream(epoch=5)
    with pytest.raises(WriterFencedError):
        fence(stream, 4)
    fenced = fence(stream, 9)
    assert fenced.writer_epoch == 9
    with pytest.raises(WriterFencedError):
        add_segment(fenced, 5, ledger_id=1, now_ms=0)
    one = add_segment(fenced, 9, ledger_id=1, now_ms=0)
    two = add_segment(one, 9, ledger_id=2, now_ms=0)  # a roll: one open segment before it
    assert [s.seq for s in open_segments(two)] == [0, 1]
    with pytest.raises(InvariantViolation):
        add_segment(two, 9, ledger_id=3, now_ms=0)
    with pytest.raises(WriterFencedError):
        close_segment(two, 0, SegmentSummary(), 0, token=5)
    closed = close_segment(two, 0, SegmentSummary(4, 0, 5, 50, 1), 3, token=9)
    assert close_segment(closed, 0, SegmentSummary(4, 0, 5, 50, 1), 4, token=9) == closed  # idempotent
    with pytest.raises(InvariantViolation):
        close_segment(closed, 0, SegmentSummary(5, 0, 6, 60, 1), 4, token=9)
    deleting = dataclasses.replace(closed, state=StreamState.DELETING)
    with pytest.raises(StreamNotFoundError):
        fence(deleting, 99)


def test_adopt_staged_ledgers_in_one_change() -> None:
    stream = _stream(_closed(0), _closed(1), epoch=9)
    staged = [StagedSegment(501, SegmentSummary(2, 3, 12, 120, 5)), StagedSegment(502, SegmentSummary(0, 0, 1, 9, 4))]
    adopted = adopt_segments(stream, 9, staged, now_ms=77)
    assert [(s.seq, s.ledger_id, s.state, s.summary) for s in adopted.segments[2:]] == [
        (2, 501, SegmentState.CLOSED, staged[0].summary), (3, 502, SegmentState.CLOSED, staged[1].summary)]
    assert adopted.next_seq == 4 and adopted.record_count == stream.record_count + 13
    assert StreamRecord.from_bytes(adopted.to_bytes()) == adopted
    assert adopt_segments(adopted, 9, staged, now_ms=78) is adopted  # a repeated commit: nothing changes
    assert adopt_segments(stream, 9, [], now_ms=78) == stream
    truncated, _ = truncate(adopted, Position(3, 0, 0))
    assert adopt_segments(truncated, 9, staged, now_ms=79) is truncated  # 501 is being deleted: still adopted
    with pytest.raises(BadRequestError, match="part of a set"):
        adopt_segments(adopted, 9, [*staged, StagedSegment(503, SegmentSummary(0, 0, 1, 9, 4))], now_ms=79)
    with pytest.raises(WriterFencedError):
        adopt_segments(stream, 8, staged, now_ms=79)  # a fenced writer (an older commit) changes nothing
    with pytest.raises(BadRequestError, match="twice"):
        adopt_segments(stream, 9, [staged[0], staged[0]], now_ms=79)
    with pytest.raises(BadRequestError, match="no record"):
        adopt_segments(stream, 9, [StagedSegment(504, SegmentSummary())], now_ms=79)
    with pytest.raises(BadRequestError, match="is open"):
        adopt_segments(add_segment(stream, 9, ledger_id=600, now_ms=0), 9, staged, now_ms=79)


def test_roll_rules() -> None:
    s = StreamSettings(segment_records_max=10, segment_bytes_max=1000, segment_age_s_max=5.0)
    assert roll_due(s, SegmentStats(9, 999, 4.9)) is None
    assert roll_due(s, SegmentStats(10, 0, 0)) == "records"
    assert roll_due(s, SegmentStats(1, 1000, 0)) == "bytes"
    assert roll_due(s, SegmentStats(1, 1, 5.0)) == "age"
    assert roll_due(s, SegmentStats(0, 0, 50.0)) is None  # an empty segment never rolls by age


def test_truncate_drops_closed_segments_only() -> None:
    stream = _stream(_closed(0), _closed(1), _closed(2), Segment(3, 103))
    new, ledgers = truncate(stream, Position(2, 5, 0))
    assert ledgers == (100, 101) and [s.seq for s in new.segments] == [2, 3]
    assert new.truncated_before == Position(2, 5, 0) and new.deleting == (100, 101)
    again, more = truncate(new, Position(1, 0, 0))  # never moves back
    assert more == () and again == new
    all_of_it, ids = truncate(new, Position(4, 0, 0))  # beyond the open segment: stops at its start
    assert ids == (102,) and all_of_it.truncated_before == Position(3, 0, 0)
    assert [s.seq for s in all_of_it.segments] == [3]
    with pytest.raises(PositionOutOfRangeError):
        truncate(stream, Position(5, 0, 0))
    assert finish_deletes(all_of_it, [100, 102]).deleting == (101,)


def test_truncate_keeps_the_last_segment_even_closed() -> None:
    stream = _stream(_closed(0), _closed(1))
    new, ledgers = truncate(stream, Position(2, 0, 0))
    assert ledgers == (100,) and [s.seq for s in new.segments] == [1]


def test_retention_by_age_size_and_cursors() -> None:
    stream = _stream(_closed(0, publish=1_000), _closed(1, publish=2_000), _closed(2, publish=3_000),
                     Segment(3, 103))
    by_age = StreamSettings(retention_age_s_max=1.5)
    assert retention_point(stream, by_age, now_ms=3_600) == Position(2, 0, 0)
    assert retention_point(stream, by_age, now_ms=1_100) is None
    by_size = StreamSettings(retention_bytes_max=150)
    assert retention_point(stream, by_size, now_ms=0) == Position(2, 0, 0)
    held = StreamSettings(retention_age_s_max=0.001, retain_unconsumed=True)
    assert retention_point(stream, held, 10_000, cursors=[Position(1, 3, 0)]) == Position(1, 0, 0)
    assert retention_point(stream, held, 10_000, cursors=[Position(0, 3, 0)]) is None
    assert retention_point(stream, held, 10_000, cursors=[]) == Position(3, 0, 0)


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 500), st.integers(0, 5000)), min_size=1, max_size=12),
       st.integers(0, 6000), st.integers(0, 2000), st.integers(0, 14))
def test_retention_never_drops_open_or_last(shape: list[tuple[bool, int, int]], now: int, size_max: int,
                                            cursor_seq: int) -> None:
    segments = []
    for seq, (is_open, size, publish) in enumerate(shape):
        last = seq == len(shape) - 1
        if is_open and last:
            segments.append(Segment(seq, seq))
        else:
            segments.append(_closed(seq, size=size, publish=publish))
    stream = _stream(*segments)
    s = StreamSettings(retention_age_s_max=1.0, retention_bytes_max=size_max or None, retain_unconsumed=True)
    point = retention_point(stream, s, now, cursors=[Position(cursor_seq, 0, 0)])
    if point is None:
        return
    new, dropped = truncate(stream, point)
    assert new.segments and new.segments[-1] == stream.segments[-1]
    assert all(s.seq < cursor_seq for s in stream.segments if s.ledger_id in dropped)
    assert all(not s.is_open for s in stream.segments if s.ledger_id in dropped)


def test_cursor_monotonic_unless_forced() -> None:
    assert advance_cursor(None, Position(1, 0, 0), force=False, name="c")
    assert not advance_cursor(Position(1, 0, 0), Position(1, 0, 0), force=False, name="c")
    with pytest.raises(CursorRegressionError):
        advance_cursor(Position(2, 0, 0), Position(1, 0, 0), force=False, name="c")
    assert advance_cursor(Position(2, 0, 0), Position(1, 0, 0), force=True, name="c")
