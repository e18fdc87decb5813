"""The data source's option parsing, task planning and offsets (no Spark, no I/O)."""

from __future__ import annotations

import pytest

from scriba.errors import ConfigError, InvalidPositionError
from scriba.pipeline.plan import (
    SegmentSpan,
    decode_offset,
    encode_offset,
    parse_options,
    plan_stream,
    starting_positions,
)
from scriba.stream import Position

URI = "etcd://127.0.0.1:1/x"


def test_options_need_metadata_and_exactly_one_target() -> None:
    with pytest.raises(ConfigError, match="metadata"):
        parse_options({"stream": "a/b"})
    with pytest.raises(ConfigError, match="exactly one"):
        parse_options({"metadata": URI})
    with pytest.raises(ConfigError, match="exactly one"):
        parse_options({"metadata": URI, "stream": "a/b", "ledgers": "1"})
    with pytest.raises(ConfigError, match="namespace/stream"):
        parse_options({"metadata": URI, "stream": "nostream"})
    with pytest.raises(ConfigError, match="integers"):
        parse_options({"metadata": URI, "ledgers": "1,x"})
    with pytest.raises(ConfigError, match="positive"):
        parse_options({"metadata": URI, "stream": "a/b", "maxRecordsPerPartition": "0"})
    with pytest.raises(ConfigError, match="true or false"):
        parse_options({"metadata": URI, "stream": "a/b", "failOnDataLoss": "maybe"})
    opts = parse_options({"METADATA": URI, "Stream": "a/b/c", "maxRecordsPerPartition": "7"})
    assert opts.streams == ("a/b/c",) and opts.max_records_per_partition == 7
    assert parse_options({"metadata": URI, "ledgers": "3, 1"}).ledgers == (3, 1)


def test_plan_splits_segments_and_honours_bounds() -> None:
    opts = parse_options({"metadata": URI, "stream": "a/b", "maxRecordsPerPartition": "20"})
    spans = [
        SegmentSpan(0, 10, 99, 200, False),  # 2 records per entry -> 10 entries per task
        SegmentSpan(1, 11, -1, 0, False),  # empty
        SegmentSpan(2, 12, 4, None, True),  # open: 1 record per entry assumed
    ]
    tasks = plan_stream(opts, "a", "b", spans, Position(0, 0, 0), Position(2, 5, 0))
    seg0 = [(t.first_entry, t.last_entry) for t in tasks if t.segment_seq == 0]
    assert seg0 == [(i, i + 9) for i in range(0, 100, 10)]
    assert [(t.segment_seq, t.first_entry, t.last_entry) for t in tasks if t.segment_seq != 0] == [(2, 0, 4)]
    bounded = plan_stream(opts, "a", "b", spans, Position(0, 95, 1), Position(2, 2, 1))
    assert [(t.segment_seq, t.first_entry, t.last_entry) for t in bounded] == [(0, 95, 99), (2, 0, 2)]
    assert all(t.start == Position(0, 95, 1) and t.end == Position(2, 2, 1) for t in bounded)
    assert plan_stream(opts, "a", "b", spans, Position(2, 5, 0), Position(2, 5, 0)) == []


def test_offsets_are_canonical_json() -> None:
    a = encode_offset({"z/s": Position(1, 2, 3), "a/s": Position(0, 0, 0)})
    b = encode_offset({"a/s": Position(0, 0, 0), "z/s": Position(1, 2, 3)})
    assert list(a) == ["a/s", "z/s"] and a == b
    assert decode_offset('{"a/s": "1:2:3"}') == {"a/s": Position(1, 2, 3)}
    with pytest.raises(InvalidPositionError):
        decode_offset({"a/s": "1:2"})
    assert starting_positions('{"a/s": "0:5:0"}', ["a/s", "b/s"]) == {"a/s": "0:5:0", "b/s": "earliest"}
    with pytest.raises(ConfigError, match="not read"):
        starting_positions('{"c/s": "latest"}', ["a/s"])
