"""Unit and property tests of the RSM's I/O-free cores: envelope, session table,
replicated state, role, batching, snapshot schedule and catalog."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rsm_machines import Counter

from scriba.errors import ClientSessionError, ConfigError, SnapshotCorruptError, StateMachineError
from scriba.invariant import InvariantViolation
from scriba.rsm.batching import ProposalBatcher
from scriba.rsm.envelope import Envelope, EnvelopeCorruptError, Kind
from scriba.rsm.machine import SnapshotReader, SnapshotWriter
from scriba.rsm.role import CatchUp, OpenWriter, Role, RoleCore, Serve, StepDown, Stop
from scriba.rsm.sessions import Duplicate, Fresh, Rejected, SessionTable
from scriba.rsm.snapshots_core import (
    SnapshotCatalog,
    SnapshotInfo,
    SnapshotSchedule,
    add_snapshot,
    finish_deletes,
    truncation_point,
)
from scriba.rsm.state import ReplicatedState
from scriba.stream import Position


def P(i: int) -> Position:
    return Position(0, i, 0)


# --- envelope -------------------------------------------------------------------------
@given(st.sampled_from(list(Kind)), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.binary(max_size=64),
       st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_envelope_round_trip(kind: Kind, token: int, time_ms: int, payload: bytes, sid: int, seq: int,
                             acked: int) -> None:
    env = Envelope(kind, token, time_ms, payload, sid, seq, acked)
    assert Envelope.decode(env.encode()) == env
    assert env.size_bytes == len(env.encode())


@pytest.mark.parametrize("data", [b"", b"\x01" * 10, b"\x02" + b"\x01" + b"\x00" * 40, b"\x01\x09" + b"\x00" * 40])
def test_envelope_garbage_is_a_typed_error(data: bytes) -> None:
    with pytest.raises(EnvelopeCorruptError):
        Envelope.decode(data)


# --- sessions -------------------------------------------------------------------------
def test_session_dedup_window_and_stale() -> None:
    table = SessionTable(ttl_ms=1000, results_max=2)
    sid = table.open()
    assert table.check(sid, 1, 0) == Fresh()
    table.record(sid, 1, b"r1")
    assert table.check(sid, 1, 0) == Duplicate(b"r1")
    assert table.check(sid, 2, 0) == Fresh()
    table.record(sid, 2, b"r2")
    full = table.check(sid, 3, 0)
    assert isinstance(full, Rejected) and "session_results_max" in full.reason
    assert table.check(sid, 3, 2) == Fresh()  # acked_below 2 frees seq 1
    assert table.peek(sid, 1) is None
    stale = table.check(sid, 1, 2)
    assert isinstance(stale, Rejected) and "acked_below" in stale.reason
    with pytest.raises(InvariantViolation):
        table.record(sid, 2, b"again")
    assert isinstance(table.check(sid, 0, 0), Rejected)
    assert isinstance(Rejected("x").error(), ClientSessionError)


def test_session_expiry_follows_the_replicated_clock_only() -> None:
    table = SessionTable(ttl_ms=100, results_max=8)
    table.advance(1_000)
    a = table.open()
    b = table.open()
    assert table.advance(1_050) == []
    assert table.check(a, 1, 0) == Fresh()  # touches a at 1050
    assert table.advance(1_101) == [b]  # b idle since 1000
    expired = table.check(b, 1, 0)
    assert isinstance(expired, Rejected) and "expired" in expired.reason
    never = table.check(99, 1, 0)
    assert isinstance(never, Rejected) and "never opened" in never.reason
    assert table.advance(500) == [] and table.clock_ms == 1_101  # the clock never goes back
    assert table.advance(1_151) == [a]


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12), st.integers(0, 12), st.integers(0, 50)),
                max_size=80))
@settings(max_examples=200)
def test_session_table_never_runs_a_seq_twice_and_snapshots_exactly(ops: list[tuple[int, int, int, int]]) -> None:
    table = SessionTable(ttl_ms=200, results_max=4)
    sids = [table.open() for _ in range(3)]
    ran: set[tuple[int, int]] = set()
    clock = 0
    for which, seq, acked, tick in ops:
        clock += tick
        table.advance(clock)
        sid = sids[which % 3] if which < 3 else 77
        check = table.check(sid, seq, acked)
        if isinstance(check, Fresh):
            assert (sid, seq) not in ran
            ran.add((sid, seq))
            table.record(sid, seq, b"%d" % seq)
        elif isinstance(check, Duplicate):
            assert (sid, seq) in ran and check.result == b"%d" % seq
        copy = SessionTable.from_bytes(table.to_bytes(), 200, 4)
        assert copy.to_bytes() == table.to_bytes() and copy.digest() == table.digest()


def test_session_table_bad_snapshot_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        SessionTable.from_bytes(b"{", 10, 10)


# --- replicated state ------------------------------------------------------------------
def _state() -> ReplicatedState:
    return ReplicatedState(Counter(), session_ttl_ms=1000, session_results_max=8)


def test_state_applies_dedups_and_refuses() -> None:
    s = _state()
    opened = s.apply(P(0), Envelope(Kind.SESSION_OPEN, 1, 10))
    sid = int.from_bytes(opened.result, "big")
    first = s.apply(P(1), Envelope(Kind.COMMAND, 1, 11, b"x", sid, 1, 0))
    again = s.apply(P(2), Envelope(Kind.COMMAND, 2, 12, b"x", sid, 1, 0))
    barrier = s.apply(P(3), Envelope(Kind.BARRIER, 2, 13))
    refused = s.apply(P(4), Envelope(Kind.COMMAND, 2, 14, b"x", 42, 1, 0))
    plain = s.apply(P(5), Envelope(Kind.COMMAND, 2, 15, b"x"))
    assert (first.result, first.applied) == (b"1", True)
    assert (again.result, again.applied) == (b"1", False)
    assert not barrier.applied and refused.rejected and "never opened" in refused.rejected
    assert plain.result == b"2" and s.commands_applied == 2 and s.records_applied == 6
    assert s.applied == P(5) and s.token == 2 and s.clock_ms == 15


def test_state_invariants_positions_and_tokens() -> None:
    s = _state()
    s.apply(P(3), Envelope(Kind.BARRIER, 5, 0))
    with pytest.raises(InvariantViolation, match="positions must increase"):
        s.apply(P(3), Envelope(Kind.BARRIER, 5, 0))
    with pytest.raises(InvariantViolation, match="token 4 below 5"):
        s.apply(P(4), Envelope(Kind.BARRIER, 4, 0))


def test_state_machine_exceptions_and_bad_results_are_typed() -> None:
    s = _state()
    with pytest.raises(StateMachineError, match="RuntimeError: the state machine refused boom"):
        s.apply(P(0), Envelope(Kind.COMMAND, 1, 0, b"boom"))

    class Bad(Counter):
        def apply(self, command: bytes, position: Position) -> bytes:
            return 3  # type: ignore[return-value]

    with pytest.raises(StateMachineError, match="must return bytes"):
        ReplicatedState(Bad(), session_ttl_ms=10, session_results_max=1).apply(P(0), Envelope(Kind.COMMAND, 1, 0))


def test_state_snapshot_restore_round_trip_and_corruption() -> None:
    s = _state()
    sid = int.from_bytes(s.apply(P(0), Envelope(Kind.SESSION_OPEN, 1, 10)).result, "big")
    for i in range(1, 6):
        s.apply(P(i), Envelope(Kind.COMMAND, 1, 10 + i, b"x", sid, i, 0))
    chunks = s.snapshot(chunk_bytes=1)
    t = _state()
    t.restore(chunks)
    assert (t.applied, t.commands_applied, t.records_applied, t.token) == (P(5), 5, 6, 1)
    assert t.sessions.digest() == s.sessions.digest() and t.machine.query(b"") == b"5"  # type: ignore[attr-defined]
    # a retry after the restore is still a duplicate
    assert t.apply(P(6), Envelope(Kind.COMMAND, 1, 20, b"x", sid, 5, 0)).result == b"5"
    with pytest.raises(SnapshotCorruptError):
        _state().restore([b"not json"])
    with pytest.raises(SnapshotCorruptError):
        _state().restore([])


def test_snapshot_writer_chunks() -> None:
    out = SnapshotWriter(chunk_bytes=4)
    out.write(b"abcdefghij")
    out.write(b"k")
    chunks = out.chunks()
    assert chunks == [b"abcd", b"efgh", b"ijk"] and out.size_bytes == 11
    reader = SnapshotReader(chunks)
    assert reader.read(3) == b"abc" and reader.read() == b"defghijk" and list(reader) == chunks


# --- role ------------------------------------------------------------------------------
def test_role_lifecycle_and_gate() -> None:
    role = RoleCore()
    role.applied_to(P(3))
    assert role.elected(5) == [OpenWriter(5)] and role.role is Role.CANDIDATE
    assert role.writer_opened(5, P(7)) == [CatchUp(5, P(7))]
    assert not role.accepts(5)
    assert role.applied_to(P(6)) == []
    assert role.applied_to(P(7)) == [Serve(5)] and role.accepts(5) and not role.accepts(4)
    assert role.deposed(4, "old term") == []  # a stale notice changes nothing
    assert role.deposed(5, "fenced") == [StepDown(5, "fenced")]
    assert role.role is Role.FOLLOWER and not role.accepts(5)
    assert role.writer_opened(5, None) == []  # a late open of the lost term
    with pytest.raises(InvariantViolation):
        role.elected(5)  # tokens strictly increase
    assert role.elected(9) == [OpenWriter(9)]
    assert role.writer_opened(9, P(2)) == [Serve(9)]  # already applied past the end
    assert role.fatal("apply raised") == [Stop("apply raised")] and role.fatal("again") == []
    assert role.elected(10) == [] and not role.accepts(9)


def test_role_empty_stream_serves_at_once() -> None:
    role = RoleCore()
    role.elected(1)
    assert role.writer_opened(1, None) == [Serve(1)]


@given(st.lists(st.tuples(st.sampled_from(["elect", "open", "apply", "depose", "stale"]), st.integers(0, 3)),
                max_size=60))
def test_role_accepts_only_the_current_serving_term(events: list[tuple[str, int]]) -> None:
    role = RoleCore()
    token, applied = 0, 0
    for kind, n in events:
        if kind == "elect" and not role.in_term:
            token += 1 + n
            role.elected(token)
        elif kind == "open":
            role.writer_opened(token, P(applied + n) if n else None)
        elif kind == "apply":
            applied += 1
            role.applied_to(P(applied))
        elif kind == "depose":
            role.deposed(token, "x")
        else:
            role.deposed(token - 1, "stale")
        for t in range(token + 2):
            assert role.accepts(t) == (role.role is Role.LEADER and t == token)
        if role.role is Role.LEADER:
            assert role.end is None


# --- batching --------------------------------------------------------------------------
def test_batcher_group_commit_and_order() -> None:
    b: ProposalBatcher[str] = ProposalBatcher(records_max=3, bytes_max=100, inflight_max=1)
    b.add("a", 10)
    first = b.take()
    assert first is not None and first.items == ("a",)
    for x in "bcde":
        b.add(x, 10)  # arrive while "a" is in flight
    assert b.take() is None  # inflight_max
    assert b.confirmed(first.batch_id, [P(0)]) == [("a", P(0))]
    second = b.take()
    assert second is not None and second.items == ("b", "c", "d")  # records_max
    assert b.fail_all() == ["b", "c", "d", "e"] and b.queued == 0 and b.inflight == 0


def test_batcher_bytes_limit_and_overtaking_confirmations() -> None:
    b: ProposalBatcher[str] = ProposalBatcher(records_max=10, bytes_max=25, inflight_max=3)
    for x in "abcd":
        b.add(x, 10)
    one, two = b.take(), b.take()
    assert one is not None and two is not None and one.items == ("a", "b") and two.items == ("c", "d")
    assert b.confirmed(two.batch_id, [P(2), P(3)]) == []  # waits for the earlier batch
    assert b.confirmed(one.batch_id, [P(0), P(1)]) == [("a", P(0)), ("b", P(1)), ("c", P(2)), ("d", P(3))]
    with pytest.raises(InvariantViolation):
        b.confirmed(one.batch_id, [P(0), P(1)])
    b.add("big", 1000)
    big = b.take()
    assert big is not None and big.items == ("big",)  # one oversized item still goes alone


@given(st.lists(st.sampled_from(["add", "take", "confirm", "fail"]), max_size=100), st.randoms())
def test_batcher_releases_each_item_once_in_order(ops: list[str], rnd) -> None:  # type: ignore[no-untyped-def]
    b: ProposalBatcher[int] = ProposalBatcher(records_max=3, bytes_max=1000, inflight_max=2)
    added, released, sent = 0, [], []
    for op in ops:
        if op == "add":
            b.add(added, 1)
            added += 1
        elif op == "take":
            batch = b.take()
            if batch is not None:
                sent.append(batch)
        elif op == "confirm" and sent:
            batch = sent.pop(rnd.randrange(len(sent)))
            released += [i for i, _ in b.confirmed(batch.batch_id, [P(i) for i in batch.items])]
        elif op == "fail":
            released += b.fail_all()
            sent.clear()
    released += b.fail_all()
    assert released == list(range(added))


# --- snapshots -------------------------------------------------------------------------
def test_schedule_by_commands_bytes_and_demand() -> None:
    s = SnapshotSchedule(every_commands=3, every_bytes=100)
    s.on_applied(2, 10)
    assert not s.due()
    s.on_applied(1, 10)
    assert s.due()
    s.started()
    s.on_applied(5, 500)
    assert not s.due()  # one at a time
    s.finished(P(3))
    assert s.due() and s.last_position == P(3)  # 5 records and 500 bytes since it started
    s.started()
    s.finished(None)
    assert s.due()  # a failed one is due again
    s.started()
    s.finished(P(9))
    assert not s.due()
    s.on_demand()
    assert s.due()
    s.started()
    s.finished(P(10))
    s.on_applied(100, 0)
    s.restored(P(50))
    assert not s.due() and s.last_position == P(50)  # counts from the snapshot restored
    never = SnapshotSchedule(None, None)
    never.on_applied(10**9, 10**12)
    assert not never.due()
    with pytest.raises(ConfigError):
        SnapshotSchedule(0, None)


def _info(i: int) -> SnapshotInfo:
    return SnapshotInfo(100 + i, P(i * 10), i * 10, 5, 1, "d" * 64, 0, 1)


def test_catalog_keeps_the_newest_and_truncates_before_the_oldest_kept() -> None:
    c = SnapshotCatalog()
    assert truncation_point(c, 2) is None
    c = add_snapshot(c, _info(1), kept=2)
    assert truncation_point(c, 2) is None  # a fallback must still replay from the start
    c = add_snapshot(c, _info(2), kept=2)
    assert truncation_point(c, 2) == P(10)
    c = add_snapshot(c, _info(3), kept=2)
    assert [s.ledger_id for s in c.snapshots] == [102, 103] and c.deleting == (101,)
    assert truncation_point(c, 2) == P(20) and c.newest == _info(3)
    older = add_snapshot(c, _info(2), kept=2)  # not newer than the newest: its ledger goes
    assert older.snapshots == c.snapshots and older.deleting == (101, 102)
    assert SnapshotCatalog.from_bytes(c.to_bytes()) == c
    assert finish_deletes(c, {101}).deleting == ()
    with pytest.raises(ConfigError):
        SnapshotCatalog.from_bytes(b"[]")
