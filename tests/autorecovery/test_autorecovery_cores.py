"""The I/O-free rules of autorecovery: fragments, marks, records, repair plans, throttles."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scriba.autorecovery.fragments import (
    entries_on_slots,
    fragment_at,
    fragments,
    fragments_using,
    repairable_last,
)
from scriba.autorecovery.marks import Membership, marks_for, placement_marks, work_for
from scriba.autorecovery.plan import StalePlanError, ensemble_change, plan_repair
from scriba.autorecovery.records import (
    AuditorStatus,
    Claim,
    Decommission,
    Deferred,
    Mark,
    Reason,
    UnderReplicated,
)
from scriba.autorecovery.throttle import Throttle, TokenBucket
from scriba.errors import BadRequestError, NotEnoughBookiesError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.records import LedgerMetadata, LedgerState
from scriba.placement import Adherence, BookieNode, Topology, make_policy

B = [BookieId(f"b{i}") for i in range(9)]
ZONES = ["za", "zb", "zc"]


def topo(ids: list[BookieId] = B) -> Topology:
    return Topology.from_nodes(
        BookieNode.at(b, f"/r/{ZONES[i % 3]}/rack{i}", free_bytes=1 << 30) for i, b in enumerate(ids)
    )


def ledger(segments: list[tuple[int, tuple[str, ...]]], *, e: int = 3, w: int = 3, a: int = 2,
           closed_at: int | None = None, policy: str = "random") -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=LedgerId(7), ensemble_size=e, write_quorum_size=w, ack_quorum_size=a,
        ensembles=tuple((EntryId(f), tuple(BookieId(b) for b in ens)) for f, ens in segments),
        state=LedgerState.CLOSED if closed_at is not None else LedgerState.OPEN,
        last_entry_id=EntryId(closed_at if closed_at is not None else -1),
        placement_policy=policy,
    )


# --- fragments ----------------------------------------------------------------------------


def test_fragment_ranges_of_closed_and_open_ledgers() -> None:
    closed = ledger([(0, ("b0", "b1", "b2")), (10, ("b0", "b3", "b2")), (20, ("b4", "b3", "b2"))],
                    closed_at=19)
    spans = [(f.first_entry_id, f.last_entry_id, f.is_empty) for f in fragments(closed)]
    assert spans == [(0, 9, False), (10, 19, False), (20, 19, True)]  # a change then a close at 19
    assert [f.first_entry_id for f in fragments_using(closed, {B[4]})] == []  # only the empty one
    assert [f.first_entry_id for f in fragments_using(closed, {B[0]})] == [0, 10]

    open_ = dataclasses.replace(closed, state=LedgerState.OPEN, last_entry_id=EntryId(-1))
    last = fragments(open_)[-1]
    assert last.is_open and last.last_entry_id is None and not last.is_empty
    assert repairable_last(last, lac=25) == 25
    assert repairable_last(last, lac=12) == 19  # nothing of the open segment is confirmed yet
    assert fragment_at(open_, 10) is not None and fragment_at(open_, 11) is None


@settings(max_examples=200, deadline=None)
@given(e=st.integers(1, 6), data=st.data())
def test_entries_on_slots_follow_the_metadata_write_sets(e: int, data: st.DataObject) -> None:
    w = data.draw(st.integers(1, e))
    a = data.draw(st.integers(1, w))
    md = ledger([(0, tuple(f"b{i}" for i in range(e)))], e=e, w=w, a=a, closed_at=40)
    slots = data.draw(st.sets(st.integers(0, e - 1), min_size=1))
    got = set(entries_on_slots(md, 0, 40, slots))
    expected = {x for x in range(41) if any(md.ensemble_at(x)[s] in md.write_set(x) for s in slots)}
    assert got == expected


# --- records -------------------------------------------------------------------------------

marks_st = st.lists(
    st.builds(Mark, st.integers(0, 10**6).map(EntryId), st.sampled_from(B), st.sampled_from(list(Reason))),
    max_size=8,
)


@settings(max_examples=100, deadline=None)
@given(marks=marks_st, deferred=st.none() | st.builds(Deferred, st.integers(-1, 99).map(EntryId),
                                                      st.integers(0, 99), st.integers(0, 10**12)))
def test_underreplicated_record_round_trips(marks: list[Mark], deferred: Deferred | None) -> None:
    record = UnderReplicated(LedgerId(42), ()).merged(marks)
    record = dataclasses.replace(record, deferred=deferred, attempts=3, last_error="x")
    back = UnderReplicated.from_bytes(record.to_bytes())
    assert back == record
    assert back.covers(marks)
    assert set(back.bookies) == {m.bookie_id for m in marks}


def test_merge_keeps_one_mark_per_fragment_and_bookie() -> None:
    one = UnderReplicated(LedgerId(1), ()).merged([Mark(EntryId(0), B[0], Reason.LOST)])
    two = one.merged([Mark(EntryId(0), B[0], Reason.DECOMMISSION), Mark(EntryId(5), B[0], Reason.LOST)])
    assert len(two.marks) == 2 and two.marks[0].reason is Reason.LOST
    assert not one.covers(two.marks) and two.covers(one.marks)


@pytest.mark.parametrize("cls", [UnderReplicated, Claim, Decommission, AuditorStatus])
def test_malformed_records_get_a_typed_error(cls: Any) -> None:
    for data in (b"not json", b'{"kind": "ledger"}', b'{"kind": "%s", "format": 1}' % cls.KIND.encode()):
        with pytest.raises(BadRequestError):
            cls.from_bytes(data)


# --- plans ---------------------------------------------------------------------------------


def test_plan_replaces_the_lost_bookie_keeping_zone_placement() -> None:
    md = ledger([(0, ("b0", "b1", "b2"))], closed_at=9, policy="zone-aware")
    topology = topo()
    policy = make_policy("zone-aware", rng=random.Random(1))
    plan = plan_repair(md, 0, {B[1]}, topology=topology.without(B[1]), policy=policy)
    assert plan is not None and plan.slots == (1,) and plan.last_entry_id == 9
    new = plan.new_ensemble
    assert new[0] == B[0] and new[2] == B[2] and new[1] not in (B[0], B[1], B[2])
    assert topology.location(new[1]).zone == "zb"  # the only zone that keeps three zones
    assert policy.adherence(topology, new, 3, 2) is Adherence.MEETS_STRICT
    assert list(plan.entries(md)) == list(range(10))
    assert plan.targets(md, 3) == (new[1],)
    order = plan.sources(md, 3, lambda ws, failed: [b for b in ws if b not in failed] + list(failed))
    assert order[-1] == B[1]


def test_plan_refuses_when_placement_cannot_hold() -> None:
    md = ledger([(0, ("b0", "b1", "b2"))], closed_at=9, policy="zone-aware")
    only = topo(B[:3]).without(B[1])  # no spare bookie at all
    with pytest.raises(NotEnoughBookiesError):
        plan_repair(md, 0, {B[1]}, topology=only, policy=make_policy("zone-aware"))


def test_plan_moves_what_it_can_when_one_bookie_has_no_replacement() -> None:
    """A lost bookie (b0) and a live one missing entries (b2) on one segment, one spare (b3):
    b0 moves to b3 now; b2 stays (its mark waits for a bookie). Seen on real processes: the
    whole repair used to wait, leaving the lost bookie's replicas missing too."""
    md = ledger([(0, ("b0", "b1", "b2"))], closed_at=9)
    live = topo(B[:4]).without(B[0])  # b1, b2 and the one spare b3
    plan = plan_repair(md, 0, {B[0], B[2]}, topology=live, policy=make_policy("random"))
    assert plan is not None and plan.slots == (0,)
    assert plan.new_ensemble == (B[3], B[1], B[2])
    assert plan.moved == (B[0],) and plan.added == (B[3],)
    with pytest.raises(NotEnoughBookiesError):  # nothing at all can move: still refused
        plan_repair(md, 0, {B[0], B[2]}, topology=topo(B[:3]).without(B[0]), policy=make_policy("random"))


def test_ensemble_change_applies_once_and_detects_a_stale_plan() -> None:
    md = ledger([(0, ("b0", "b1", "b2")), (10, ("b0", "b3", "b2"))], closed_at=15)
    plan = plan_repair(md, 0, {B[1]}, topology=topo(), policy=make_policy("random", rng=random.Random(2)))
    assert plan is not None
    needs, change = ensemble_change(plan)
    assert needs(md)
    after = change(md)
    assert after.ensembles[0] == (0, plan.new_ensemble) and after.ensembles[1] == md.ensembles[1]
    assert not needs(after)  # applied already: no second write
    someone = next(b for b in B[4:] if b != plan.new_ensemble[1])  # another worker's choice
    other = dataclasses.replace(md, ensembles=((EntryId(0), (B[0], someone, B[2])), md.ensembles[1]))
    with pytest.raises(StalePlanError):
        needs(other)


def test_open_ledger_repairs_only_to_its_lac_and_splits_the_segment() -> None:
    md = ledger([(0, ("b0", "b1", "b2"))])
    plan = plan_repair(md, 0, {B[1]}, topology=topo(), policy=make_policy("random"), lac=41)
    assert plan is not None and plan.last_entry_id == 41
    needs, change = ensemble_change(plan)
    after = change(md)
    assert after.ensembles == ((0, plan.new_ensemble), (42, md.ensembles[0][1]))
    assert not needs(after)
    nothing = plan_repair(md, 0, {B[1]}, topology=topo(), policy=make_policy("random"), lac=-1)
    assert nothing is not None and not nothing.copies_anything


def test_a_writer_change_after_the_plan_is_kept() -> None:
    md = ledger([(0, ("b0", "b1", "b2"))])
    plan = plan_repair(md, 0, {B[1]}, topology=topo(), policy=make_policy("random"), lac=20)
    assert plan is not None
    # meanwhile the writer replaced b1 itself at entry 15 (below the LAC the plan read)
    writer = dataclasses.replace(md, ensembles=(md.ensembles[0], (EntryId(15), (B[0], B[7], B[2]))))
    needs, change = ensemble_change(plan)
    assert needs(writer)
    after = change(writer)
    assert after.ensembles == ((0, plan.new_ensemble), (15, (B[0], B[7], B[2])))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_repair_claims_exactly_the_entries_it_copied(data: st.DataObject) -> None:
    """Property: after the change every entry in the copied range is held by no moved
    bookie and by the new ones; every other entry keeps exactly its old write set."""
    e = data.draw(st.integers(2, 5))
    w = data.draw(st.integers(1, e))
    a = data.draw(st.integers(1, w))
    n_segments = data.draw(st.integers(1, 3))
    firsts = sorted(data.draw(st.sets(st.integers(1, 60), min_size=n_segments - 1, max_size=n_segments - 1)))
    pool = [f"b{i}" for i in range(9)]
    segments = [(f, tuple(data.draw(st.permutations(pool))[:e])) for f in [0, *firsts]]
    closed = data.draw(st.booleans())
    closed_at = data.draw(st.integers(segments[-1][0] - 1, 80)) if closed else None
    md = ledger(segments, e=e, w=w, a=a, closed_at=closed_at)
    target = data.draw(st.sampled_from(segments))
    move = {BookieId(b) for b in data.draw(st.sets(st.sampled_from(target[1]), min_size=1, max_size=e))}
    lac = data.draw(st.integers(-1, 90))
    nodes = [BookieId(b) for b in pool]
    try:
        plan = plan_repair(md, target[0], move, topology=topo(nodes), policy=make_policy("random"),
                           lac=lac, exclude=move)
    except NotEnoughBookiesError:
        return
    if plan is None or not plan.copies_anything:
        return
    moved = set(plan.moved)
    assert moved <= move
    if moved != move:  # a partial plan only when every candidate bookie was used up
        assert set(plan.added) == set(nodes) - set(target[1]) - move
    needs, change = ensemble_change(plan)
    assert needs(md)
    after = change(md)
    end = 90 if closed_at is None else closed_at
    for x in range(end + 1):
        before_set, after_set = md.write_set(x), after.write_set(x)
        if plan.segment_first <= x <= plan.last_entry_id:
            assert not set(after_set) & moved
            assert set(after_set) - set(before_set) == set(plan.targets(md, x))
        else:
            assert after_set == before_set


# --- marks and membership -------------------------------------------------------------------


def test_membership_waits_the_delay_and_forgets_a_bookie_that_came_back() -> None:
    m = Membership(delay_s=60, started_at=0)
    m.observe({B[0], B[1]}, now=0)
    m.observe({B[0]}, now=10)
    assert m.lost(69) == frozenset() and m.pending(69) == {B[1]: pytest.approx(1)}
    assert m.lost(70) == {B[1]}
    m.observe({B[0], B[1]}, now=71)  # back: not lost any more
    assert m.lost(500) == frozenset()
    m.referenced([B[5]])  # used by a ledger, never seen: gone since the auditor started
    assert m.lost(60) == {B[5]}
    now = Membership(delay_s=0, started_at=0)
    now.observe({B[0]}, 1)
    now.observe(set(), 2)
    assert now.lost(2) == {B[0]}


def test_marks_and_work_follow_the_current_metadata() -> None:
    md = ledger([(0, ("b0", "b1", "b2")), (10, ("b0", "b3", "b2"))], closed_at=15)
    marks = marks_for(md, {B[0]: Reason.LOST, B[3]: Reason.DECOMMISSION})
    assert sorted((m.first_entry_id, m.bookie_id) for m in marks) == [(0, "b0"), (10, "b0"), (10, "b3")]
    work = work_for(md, marks, registered={B[3]})
    assert work == {0: {B[0]}, 10: {B[0], B[3]}}
    assert work_for(md, marks, registered={B[0], B[3]}) == {10: {B[3]}}  # b0 came back
    unreadable = [Mark(EntryId(10), B[2], Reason.UNREADABLE)]
    assert work_for(md, unreadable, registered=set(B)) == {10: {B[2]}}


def test_placement_marks_name_a_bookie_whose_move_restores_the_policy() -> None:
    topology = topo()
    policy = make_policy("zone-aware", rng=random.Random(3))
    good = ledger([(0, ("b0", "b1", "b2"))], closed_at=5, policy="zone-aware")
    assert placement_marks(good, topology, policy) == []  # negative control
    bad = ledger([(0, ("b0", "b3", "b6"))], closed_at=5, policy="zone-aware")  # all in zone za
    marks = placement_marks(bad, topology, policy)
    assert len(marks) == 1 and marks[0].reason is Reason.PLACEMENT
    slot = bad.ensembles[0][1].index(marks[0].bookie_id)
    fixed = policy.replace_bookie(topology, bad.ensembles[0][1], slot, 3, 2)
    assert fixed.adherence is not Adherence.FAIL


# --- throttle --------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(rate=st.floats(1, 1000), sizes=st.lists(st.integers(1, 50), min_size=1, max_size=50))
def test_token_bucket_never_exceeds_its_rate(rate: float, sizes: list[int]) -> None:
    bucket = TokenBucket(rate, burst=rate / 10)
    now = 0.0
    for n in sizes:
        now += bucket.take(n, now)  # wait what it says, then go on
    # everything granted by ``now``: at most the burst plus what the rate refilled
    assert sum(sizes) <= rate / 10 + rate * now + 1e-6


def test_throttle_zero_is_unlimited_and_bytes_bind_too() -> None:
    assert Throttle.of(0, 0).take(10**6, 10**9, 0.0) == 0
    t = Throttle.of(0, 1_000_000)
    assert t.take(1, 100_000, 0.0) == 0  # within the burst
    assert t.take(1, 1_000_000, 0.0) == pytest.approx(1.0)


def test_sources_are_assigned_so_a_batch_reads_as_one_range() -> None:
    """Striping rotates each entry's first choice; the copier still reads the whole batch
    from one surviving bookie (one range read), the moved bookie only as a last resort."""
    from scriba.autorecovery.copier import assign_sources

    survivors, moved = [B[1], B[2]], B[0]
    tried = {EntryId(e): [survivors[e % 2], survivors[(e + 1) % 2], moved] for e in range(10)}
    by_source = assign_sources(list(tried), tried)
    assert list(by_source) == [B[1]] and by_source[B[1]] == list(range(10))
    assert all(t == [B[2], moved] for t in tried.values())  # what is left for a retry
    # a retry after b1 failed: b2 for all; then only the moved bookie is left for entry 3
    again = assign_sources(list(tried), tried)
    assert again == {B[2]: list(range(10))}
    tried[EntryId(3)] = [moved]
    assert assign_sources([EntryId(3), EntryId(4)], tried) == {moved: [3, 4]}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from(B[:5]), min_size=1, max_size=4, unique=True), min_size=1, max_size=30))
def test_each_wanted_entry_gets_one_source_from_its_own_list(orders: list[list[BookieId]]) -> None:
    from scriba.autorecovery.copier import assign_sources

    tried = {EntryId(e): list(order) for e, order in enumerate(orders)}
    by_source = assign_sources(list(tried), tried)
    assigned = [(e, b) for b, entries in by_source.items() for e in entries]
    assert sorted(e for e, _ in assigned) == list(range(len(orders)))
    for e, b in assigned:
        assert b in orders[e] and b not in tried[EntryId(e)]
        assert len(tried[EntryId(e)]) == len(orders[e]) - 1
