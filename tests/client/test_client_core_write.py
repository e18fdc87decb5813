"""WriteCore with scripted events: quorums, order, ensemble changes, fencing, close."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scriba.client.effects import CompleteAppends, FailAppends, SendAdd, StartTimer, WriteMetadata
from scriba.client.write_core import WriteConfig, WriteCore, WriterState
from scriba.entry import make_digest, unpack_entry
from scriba.errors import (
    LedgerClosedError,
    LedgerFencedError,
    NotEnoughBookiesError,
    Status,
)
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.records import LedgerMetadata, LedgerState

DIGEST = make_digest("crc32c", b"")
OK = Status.OK


def md(e: int = 3, w: int = 3, a: int = 2, bookies: str = "abc") -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=LedgerId(7),
        ensemble_size=e,
        write_quorum_size=w,
        ack_quorum_size=a,
        ensembles=((EntryId(0), tuple(BookieId(b) for b in bookies[:e])),),
    )


class Spares:
    def __init__(self, names: str = "xyz") -> None:
        self.names = list(names)
        self.calls: list[tuple[tuple[str, ...], int, frozenset[str]]] = []

    def __call__(self, ensemble, index, exclude):  # type: ignore[no-untyped-def]
        self.calls.append((ensemble, index, exclude))
        for n in self.names:
            if n not in exclude:
                return BookieId(n)
        raise NotEnoughBookiesError("no spare")


def core(meta: LedgerMetadata | None = None, **cfg: int) -> tuple[WriteCore, Spares]:
    spares = Spares()
    return WriteCore(meta or md(), digest=DIGEST, choose_replacement=spares, config=WriteConfig(**cfg)), spares


def completes(effects) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    return [(e.first, e.last) for e in effects if isinstance(e, CompleteAppends)]


def test_round_robin_write_sets_and_piggybacked_lac() -> None:
    c, _ = core(md(e=3, w=2, a=2))
    sends = []
    for i in range(4):
        entry_id, effects = c.append(b"p%d" % i)
        assert entry_id == i
        (send,) = effects
        assert isinstance(send, SendAdd)
        sends.append(send)
    assert [s.bookies for s in sends] == [("a", "b"), ("b", "c"), ("c", "a"), ("a", "b")]
    # Confirm entry 0, then the next entry carries LAC 0.
    c.on_add_response(BookieId("a"), 0, OK)
    assert completes(c.on_add_response(BookieId("b"), 0, OK)) == [(0, 0)]
    _, (send,) = c.append(b"next")
    entry = unpack_entry(DIGEST, send.entry)
    assert entry.last_add_confirmed == 0 and entry.entry_id == 4
    assert entry.length == sum(len(b"p%d" % i) for i in range(4)) + 4


def test_confirmations_strictly_in_order() -> None:
    c, _ = core()
    for _ in range(3):
        c.append(b"x")
    # Entry 2 and 1 reach quorum before 0: nothing confirmed yet.
    for b in "ab":
        assert not completes(c.on_add_response(BookieId(b), 2, OK))
        assert not completes(c.on_add_response(BookieId(b), 1, OK))
    assert c.last_add_confirmed == -1
    c.on_add_response(BookieId("c"), 0, OK)
    assert completes(c.on_add_response(BookieId("a"), 0, OK)) == [(0, 2)]
    assert c.last_add_confirmed == 2 and c.pending == 0


def test_ack_from_outside_the_write_set_does_not_count() -> None:
    c, _ = core(md(e=3, w=2, a=2))
    c.append(b"x")  # write set a, b
    assert not c.on_add_response(BookieId("c"), 0, OK)
    assert not c.on_add_response(BookieId("zzz"), 0, OK)
    assert not completes(c.on_add_response(BookieId("a"), 0, OK))
    assert c.last_add_confirmed == -1
    assert completes(c.on_add_response(BookieId("b"), 0, OK)) == [(0, 0)]


def test_ensemble_change_replaces_bookie_drops_its_acks_and_resends() -> None:
    c, spares = core()
    for _ in range(3):
        c.append(b"x")
    c.on_add_response(BookieId("a"), 0, OK)
    c.on_add_response(BookieId("b"), 0, OK)  # entry 0 confirmed
    c.on_add_response(BookieId("c"), 1, OK)  # c acked entry 1 ...
    effects = c.on_add_response(BookieId("c"), 2, Status.TIMEOUT)  # ... then c failed
    (wm,) = effects
    assert isinstance(wm, WriteMetadata) and wm.purpose == "ensemble_change"
    assert spares.calls[0][1] == 2 and {"a", "b", "c"} <= spares.calls[0][2]
    # c's ack for entry 1 no longer counts: one more ack from a is not a quorum.
    assert not completes(c.on_add_response(BookieId("a"), 1, OK))
    # Late acks from c are ignored.
    assert not c.on_add_response(BookieId("c"), 1, OK)
    new = wm.transform(c.metadata)
    assert new.ensembles == ((0, ("a", "b", "c")), (1, ("a", "b", "x")))
    effects = c.on_metadata_written(new)
    resent = {(e.entry_id, e.bookies) for e in effects if isinstance(e, SendAdd)}
    assert resent == {(1, ("x",)), (2, ("x",))}
    assert completes(c.on_add_response(BookieId("x"), 1, OK)) == [(1, 1)]
    # New appends go to the new ensemble.
    _, (send,) = c.append(b"y")
    assert send.bookies == ("a", "b", "x")


def test_change_with_no_confirmation_since_replaces_the_last_segment() -> None:
    c, _ = core()
    c.append(b"x")
    (wm,) = c.on_add_response(BookieId("a"), 0, Status.UNAVAILABLE)
    meta = wm.transform(c.metadata)
    assert meta.ensembles == ((0, ("x", "b", "c")),)
    c.on_metadata_written(meta)
    (wm2,) = c.on_add_response(BookieId("b"), 0, Status.UNAVAILABLE)
    meta2 = wm2.transform(meta)
    assert meta2.ensembles == ((0, ("x", "y", "c")),)


def test_failure_during_change_is_queued_for_the_next_change() -> None:
    c, _ = core()
    c.append(b"x")
    (wm,) = c.on_add_response(BookieId("a"), 0, Status.TIMEOUT)
    assert not c.on_add_response(BookieId("b"), 0, Status.TIMEOUT)
    effects = c.on_metadata_written(wm.transform(c.metadata))
    assert any(isinstance(e, WriteMetadata) for e in effects)


def test_ensemble_change_refused_when_ledger_is_being_recovered() -> None:
    c, _ = core()
    c.append(b"x")
    (wm,) = c.on_add_response(BookieId("a"), 0, Status.TIMEOUT)
    recovering = dataclasses.replace(c.metadata, state=LedgerState.IN_RECOVERY)
    assert wm.needs_update(recovering)
    with pytest.raises(LedgerFencedError):
        wm.transform(recovering)
    closed = dataclasses.replace(c.metadata, state=LedgerState.CLOSED)
    with pytest.raises(LedgerClosedError):
        wm.transform(closed)
    (fail,) = c.on_metadata_failed(LedgerFencedError("recovering"))
    assert isinstance(fail, FailAppends) and (fail.first, fail.last) == (0, 0)
    with pytest.raises(LedgerFencedError):
        c.append(b"more")


def test_fenced_bookie_fails_every_pending_append() -> None:
    c, _ = core()
    for _ in range(5):
        c.append(b"x")
    c.on_add_response(BookieId("a"), 0, OK)
    c.on_add_response(BookieId("b"), 0, OK)
    (fail,) = c.on_add_response(BookieId("b"), 3, Status.FENCED)
    assert isinstance(fail, FailAppends) and isinstance(fail.error, LedgerFencedError)
    assert (fail.first, fail.last) == (1, 4)
    assert c.state is WriterState.FAILED
    # Acks arriving after the fence confirm nothing.
    assert not c.on_add_response(BookieId("a"), 1, OK)
    assert not c.on_add_response(BookieId("c"), 1, OK)
    assert c.last_add_confirmed == 0
    with pytest.raises(LedgerFencedError):
        c.close()


def test_ensemble_changes_are_bounded() -> None:
    c, _ = core(ensemble_changes_max=1)
    c.append(b"x")
    (wm,) = c.on_add_response(BookieId("a"), 0, Status.TIMEOUT)
    c.on_metadata_written(wm.transform(c.metadata))
    (fail,) = c.on_add_response(BookieId("b"), 0, Status.TIMEOUT)
    assert isinstance(fail, FailAppends) and isinstance(fail.error, NotEnoughBookiesError)


def test_no_spare_bookie_waits_then_retries_the_same_bookie() -> None:
    c, spares = core(ensemble_changes_max=3)
    spares.names = []
    c.append(b"x")
    c.on_add_response(BookieId("b"), 0, OK)
    (timer,) = c.on_add_response(BookieId("a"), 0, Status.TIMEOUT)
    assert isinstance(timer, StartTimer) and timer.delay_s > 0
    # a's late ack does not count while it waits for a replacement.
    assert not c.on_add_response(BookieId("a"), 0, OK)
    assert c.last_add_confirmed == -1
    assert not c.on_timer(("replace", 999))  # a stale timer is ignored
    # Still no spare: entry 0 is re-sent to a itself.
    (resend,) = c.on_timer(timer.key)
    assert isinstance(resend, SendAdd) and resend.bookies == ("a",) and resend.entry_id == 0
    assert completes(c.on_add_response(BookieId("a"), 0, OK)) == [(0, 0)]


def test_no_spare_bookie_uses_one_that_appeared_meanwhile() -> None:
    c, spares = core()
    spares.names = []
    c.append(b"x")
    (timer,) = c.on_add_response(BookieId("a"), 0, Status.TIMEOUT)
    spares.names = ["x"]
    (wm,) = c.on_timer(timer.key)
    assert isinstance(wm, WriteMetadata)
    assert wm.transform(c.metadata).current_ensemble == ("x", "b", "c")


def test_no_spare_bookie_for_too_long_fails_appends() -> None:
    c, spares = core(ensemble_changes_max=2)
    spares.names = []
    c.append(b"x")
    effects = c.on_add_response(BookieId("a"), 0, Status.TIMEOUT)
    for _ in range(2):
        (timer,) = effects
        c.on_timer(timer.key)
        effects = c.on_add_response(BookieId("a"), 0, Status.TIMEOUT)
    (fail,) = effects
    assert isinstance(fail, FailAppends) and isinstance(fail.error, NotEnoughBookiesError)


def test_close_waits_for_pending_then_closes_at_lac() -> None:
    c, _ = core()
    c.append(b"ab")
    c.append(b"cde")
    assert not c.close()
    with pytest.raises(LedgerClosedError):
        c.append(b"late")
    c.on_add_response(BookieId("a"), 0, OK)
    c.on_add_response(BookieId("b"), 0, OK)
    c.on_add_response(BookieId("a"), 1, OK)
    effects = c.on_add_response(BookieId("c"), 1, OK)
    assert completes(effects) == [(1, 1)]
    (wm,) = [e for e in effects if isinstance(e, WriteMetadata)]
    closed = wm.transform(c.metadata)
    assert closed.state is LedgerState.CLOSED and closed.last_entry_id == 1 and closed.length == 5
    # A recovery that closed at the same point counts as success ...
    assert not wm.needs_update(closed)
    # ... one that closed elsewhere does not.
    with pytest.raises(LedgerFencedError):
        wm.needs_update(dataclasses.replace(closed, last_entry_id=EntryId(0)))
    c.on_metadata_written(closed)
    assert c.state is WriterState.CLOSED


def test_inflight_bounds() -> None:
    c, _ = core(entries_inflight_max=2, bytes_inflight_max=10_000)
    assert c.has_capacity(10)
    c.append(b"x")
    c.append(b"x")
    assert not c.has_capacity(10)
    c.on_add_response(BookieId("a"), 0, OK)
    c.on_add_response(BookieId("b"), 0, OK)
    assert c.has_capacity(10)
    assert not c.has_capacity(20_000)


@settings(max_examples=200, deadline=None)
@given(
    quorums=st.sampled_from([(3, 3, 2), (3, 2, 2), (5, 3, 2), (4, 4, 1), (2, 2, 2)]),
    n=st.integers(min_value=1, max_value=20),
    data=st.data(),
)
def test_property_any_ack_order_confirms_in_order(quorums, n, data) -> None:  # type: ignore[no-untyped-def]
    e, w, a = quorums
    c, _ = core(md(e, w, a, bookies="abcde"))
    acks = []
    for _ in range(n):
        entry_id, (send,) = c.append(b"p")
        acks += [(b, entry_id) for b in send.bookies]
    order = data.draw(st.permutations(acks))
    confirmed_up_to = -1
    counts: dict[int, int] = {}
    for bookie, entry_id in order:
        counts[entry_id] = counts.get(entry_id, 0) + 1
        for done in completes(c.on_add_response(bookie, entry_id, OK)):
            assert done[0] == confirmed_up_to + 1  # strictly in order, no gaps
            confirmed_up_to = done[1]
        # the LAC is the longest prefix whose every entry has an ack quorum
        prefix = -1
        while counts.get(prefix + 1, 0) >= a:
            prefix += 1
        assert c.last_add_confirmed == prefix == confirmed_up_to
    assert c.last_add_confirmed == n - 1 and c.pending == 0


def test_late_failure_of_a_confirmed_entry_still_replaces_the_bookie() -> None:
    c, spares = core()
    c.append(b"x")
    c.on_add_response(BookieId("a"), 0, OK)
    assert completes(c.on_add_response(BookieId("b"), 0, OK)) == [(0, 0)]
    # c times out on entry 0 after a and b confirmed it: c is dead or slow all the same.
    (wm,) = c.on_add_response(BookieId("c"), 0, Status.TIMEOUT)
    assert isinstance(wm, WriteMetadata) and wm.purpose == "ensemble_change"
    assert spares.calls[0][1] == 2
    new = wm.transform(c.metadata)
    # Every entry confirmed: the new segment starts at the next entry id.
    assert new.ensembles == ((0, ("a", "b", "c")), (1, ("a", "b", "x")))
    assert not [e for e in c.on_metadata_written(new) if isinstance(e, SendAdd)]
    _, (send,) = c.append(b"y")
    assert send.entry_id == 1 and set(send.bookies) == {"a", "b", "x"}
    # A second late error from the replaced bookie changes nothing.
    assert not c.on_add_response(BookieId("c"), 0, Status.UNAVAILABLE)


def test_late_failure_starts_the_segment_at_the_first_unconfirmed_entry() -> None:
    c, _ = core()
    for _ in range(3):
        c.append(b"x")
    for e in (0, 1):
        c.on_add_response(BookieId("a"), e, OK)
        c.on_add_response(BookieId("b"), e, OK)
    assert c.last_add_confirmed == 1
    (wm,) = c.on_add_response(BookieId("c"), 0, Status.UNAVAILABLE)
    new = wm.transform(c.metadata)
    assert new.ensembles == ((0, ("a", "b", "c")), (2, ("a", "b", "x")))
    resent = {(e.entry_id, e.bookies) for e in c.on_metadata_written(new) if isinstance(e, SendAdd)}
    assert resent == {(2, ("x",))}


def test_late_failure_after_close_is_ignored() -> None:
    c, _ = core()
    c.append(b"x")
    c.on_add_response(BookieId("a"), 0, OK)
    c.on_add_response(BookieId("b"), 0, OK)
    (wm,) = c.close()
    c.on_metadata_written(wm.transform(c.metadata))
    assert c.state is WriterState.CLOSED
    assert not c.on_add_response(BookieId("c"), 0, Status.TIMEOUT)
    assert not c.on_add_response(BookieId("c"), 0, Status.FENCED)
    assert c.state is WriterState.CLOSED


def _confirmed(effects, into: list[int]) -> None:  # type: ignore[no-untyped-def]
    for first, last in completes(effects):
        into.extend(range(first, last + 1))


@settings(max_examples=150, deadline=None)
@given(
    shape=st.sampled_from([(3, 3, 2), (3, 2, 2), (4, 3, 2), (5, 3, 3), (2, 2, 2), (5, 5, 3), (1, 1, 1), (11, 11, 6), (11, 4, 3)]),
    n=st.integers(1, 40),
    data=st.data(),
)
def test_batched_answers_confirm_like_single_ones(shape: tuple[int, int, int], n: int, data) -> None:  # type: ignore[no-untyped-def]
    """on_add_responses over any grouping and order of OK answers ends where the
    same answers one by one end: same LAC, same entries confirmed, in order."""
    e, w, a = shape
    single, _ = core(md(e, w, a, "abcdefghijk"))
    batched, _ = core(md(e, w, a, "abcdefghijk"))
    answers: list[tuple[str, int]] = []
    for i in range(n):
        entry_id, effects = single.append(b"p%d" % i)
        assert batched.append(b"p%d" % i)[0] == entry_id
        (send,) = effects
        answers += [(b, entry_id) for b in send.bookies]  # type: ignore[union-attr]
    answers = data.draw(st.permutations(answers))
    keep = data.draw(st.integers(0, len(answers)))
    answers = answers[:keep]
    done_single: list[int] = []
    for b, entry_id in answers:
        _confirmed(single.on_add_response(BookieId(b), entry_id, OK), done_single)
    done_batched: list[int] = []
    i = 0
    while i < len(answers):  # consecutive answers of one bookie go as one batch
        j = i + 1
        while j < len(answers) and answers[j][0] == answers[i][0] and j - i < data.draw(st.integers(1, 8)):
            j += 1
        ids = [entry_id for _, entry_id in answers[i:j]]
        _confirmed(batched.on_add_responses(BookieId(answers[i][0]), ids, OK), done_batched)
        i = j
    assert done_batched == done_single == list(range(len(done_single)))
    assert batched.last_add_confirmed == single.last_add_confirmed
    assert batched.pending == single.pending


def test_batched_error_answers_start_one_change() -> None:
    c, spares = core()
    for _ in range(4):
        c.append(b"x")
    c.on_add_responses(BookieId("a"), [0, 1, 2, 3], OK)
    effects = c.on_add_responses(BookieId("b"), [3, 1, 0, 2], Status.UNAVAILABLE)
    assert [type(x) for x in effects] == [WriteMetadata] and len(spares.calls) == 1
    assert c.last_add_confirmed == -1


def test_append_packed_matches_pack_entry_for_both_digests() -> None:
    from scriba.entry import pack_entry

    for digest in (make_digest("crc32c", b""), make_digest("hmac-sha256", b"pw")):
        c = WriteCore(md(), digest=digest, choose_replacement=Spares())
        c.on_add_responses(BookieId("a"), [], OK)
        for i in range(3):
            entry_id, packed, _ = c.append_packed(b"payload-%d" % i)
            length = sum(len(b"payload-%d" % k) for k in range(i + 1))
            assert packed == pack_entry(digest, 7, entry_id, -1, length, b"payload-%d" % i)
            assert unpack_entry(digest, packed).payload == b"payload-%d" % i
