"""scriba.quorum: write sets, the ack rule, the fence quorum and recoverability, by table."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scriba.invariant import InvariantViolation
from scriba.quorum import EntryState, Quorum, SlotRegions, write_sets


@pytest.mark.parametrize(
    ("e", "w", "entry_id", "slots"),
    [
        (3, 2, 0, (0, 1)),
        (3, 2, 1, (1, 2)),
        (3, 2, 2, (2, 0)),  # wraps around
        (3, 2, 9, (0, 1)),
        (5, 3, 4, (4, 0, 1)),
        (5, 3, 10**12 + 3, (3, 4, 0)),
        (3, 3, 1, (1, 2, 0)),  # Qw == E: every slot, rotated
        (4, 1, 6, (2,)),
        (1, 1, 7, (0,)),
    ],
)
def test_write_set_is_round_robin_from_entry_mod_e(e: int, w: int, entry_id: int, slots: tuple[int, ...]) -> None:
    assert Quorum(e, w, 1).write_set(entry_id) == slots


@pytest.mark.parametrize(
    ("e", "w", "sets"),
    [
        (3, 3, ((0, 1, 2),)),  # one distinct write set when E == W
        (3, 2, ((0, 1), (1, 2), (2, 0))),
        (4, 2, ((0, 1), (1, 2), (2, 3), (3, 0))),
        (5, 5, ((0, 1, 2, 3, 4),)),
        (1, 1, ((0,),)),
    ],
)
def test_distinct_write_sets(e: int, w: int, sets: tuple[tuple[int, ...], ...]) -> None:
    assert write_sets(e, w) == sets
    assert Quorum(e, w, 1).write_sets() == sets


@pytest.mark.parametrize(
    ("e", "w", "masks"),
    [
        (3, 2, (0b011, 0b110, 0b101)),
        (3, 3, (0b111, 0b111, 0b111)),
        (4, 1, (0b0001, 0b0010, 0b0100, 0b1000)),
    ],
)
def test_write_set_masks(e: int, w: int, masks: tuple[int, ...]) -> None:
    assert Quorum(e, w, 1).write_set_masks() == masks


@pytest.mark.parametrize(
    ("e", "w", "slot", "entry_id", "member"),
    [
        (4, 2, 1, 1, True),
        (4, 2, 2, 1, True),
        (4, 2, 3, 1, False),  # just after the write set: slot (e + Qw) % E
        (4, 2, 0, 1, False),  # just before it: slot (e - 1) % E
        (4, 2, 0, 3, True),  # wrapped: entry 3 is on slots 3, 0
        (4, 2, 1, 3, False),
        (3, 3, 2, 0, True),
        (5, 3, 4, 2, True),
        (5, 3, 0, 2, False),
    ],
)
def test_in_write_set(e: int, w: int, slot: int, entry_id: int, member: bool) -> None:
    assert Quorum(e, w, 1).in_write_set(slot, entry_id) is member


@given(e=st.integers(1, 12), data=st.data())
def test_membership_masks_and_write_sets_agree(e: int, data: st.DataObject) -> None:
    w = data.draw(st.integers(1, e))
    q = Quorum(e, w, 1)
    entry_id = data.draw(st.integers(0, 10**9))
    members = {s for s in range(e) if q.in_write_set(s, entry_id)}
    assert members == set(q.write_set(entry_id))
    assert len(q.write_set(entry_id)) == w and q.write_set(entry_id)[0] == entry_id % e
    assert q.write_set_masks()[entry_id % e] == sum(1 << s for s in members)


@pytest.mark.parametrize(
    ("e", "w", "a", "fence"),
    [(3, 3, 2, 2), (3, 3, 3, 1), (3, 3, 1, 3), (5, 3, 2, 2), (2, 2, 1, 2), (4, 2, 2, 1)],
)
def test_fence_quorum_is_qw_minus_qa_plus_one(e: int, w: int, a: int, fence: int) -> None:
    assert Quorum(e, w, a).fence_quorum == fence


@pytest.mark.parametrize(
    ("w", "a", "acks", "acked"),
    [(3, 2, 1, False), (3, 2, 2, True), (3, 2, 3, True), (3, 3, 2, False), (2, 1, 1, True)],
)
def test_ack_rule(w: int, a: int, acks: int, acked: bool) -> None:
    assert Quorum(w, w, a).is_acked(acks) is acked


@pytest.mark.parametrize(
    ("w", "a", "failed", "possible"),
    [(3, 2, 0, True), (3, 2, 1, True), (3, 2, 2, False), (3, 3, 1, False), (2, 1, 1, True)],
)
def test_can_still_ack(w: int, a: int, failed: int, possible: bool) -> None:
    assert Quorum(w, w, a).can_still_ack(failed) is possible


@pytest.mark.parametrize(
    ("e", "w", "a", "answered", "covered"),
    [
        # E5 W3 A2: two answers in each of the five write sets.
        (5, 3, 2, {0, 1, 2, 3, 4}, True),
        (5, 3, 2, {0, 1, 2, 3}, True),
        (5, 3, 2, {0, 2}, False),
        (5, 3, 2, {0, 1, 3}, False),  # write set (2, 3, 4) has only 3
        (5, 3, 2, {0, 2, 4}, False),  # write set (1, 2, 3) has only 2
        # E3 W3 A3: one answer is enough; A1: every bookie; A2: two.
        (3, 3, 3, {1}, True),
        (3, 3, 3, set(), False),
        (3, 3, 1, {0, 1}, False),
        (3, 3, 1, {0, 1, 2}, True),
        (3, 3, 2, {0, 2}, True),
        (3, 3, 2, {2}, False),
        # E4 W2 A2: one answer per write set (0,1) (1,2) (2,3) (3,0).
        (4, 2, 2, {0, 2}, True),
        (4, 2, 2, {0, 1}, False),
    ],
)
def test_covers_every_write_set(e: int, w: int, a: int, answered: set[int], covered: bool) -> None:
    assert Quorum(e, w, a).covers_every_write_set(answered) is covered


@pytest.mark.parametrize(
    ("e", "w", "a", "failed", "possible"),
    [
        (3, 3, 2, {0}, True),
        (3, 3, 2, {0, 1}, False),
        (3, 3, 3, {0, 1}, True),
        (3, 3, 3, {0, 1, 2}, False),
        (5, 3, 2, {4}, True),
        (5, 3, 2, {0, 3}, False),  # write set (3, 4, 0) keeps one answer
        (5, 3, 2, {0, 1}, False),  # write set (0, 1, 2) keeps one answer: need two
        (4, 2, 2, {0, 2}, True),
        (4, 2, 2, {0, 1}, False),
    ],
)
def test_can_still_cover(e: int, w: int, a: int, failed: set[int], possible: bool) -> None:
    assert Quorum(e, w, a).can_still_cover(failed) is possible


@given(e=st.integers(1, 7), data=st.data())
def test_a_covered_answer_set_leaves_no_write_set_able_to_ack(e: int, data: st.DataObject) -> None:
    """The point of the fence quorum: once every write set is covered, the slots that did
    not answer (and could still take an old writer's add) number fewer than Qa in every
    write set; and coverage is still possible exactly when the healthy slots cover."""
    w = data.draw(st.integers(1, e))
    a = data.draw(st.integers(1, w))
    q = Quorum(e, w, a)
    for n in range(e + 1):
        for answered in map(set, combinations(range(e), n)):
            unfenced = set(range(e)) - answered
            covered = q.covers_every_write_set(answered)
            assert covered == all(
                len(unfenced & set(slots)) < a for slots in q.write_sets()
            ), (e, w, a, answered)
            assert q.can_still_cover(unfenced) == covered


@pytest.mark.parametrize(
    ("w", "a", "present", "missing", "answered", "asked", "state"),
    [
        (3, 2, True, 2, 3, 3, EntryState.PRESENT),  # one valid copy wins over NO answers
        (3, 2, False, 2, 2, 3, EntryState.ABSENT),  # Qw - Qa + 1 = 2 NO answers
        (3, 2, False, 1, 1, 3, EntryState.PENDING),
        (3, 2, False, 1, 3, 3, EntryState.UNKNOWN),  # one NO + a corrupt copy + a timeout
        (3, 2, False, 0, 3, 3, EntryState.UNKNOWN),  # never absent without NO answers
        (3, 3, False, 1, 1, 3, EntryState.ABSENT),  # A = W: one NO is enough
        (3, 1, False, 2, 3, 3, EntryState.UNKNOWN),  # A1: every replica must lack it
        (3, 1, False, 3, 3, 3, EntryState.ABSENT),
    ],
)
def test_entry_state(
    w: int, a: int, present: bool, missing: int, answered: int, asked: int, state: EntryState
) -> None:
    got = Quorum(w, w, a).entry_state(
        present=present, missing=missing, answered=answered, asked=asked
    )
    assert got is state


@pytest.mark.parametrize(("e", "w", "a"), [(2, 3, 1), (3, 2, 3), (3, 3, 0), (0, 0, 0)])
def test_invalid_sizes_are_refused(e: int, w: int, a: int) -> None:
    with pytest.raises(InvariantViolation):
        Quorum(e, w, a)


# --- the unfenced proof (a leader's leadership check) -----------------------------------------
@pytest.mark.parametrize(
    ("e", "w", "a", "not_fenced", "proven"),
    [
        (3, 3, 2, {0, 2}, True),
        (3, 3, 2, {1}, False),  # Qa - 1: a fence may have completed on the other two
        (3, 3, 3, {0, 1}, False),
        (3, 3, 3, {0, 1, 2}, True),
        (4, 2, 2, {0, 2}, False),  # Qa slots, but in no one write set
        (4, 2, 2, {3, 0}, True),
        (5, 3, 2, {1, 3}, True),  # write set {1,2,3}
        (3, 2, 1, {2}, True),
    ],
)
def test_proves_unfenced(e: int, w: int, a: int, not_fenced: set[int], proven: bool) -> None:
    q = Quorum(e, w, a)
    assert q.proves_unfenced(not_fenced) is proven
    # what did not answer "not fenced" may still do so, unless it failed
    assert q.can_still_prove_unfenced(set(range(e)) - not_fenced) is proven


@given(e=st.integers(1, 7), data=st.data())
def test_no_set_of_not_fenced_answers_is_consistent_with_a_complete_fence(e: int, data: st.DataObject) -> None:
    """The rule's safety: whenever a fence is complete (its fenced slots cover every write
    set, with or without regions), the slots left unfenced never prove the ledger unfenced."""
    w = data.draw(st.integers(1, e))
    a = data.draw(st.integers(1, w))
    regions_min = data.draw(st.integers(1, a))
    names = data.draw(st.lists(st.sampled_from(["r1", "r2", "r3", ""]), min_size=e, max_size=e))
    q = Quorum(e, w, a, regions_min)
    acks = SlotRegions.of(names) if regions_min > 1 else None  # the ack rule's (the probe's)
    fencing = SlotRegions.of(names, unknown_distinct=True) if regions_min > 1 else None  # recovery's
    fenced = data.draw(st.sets(st.integers(0, e - 1)))
    if q.covers_every_write_set(fenced, fencing):
        assert not q.proves_unfenced(set(range(e)) - fenced, acks), (e, w, a, regions_min, names, fenced)
