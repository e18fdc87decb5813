"""The I/O-free rules: marks, loop prevention, the resume point, the link core."""

from __future__ import annotations

import pytest

from scriba.errors import ConfigError
from scriba.geo import LinkCore, Mark, origin_of, resume_point, shippable
from scriba.geo.marks import ORIGIN, SOURCE, SOURCE_POSITION
from scriba.geo.progress import resume_points
from scriba.invariant import InvariantViolation
from scriba.stream import Position

P = Position


def mark(origin: str, source: str, pos: Position) -> dict[str, bytes]:
    return Mark(origin, source, pos, 1000).to_headers()


def test_mark_round_trips_and_local_records_have_none() -> None:
    m = Mark("us", "eu", P(3, 7, 1), 123)
    assert Mark.from_headers({**m.to_headers(), "app": b"x"}) == m
    assert Mark.from_headers({"app": b"x"}) is None
    with pytest.raises(ConfigError, match="malformed"):
        Mark.from_headers({ORIGIN: b"us", SOURCE: b"eu", SOURCE_POSITION: b"nope"})


def test_origin_and_loop_prevention() -> None:
    assert origin_of({}, "us") == "us"
    assert origin_of(mark("ap", "eu", P(0, 0)), "eu") == "ap"
    assert shippable({}, "us", "eu")
    assert not shippable(mark("eu", "us", P(0, 0)), "us", "eu")  # back to its origin: never
    assert shippable(mark("ap", "us", P(0, 0)), "us", "eu")  # a ring forwards others' records
    assert not shippable(mark("ap", "us", P(0, 0)), "us", "eu", local_only=True)  # a full mesh does not


def test_resume_point_is_the_newest_record_of_that_source() -> None:
    newest_first = [{}, mark("ap", "ap", P(0, 9)), mark("us", "us", P(2, 5)), mark("us", "us", P(2, 4))]
    assert resume_point(newest_first, "us") == P(2, 5)
    assert resume_point(newest_first, "ap") == P(0, 9)
    assert resume_point(newest_first, "xx") is None
    assert resume_points(newest_first, ["us", "ap", "xx"]) == {"us": P(2, 5), "ap": P(0, 9)}


def test_link_core_ships_marks_confirms_in_order_and_reports_lag() -> None:
    core = LinkCore("us", "eu", None)
    assert core.start == "earliest"
    ship = core.on_source_record(P(0, 0), b"a", {"app": b"1"}, 1_000)
    assert ship is not None and Mark.from_headers(ship.headers) == Mark("us", "us", P(0, 0), 1_000)
    assert ship.headers["app"] == b"1"
    assert core.on_source_record(P(0, 1), b"b", mark("eu", "eu", P(9, 9)), 1_500) is None  # eu's own
    assert core.on_source_record(P(0, 2), b"c", {}, 2_000) is not None
    lag = core.lag(now_ms=3_000)
    assert (lag.records_behind, lag.seconds_behind, lag.confirmed) == (2, 2.0, None)
    with pytest.raises(InvariantViolation, match="out of order"):
        core.on_confirmed(P(0, 2))
    core.on_confirmed(P(0, 0))
    core.on_confirmed(P(0, 2))
    assert core.lag(now_ms=3_000) == type(lag)(0, 0.0, P(0, 2))
    assert core.start == P(0, 2, 1)


def test_link_core_refuses_a_record_at_or_before_the_resume_point() -> None:
    core = LinkCore("us", "eu", P(1, 4))
    assert core.start == P(1, 4, 1)
    with pytest.raises(InvariantViolation, match="not after"):
        core.on_source_record(P(1, 4), b"dup", {}, 0)


def test_bad_cluster_names() -> None:
    with pytest.raises(ConfigError, match="cluster name"):
        LinkCore("", "eu", None)
    with pytest.raises(InvariantViolation, match="itself"):
        LinkCore("eu", "eu", None)


def test_check_replica_catches_loss_reorder_and_duplication() -> None:
    from geo_env import check_replica

    src = [b"a", b"b", b"c"]
    assert check_replica(src, src) == []
    assert check_replica(src, [b"a", b"c"])  # lost
    assert check_replica(src, [b"a", b"c", b"b"])  # reordered
    assert any("duplicated" in p for p in check_replica(src, [b"a", b"b", b"c", b"c"]))
