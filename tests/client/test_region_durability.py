"""The synchronous geo mode in the cores: ``min_regions_for_durability`` in the ack rule.

A ledger whose record says ``min_regions_for_durability = R`` confirms an entry only
once its acks span ``R`` regions (``Quorum.is_acked(acks, regions)``); recovery fences,
declares entries absent and re-replicates with the same predicate; ensemble changes
keep the constraint or fail naming it. The write sets below are deliberately weaker
than the region-aware placement would allow (``A,A,B`` with ``Qa = 2``), so the ack
rule alone stands between an ack quorum inside one region and a confirmation.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scriba.client.effects import (
    CompleteAppends,
    OperationDone,
    ReadEntries,
    SendAdd,
    WriteMetadata,
)
from scriba.client.recovery_core import RecoveryCore, RecoveryPhase
from scriba.client.transport import LacResult
from scriba.client.write_core import WriteConfig, WriteCore
from scriba.client.write_metadata import ensemble_change_transform
from scriba.entry import make_digest, pack_entry
from scriba.errors import NotEnoughBookiesError, Status
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.records import LedgerMetadata
from scriba.quorum import Quorum, SlotRegions

DIGEST = make_digest("crc32c", b"")
OK = Status.OK
B = BookieId
REGIONS = {"a1": "east", "a2": "east", "b1": "west", "b2": "west", "c1": "north", "a3": "east"}


def md(bookies: tuple[str, ...] = ("a1", "a2", "b1"), a: int = 2, regions_min: int = 2,
       w: int | None = None) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=LedgerId(5), ensemble_size=len(bookies), write_quorum_size=w or len(bookies),
        ack_quorum_size=a, ensembles=((EntryId(0), tuple(B(b) for b in bookies)),),
        min_regions_for_durability=regions_min,
        bookie_regions={b: r for b, r in REGIONS.items() if b in bookies},
    )


class Spares:
    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def __call__(self, ensemble, index, exclude):  # type: ignore[no-untyped-def]
        for n in self.names:
            if n not in exclude:
                return B(n)
        raise NotEnoughBookiesError("no spare")


def writer(meta: LedgerMetadata, spares: tuple[str, ...] = ()) -> WriteCore:
    return WriteCore(meta, digest=DIGEST, choose_replacement=Spares(spares),
                     config=WriteConfig(ensemble_changes_max=3, replacement_retry_s=0.01),
                     region_of=lambda b: REGIONS.get(b))


def completes(effects) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    return [(e.first, e.last) for e in effects if isinstance(e, CompleteAppends)]


# --- Quorum --------------------------------------------------------------------------
def test_quorum_ack_rule_counts_regions() -> None:
    q = Quorum(3, 3, 2, regions_min=2)
    assert not q.is_acked(2, 1) and q.is_acked(2, 2) and not q.is_acked(1, 2)
    assert Quorum(3, 3, 2).is_acked(2)  # regions do not count by default
    with pytest.raises(Exception, match="regions_min"):
        Quorum(3, 3, 1, regions_min=2)  # one ack can never span two regions


def test_slot_regions_count_and_unknown_regions() -> None:
    r = SlotRegions.of(["east", "east", "west", None])
    assert [r.count(m) for m in (0b0001, 0b0011, 0b0101, 0b0111, 0b1000, 0b1001)] == [1, 1, 2, 2, 0, 1]
    assert r.count_slots([0, 2]) == 2


def test_fence_and_cover_rules_with_regions() -> None:
    q = Quorum(3, 3, 2, regions_min=2)
    r = SlotRegions.of(["east", "east", "west"])
    # The west slot alone fences: the two east slots cannot confirm without the west one.
    assert q.covers_every_write_set({2}, r) and not q.covers_every_write_set({0}, r)
    assert q.could_confirm([0, 2], r) and not q.could_confirm([0, 1], r)
    # East lost entirely: fencing is still possible (the west slot); west lost: too.
    assert q.can_still_cover({0, 1}, r) and q.can_still_cover({2}, r)
    # A count-only quorum needs W - Qa + 1 = 2 answers: one is not enough.
    assert not Quorum(3, 3, 2).covers_every_write_set({2})


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5), st.data())
def test_region_rules_equal_the_count_rules_when_regions_do_not_count(e: int, data: st.DataObject) -> None:
    w = data.draw(st.integers(1, e))
    a = data.draw(st.integers(1, w))
    answered = data.draw(st.sets(st.integers(0, e - 1)))
    q = Quorum(e, w, a)
    need = q.fence_quorum
    assert q.covers_every_write_set(answered) == all(
        sum(1 for s in ws if s in answered) >= need for ws in q.write_sets()
    )
    # With R regions required, "could confirm" is never easier than the count rule.
    if a >= 2:
        qr = Quorum(e, w, a, regions_min=2)
        r = SlotRegions.of(data.draw(st.lists(st.sampled_from(["x", "y", None]), min_size=e, max_size=e)))
        assert not qr.could_confirm(list(answered), r) or q.could_confirm(list(answered), None)


# --- WriteCore -----------------------------------------------------------------------
def test_writer_waits_for_a_second_region_before_confirming() -> None:
    c = writer(md())
    _, _, bookies = c.append(b"x") or (0, b"", ())
    assert bookies == ("a1", "a2", "b1")
    assert completes(c.on_add_response(B("a1"), 0, OK)) == []
    assert completes(c.on_add_response(B("a2"), 0, OK)) == [], "two acks in one region confirmed"
    assert c.last_add_confirmed == -1
    assert completes(c.on_add_response(B("b1"), 0, OK)) == [(0, 0)]


def test_writer_batched_answers_and_advance_count_regions() -> None:
    c = writer(md())
    for i in range(3):
        c.append(b"%d" % i)
    assert completes(c.on_add_responses(B("a1"), [0, 1, 2], OK)) == []
    assert completes(c.on_add_responses(B("a2"), [0, 1, 2], OK)) == []
    # Entry 1 and 2 reach west first; entry 0 then confirms all three at once.
    assert completes(c.on_add_responses(B("b1"), [1, 2], OK)) == []
    assert completes(c.on_add_response(B("b1"), 0, OK)) == [(0, 2)]


def test_advance_stops_at_an_entry_held_in_one_region() -> None:
    c = writer(md())
    c.append(b"0")
    c.append(b"1")
    for b in ("a1", "a2"):
        c.on_add_response(B(b), 0, OK)
        c.on_add_response(B(b), 1, OK)
    # Entry 0 reaches west; entry 1 has two acks but only east: it stays unconfirmed.
    assert completes(c.on_add_response(B("b1"), 0, OK)) == [(0, 0)]
    assert c.last_add_confirmed == 0 and c.pending == 1


def test_writer_without_regions_confirms_on_count_alone() -> None:
    c = writer(md(regions_min=1))
    c.append(b"x")
    c.on_add_response(B("a1"), 0, OK)
    assert completes(c.on_add_response(B("a2"), 0, OK)) == [(0, 0)]


def test_writer_refuses_an_ensemble_that_cannot_span_the_regions() -> None:
    with pytest.raises(NotEnoughBookiesError, match="min_regions_for_durability=2 cannot be met"):
        writer(md(bookies=("a1", "a2", "a3")))


def test_replacement_keeps_the_region_constraint_and_records_its_region() -> None:
    c = writer(md(), spares=("b2",))
    c.append(b"x")
    c.on_add_response(B("a1"), 0, OK)
    effects = c.on_add_response(B("b1"), 0, Status.TIMEOUT)  # west fails: replace it
    (wm,) = [e for e in effects if isinstance(e, WriteMetadata)]
    record = wm.transform(c.metadata)
    assert record.current_ensemble == ("a1", "a2", "b2")
    assert record.bookie_regions["b2"] == "west"
    effects = c.on_metadata_written(record)
    assert [e.bookies for e in effects if isinstance(e, SendAdd)] == [("b2",)]
    assert completes(c.on_add_response(B("a2"), 0, OK)) == []  # still one region
    assert completes(c.on_add_response(B("b2"), 0, OK)) == [(0, 0)]


def test_replacement_inside_the_same_region_is_refused_naming_the_constraint() -> None:
    c = writer(md(), spares=("a3",))  # the only spare is in east
    c.append(b"x")
    failures = []
    effects = c.on_add_response(B("b1"), 0, Status.TIMEOUT)
    for _ in range(10):  # each retry round counts against ensemble_changes_max
        if not effects:
            break
        failures += [e for e in effects if type(e).__name__ == "FailAppends"]
        timers = [e for e in effects if type(e).__name__ == "StartTimer"]
        effects = c.on_timer(timers[0].key) if timers else ()
        effects = list(effects) + list(c.on_add_response(B("b1"), 0, Status.TIMEOUT))
    assert c.error is not None
    assert "min_regions_for_durability=2 cannot be met" in str(c.error)


def test_change_transform_without_regions_leaves_the_record_alone() -> None:
    meta = md(regions_min=1)
    _, transform = ensemble_change_transform(0, (B("a1"), B("a2"), B("c1")))
    assert transform(meta).bookie_regions == meta.bookie_regions


# --- RecoveryCore ----------------------------------------------------------------------
def packed(entry_id: int, lac: int = -1) -> bytes:
    return pack_entry(DIGEST, 5, entry_id, lac, entry_id + 1, b"e")


def recover_to_reading(meta: LedgerMetadata, answering: tuple[str, ...]) -> tuple[RecoveryCore, list]:
    core = RecoveryCore(meta, digest=DIGEST)
    (wm,) = core.start()
    core.on_metadata_written(wm.transform(meta))
    effects: list = []
    for b in answering:
        effects = list(core.on_lac_response(B(b), LacResult(EntryId(-1), None), OK))
    return core, effects


def test_recovery_fences_with_the_surviving_region_alone() -> None:
    core, effects = recover_to_reading(md(), ("b1",))  # the whole east region is gone
    assert core.phase is RecoveryPhase.READING
    reads = {e.bookie_id for e in effects if isinstance(e, ReadEntries)}
    assert reads == {"a1", "a2", "b1"}  # reads go to the whole write set
    # Count rule for comparison: one answer of W=3/Qa=2 never fences.
    count_core, _ = recover_to_reading(md(regions_min=1), ("b1",))
    assert count_core.phase is RecoveryPhase.FENCING


def test_recovery_declares_absent_when_only_one_region_could_hold_it() -> None:
    core, _ = recover_to_reading(md(), ("b1",))
    # west has entry 0 and denies entry 1: east alone could not have confirmed 1.
    core.on_entry(B("b1"), 0, packed(0), OK)
    effects = core.on_entry(B("b1"), 1, None, Status.NO_SUCH_ENTRY)
    assert core.phase is RecoveryPhase.WRITING
    sends = [e for e in effects if isinstance(e, SendAdd)]
    assert [e.entry_id for e in sends] == [0]
    # Re-replication counts regions too: east acks alone do not finish it.
    assert core.on_add_response(B("a1"), 0, OK) == ()
    assert core.on_add_response(B("a2"), 0, OK) == ()
    (wm,) = core.on_add_response(B("b1"), 0, OK)
    closed = wm.transform(core.metadata)
    assert closed.last_entry_id == 0
    assert isinstance(core.on_metadata_written(closed)[0], OperationDone)


def test_recovery_rewrite_fails_once_the_regions_left_cannot_confirm() -> None:
    core, _ = recover_to_reading(md(), ("b1",))
    core.on_entry(B("b1"), 0, packed(0), OK)
    core.on_entry(B("b1"), 1, None, Status.NO_SUCH_ENTRY)
    effects = core.on_add_response(B("b1"), 0, Status.UNAVAILABLE)
    assert core.phase is RecoveryPhase.FAILED
    assert "min_regions_for_durability" in str(effects[0].error)  # type: ignore[attr-defined]


def test_metadata_round_trips_the_region_fields_and_omits_them_when_unset() -> None:
    meta = md()
    assert LedgerMetadata.from_bytes(meta.to_bytes()) == meta
    plain = dataclasses.replace(meta, min_regions_for_durability=1, bookie_regions={})
    assert b"bookie_regions" not in plain.to_bytes()
    assert meta.quorum.regions_min == 2


def _recovery_losing_west(spares: tuple[str, ...]) -> tuple[RecoveryCore, tuple]:
    meta = md()
    core = RecoveryCore(meta, digest=DIGEST, choose_replacement=Spares(spares), region_of=REGIONS.get)
    (wm,) = core.start()
    core.on_metadata_written(wm.transform(meta))
    core.on_lac_response(B("a1"), LacResult(EntryId(-1), None), OK)
    core.on_lac_response(B("a2"), LacResult(EntryId(-1), None), OK)
    assert core.phase is RecoveryPhase.READING  # east alone fences: west could not confirm alone
    core.on_entry(B("a1"), 0, packed(0), OK)
    core.on_entry(B("a1"), 1, None, Status.NO_SUCH_ENTRY)
    core.on_entry(B("a2"), 1, None, Status.NO_SUCH_ENTRY)
    assert core.phase is RecoveryPhase.WRITING
    core.on_add_response(B("a1"), 0, OK)
    assert core.on_add_response(B("a2"), 0, OK) == ()  # two acks, one region: not done
    return core, tuple(core.on_add_response(B("b1"), 0, Status.UNAVAILABLE))  # west is gone


def test_recovery_moves_the_tail_to_a_replacement_in_another_region() -> None:
    core, (change,) = _recovery_losing_west(("c1",))
    assert isinstance(change, WriteMetadata)
    record = change.transform(core.metadata)
    assert record.state.value == "IN_RECOVERY"
    assert record.ensembles == ((0, ("a1", "a2", "c1")),)
    assert record.bookie_regions["c1"] == "north"
    sends = core.on_metadata_written(record)
    assert [(e.entry_id, e.bookies) for e in sends if isinstance(e, SendAdd)] == [(0, ("a1", "a2", "c1"))]
    assert core.on_add_response(B("a1"), 0, OK) == ()
    assert core.on_add_response(B("b1"), 0, OK) == ()  # a late ack of the replaced bookie: ignored
    assert core.on_add_response(B("a2"), 0, OK) == ()
    (close,) = core.on_add_response(B("c1"), 0, OK)
    closed = close.transform(core.metadata)
    assert closed.last_entry_id == 0 and closed.current_ensemble == ("a1", "a2", "c1")


def test_recovery_replacement_that_breaks_the_regions_fails_naming_the_constraint() -> None:
    core, (failed,) = _recovery_losing_west(("a3",))
    assert core.phase is RecoveryPhase.FAILED
    assert "min_regions_for_durability=2 cannot be met" in str(failed.error)  # type: ignore[attr-defined]


def test_ack_rule_only_placement_admits_cheaper_quorums_and_records_the_rule() -> None:
    import random

    from scriba.errors import ConfigError
    from scriba.placement import BookieNode, Topology, make_policy

    topology = Topology.from_nodes(BookieNode.at(b, f"/{r}/z/{b}") for b, r in REGIONS.items())
    strict = make_policy("region-aware", rng=random.Random(1))
    with pytest.raises(ConfigError, match="impossible configuration"):
        strict.new_ensemble(topology, 3, 3, 2)  # BookKeeper's placement rule: 2 <= 3 - 3 // 2
    loose = make_policy("region-aware", {"ack_rule_only": True}, rng=random.Random(1))
    for _ in range(20):
        chosen = loose.new_ensemble(topology, 3, 3, 2).bookies
        assert len({REGIONS[b] for b in chosen}) >= 2
    assert loose.regions_for_durability == 2
    with pytest.raises(ConfigError, match="ack_quorum_size 1 < min_regions_for_durability 2"):
        loose.new_ensemble(topology, 3, 3, 1)
    with pytest.raises(ConfigError, match="needs enforce_durability"):
        make_policy("region-aware", {"ack_rule_only": True, "enforce_durability": False}).new_ensemble(
            topology, 3, 3, 2)


def test_a_bookie_of_unknown_region_counts_for_no_ack_but_could_have_confirmed() -> None:
    r = SlotRegions.of(["east", None, None], unknown_distinct=True)
    assert r.count(0b111) == 3
    meta = dataclasses.replace(md(), bookie_regions={"a1": "east", "a2": "east"})  # b1's region unknown
    # The writer counts b1 for no region, so the write set spans one known region.
    with pytest.raises(NotEnoughBookiesError, match="cannot be met"):
        writer(meta)
    # Recovery: a1 and a2 answering leave b1, which might hold a region of its own, but one
    # slot cannot confirm (Qa=2): fenced. a1 alone answering leaves a2 + b1: they could.
    core, _ = recover_to_reading(meta, ("a1",))
    assert core.phase is RecoveryPhase.FENCING
    core, _ = recover_to_reading(meta, ("a1", "a2"))
    assert core.phase is RecoveryPhase.READING
