"""WriteCore with scripted events: quorums, order, ensemble changes, fencing, close."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scriba.client.effects import CompleteAppends, FailAppends, SendAdd, StartTimer, WriteMetadata
from scriba.client.write_core import Append, WriteConfig, WriteCore
from scriba.client.writer_state import WriterState
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


def append(c: WriteCore, payload: bytes) -> Append:
    """``c.append`` when it must have room (the one way an entry enters the core)."""
    sent = c.append(payload)
    assert sent is not None, "no room in flight"
    return sent


def test_round_robin_write_sets_and_piggybacked_lac() -> None:
    c, _ = core(md(e=3, w=2, a=2))
    sends = []
    for i in range(4):
        entry_id, packed, bookies = append(c, b"p%d" % i)
        assert entry_id == i
        sends.append(bookies)
    assert sends == [("a", "b"), ("b", "c"), ("c", "a"), ("a", "b")]
    # Confirm entry 0, then the next entry carries LAC 0.
    c.on_add_response(BookieId("a"), 0, OK)
    assert completes(c.on_add_response(BookieId("b"), 0, OK)) == [(0, 0)]
    _, packed, _ = append(c, b"next")
    entry = unpack_entry(DIGEST, packed)
    assert entry.last_add_confirmed == 0 and entry.entry_id == 4
    assert entry.length == sum(len(b"p%d" % i) for i in range(4)) + 4


def test_ensemble_change_replaces_bookie_drops_its_acks_and_resends() -> None:
    c, spares = core()
    for _ in range(3):
        append(c, b"x")
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
    assert append(c, b"y")[2] == ("a", "b", "x")


def test_entries_confirmed_while_a_change_is_written_still_reach_the_replacement() -> None:
    """The replacement's slot holds every entry of the new segment, including those the rest
    of the write set confirmed while the change was being written (else they would sit on
    fewer than Qw bookies until autorecovery found them)."""
    c, _ = core()
    for _ in range(3):
        append(c, b"x")
    (wm,) = c.on_add_response(BookieId("c"), 0, Status.TIMEOUT)  # change from entry 0
    for e in range(3):
        c.on_add_response(BookieId("a"), e, OK)
        c.on_add_response(BookieId("b"), e, OK)
    assert c.last_add_confirmed == 2  # confirmed by a and b while the change is in flight
    new = wm.transform(c.metadata)
    assert new.ensembles == ((0, ("a", "b", "x")),)
    effects = c.on_metadata_written(new)
    resent = sorted((e.entry_id, e.bookies) for e in effects if isinstance(e, SendAdd))
    assert resent == [(0, ("x",)), (1, ("x",)), (2, ("x",))]
    assert all(unpack_entry(DIGEST, e.entry).entry_id == e.entry_id for e in effects if isinstance(e, SendAdd))
    assert c.bytes_inflight == 0  # held only until they were sent to the replacement


def test_entries_confirmed_while_waiting_for_a_spare_start_the_new_segment() -> None:
    """No spare at first: entries confirmed by the others meanwhile never went to the failed
    slot, so the segment that replaces it starts at the first of them, and they are sent."""
    c, spares = core()
    spares.names = []
    append(c, b"x")
    (timer,) = c.on_add_response(BookieId("c"), 0, Status.TIMEOUT)
    for _ in range(1, 3):
        append(c, b"y")
    for e in range(3):
        c.on_add_response(BookieId("a"), e, OK)
        c.on_add_response(BookieId("b"), e, OK)
    assert c.last_add_confirmed == 2
    spares.names = ["x"]
    (wm,) = c.on_timer(timer.key)
    new = wm.transform(c.metadata)
    assert new.ensembles == ((0, ("a", "b", "x")),)
    resent = sorted((e.entry_id, e.bookies) for e in c.on_metadata_written(new) if isinstance(e, SendAdd))
    assert resent == [(0, ("x",)), (1, ("x",)), (2, ("x",))]


def test_change_with_no_confirmation_since_replaces_the_last_segment() -> None:
    c, _ = core()
    append(c, b"x")
    (wm,) = c.on_add_response(BookieId("a"), 0, Status.UNAVAILABLE)
    meta = wm.transform(c.metadata)
    assert meta.ensembles == ((0, ("x", "b", "c")),)
    c.on_metadata_written(meta)
    (wm2,) = c.on_add_response(BookieId("b"), 0, Status.UNAVAILABLE)
    meta2 = wm2.transform(meta)
    assert meta2.ensembles == ((0, ("x", "y", "c")),)


def test_failure_during_change_is_queued_for_the_next_change() -> None:
    c, _ = core()
    append(c, b"x")
    (wm,) = c.on_add_response(BookieId("a"), 0, Status.TIMEOUT)
    assert not c.on_add_response(BookieId("b"), 0, Status.TIMEOUT)
    effects = c.on_metadata_written(wm.transform(c.metadata))
    assert any(isinstance(e, WriteMetadata) for e in effects)


def test_ensemble_change_refused_when_ledger_is_being_recovered() -> None:
    c, _ = core()
    append(c, b"x")
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
        append(c, b"x")
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
    append(c, b"x")
    (wm,) = c.on_add_response(BookieId("a"), 0, Status.TIMEOUT)
    c.on_metadata_written(wm.transform(c.metadata))
    (fail,) = c.on_add_response(BookieId("b"), 0, Status.TIMEOUT)
    assert isinstance(fail, FailAppends) and isinstance(fail.error, NotEnoughBookiesError)


def test_no_spare_bookie_waits_then_retries_the_same_bookie() -> None:
    c, spares = core(ensemble_changes_max=3)
    spares.names = []
    append(c, b"x")
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
    append(c, b"x")
    (timer,) = c.on_add_response(BookieId("a"), 0, Status.TIMEOUT)
    spares.names = ["x"]
    (wm,) = c.on_timer(timer.key)
    assert isinstance(wm, WriteMetadata)
    assert wm.transform(c.metadata).current_ensemble == ("x", "b", "c")


def test_no_spare_bookie_for_too_long_fails_appends() -> None:
    c, spares = core(ensemble_changes_max=2)
    spares.names = []
    append(c, b"x")
    effects = c.on_add_response(BookieId("a"), 0, Status.TIMEOUT)
    for _ in range(2):
        (timer,) = effects
        c.on_timer(timer.key)
        effects = c.on_add_response(BookieId("a"), 0, Status.TIMEOUT)
    (fail,) = effects
    assert isinstance(fail, FailAppends) and isinstance(fail.error, NotEnoughBookiesError)


def test_close_waits_for_pending_then_closes_at_lac() -> None:
    c, _ = core()
    append(c, b"ab")
    append(c, b"cde")
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
    append(c, b"x")
    append(c, b"x")
    # No room: None, and nothing changed (no id taken, no length counted).
    assert c.append(b"x") is None
    assert (c.next_entry_id, c.pending) == (2, 2)
    c.on_add_response(BookieId("a"), 0, OK)
    c.on_add_response(BookieId("b"), 0, OK)
    assert c.append(b"y" * 20_000) is None  # over the byte bound with one in flight
    assert append(c, b"y" * 10)[0] == 2
    c.on_add_responses(BookieId("a"), [1, 2], OK)
    c.on_add_responses(BookieId("b"), [1, 2], OK)
    assert c.pending == 0
    # With nothing in flight any single entry goes, however large.
    entry_id, packed, _ = append(c, b"z" * 20_000)
    assert entry_id == 3
    assert unpack_entry(DIGEST, packed).length == 2 + 10 + 20_000


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
        entry_id, _, bookies = append(c, b"p")
        acks += [(b, entry_id) for b in bookies]
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
    append(c, b"x")
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
    entry_id, _, bookies = append(c, b"y")
    assert entry_id == 1 and set(bookies) == {"a", "b", "x"}
    # A second late error from the replaced bookie changes nothing.
    assert not c.on_add_response(BookieId("c"), 0, Status.UNAVAILABLE)


def test_late_failure_starts_the_segment_at_the_first_unconfirmed_entry() -> None:
    c, _ = core()
    for _ in range(3):
        append(c, b"x")
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
    append(c, b"x")
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
    shape=st.sampled_from([(3, 3, 2), (3, 2, 2), (4, 3, 2), (5, 3, 3), (2, 2, 2), (5, 5, 3), (1, 1, 1), (11, 11, 6), (11, 4, 3), (4, 2, 1)]),
    n=st.integers(1, 40),
    data=st.data(),
)
def test_batched_answers_confirm_like_single_ones(shape: tuple[int, int, int], n: int, data) -> None:  # type: ignore[no-untyped-def]
    """on_add_responses over any grouping and order of OK answers ends where the
    same answers one by one end: same LAC, same entries confirmed, in order. Answers
    come from every bookie of the ensemble, in and out of each entry's write set: the
    LAC is the longest prefix whose every entry has Qa acks *from its write set*."""
    e, w, a = shape
    meta = md(e, w, a, "abcdefghijk")
    single, _ = core(meta)
    batched, _ = core(meta)
    answers: list[tuple[str, int]] = []
    for i in range(n):
        entry_id, _, bookies = append(single, b"p%d" % i)
        assert append(batched, b"p%d" % i)[0] == entry_id
        assert bookies == meta.write_set(entry_id)
        answers += [(b, entry_id) for b in meta.current_ensemble]
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
    counts = {x: sum(1 for b, y in answers if y == x and b in meta.write_set(x)) for x in range(n)}
    prefix = -1
    while prefix + 1 < n and counts[prefix + 1] >= a:
        prefix += 1
    assert done_batched == done_single == list(range(prefix + 1))
    assert batched.last_add_confirmed == single.last_add_confirmed == prefix
    assert batched.pending == single.pending == n - prefix - 1


def test_batched_error_answers_start_one_change() -> None:
    c, spares = core()
    for _ in range(4):
        append(c, b"x")
    c.on_add_responses(BookieId("a"), [0, 1, 2, 3], OK)
    effects = c.on_add_responses(BookieId("b"), [3, 1, 0, 2], Status.UNAVAILABLE)
    assert [type(x) for x in effects] == [WriteMetadata] and len(spares.calls) == 1
    assert c.last_add_confirmed == -1


@pytest.mark.parametrize("digest_type", ["crc32c", "hmac-sha256"])
def test_append_packs_the_confirmed_lac_and_the_running_length(digest_type: str) -> None:
    """Every packed entry carries the LAC confirmed when it was packed (never one
    more) and the ledger's length through itself; close and ``length`` agree with the
    sum of the confirmed payloads."""
    from scriba.entry import pack_entry

    digest = make_digest(digest_type, b"pw")
    c = WriteCore(md(), digest=digest, choose_replacement=Spares())
    payloads = [b"payload-%d" % i + b"x" * i for i in range(6)]
    total = 0
    for i, payload in enumerate(payloads):
        lac = c.last_add_confirmed
        entry_id, packed, _ = append(c, payload)
        total += len(payload)
        assert entry_id == i
        assert packed == pack_entry(digest, 7, entry_id, lac, total, payload)
        entry = unpack_entry(digest, packed)
        assert (entry.last_add_confirmed, entry.length, entry.payload) == (lac, total, payload)
        if i % 2 == 1:  # confirm every entry so far: the next one carries the new LAC
            c.on_add_responses(BookieId("a"), list(range(i + 1)), OK)
            c.on_add_responses(BookieId("c"), list(range(i + 1)), OK)
            assert c.last_add_confirmed == i
            assert c.length == total
    (wm,) = c.close()
    closed = wm.transform(c.metadata)
    assert closed.last_entry_id == len(payloads) - 1
    assert closed.length == c.length == sum(len(p) for p in payloads)


def test_append_that_cannot_pack_changes_nothing() -> None:
    c, _ = core()
    with pytest.raises(TypeError):
        c.append("text")  # type: ignore[arg-type]
    assert (c.next_entry_id, c.pending) == (0, 0)
    assert append(c, b"ok")[0] == 0
    c.on_add_responses(BookieId("a"), [0], OK)
    c.on_add_responses(BookieId("b"), [0], OK)
    assert c.length == 2


# --- ack accounting, through both answer handlers ----------------------------------------

def _single(c: WriteCore, bookie: str, entry_id: int, status: int = OK):  # type: ignore[no-untyped-def]
    return c.on_add_response(BookieId(bookie), entry_id, status)


def _batched(c: WriteCore, bookie: str, entry_id: int, status: int = OK):  # type: ignore[no-untyped-def]
    return c.on_add_responses(BookieId(bookie), [entry_id], status)


HANDLERS = pytest.mark.parametrize("answer", [_single, _batched], ids=["single", "batched"])


@HANDLERS
def test_ack_from_outside_the_write_set_does_not_count(answer) -> None:  # type: ignore[no-untyped-def]
    c, _ = core(md(e=3, w=2, a=2))
    append(c, b"x")  # write set a, b
    assert not answer(c, "c", 0)
    assert not answer(c, "zzz", 0)
    assert not completes(answer(c, "a", 0))
    assert c.last_add_confirmed == -1
    assert completes(answer(c, "b", 0)) == [(0, 0)]


@HANDLERS
def test_acks_from_the_slots_just_outside_the_write_set_do_not_count(answer) -> None:  # type: ignore[no-untyped-def]
    # E4 W2 A2: entry 1's write set is slots 1, 2 (b, c); a (slot 0) is just before it
    # and d (slot 3) just after it. Had either ack counted, entry 1 would be confirmed
    # together with entry 0.
    c, _ = core(md(e=4, w=2, a=2, bookies="abcd"))
    for _ in range(2):
        append(c, b"x")
    assert not answer(c, "d", 1)  # just after: slot (1 + Qw) % E
    assert not answer(c, "a", 1)  # just before: slot (1 - 1) % E
    assert not completes(answer(c, "b", 1))  # one ack of the write set: not a quorum
    answer(c, "a", 0)
    assert completes(answer(c, "b", 0)) == [(0, 0)]  # entry 1 still has one valid ack
    assert c.last_add_confirmed == 0
    assert completes(answer(c, "c", 1)) == [(1, 1)]


def test_batched_answer_counts_only_the_entries_whose_write_set_holds_the_bookie() -> None:
    # E3 W2 A2: c holds entries 1 and 2 (write sets (b, c) and (c, a)), not entry 0.
    c, _ = core(md(e=3, w=2, a=2))
    for _ in range(3):
        append(c, b"x")
    assert not c.on_add_responses(BookieId("c"), [0, 1, 2], OK)
    assert not completes(c.on_add_responses(BookieId("a"), [0], OK))  # entry 0: a only
    assert c.last_add_confirmed == -1
    assert completes(c.on_add_responses(BookieId("b"), [0, 1], OK)) == [(0, 1)]
    assert completes(c.on_add_responses(BookieId("a"), [2], OK)) == [(2, 2)]


@HANDLERS
def test_confirmations_strictly_in_order(answer) -> None:  # type: ignore[no-untyped-def]
    c, _ = core()
    for _ in range(3):
        append(c, b"x")
    # Entry 2 and 1 reach quorum before 0: nothing confirmed yet.
    for b in "ab":
        assert not completes(answer(c, b, 2))
        assert not completes(answer(c, b, 1))
    assert c.last_add_confirmed == -1
    answer(c, "c", 0)
    assert completes(answer(c, "a", 0)) == [(0, 2)]
    assert c.last_add_confirmed == 2 and c.pending == 0


@HANDLERS
def test_acks_of_a_replaced_bookie_no_longer_count(answer) -> None:  # type: ignore[no-untyped-def]
    c, _ = core()
    for _ in range(2):
        append(c, b"x")
    answer(c, "c", 1)
    (wm,) = answer(c, "c", 0, Status.TIMEOUT)
    assert isinstance(wm, WriteMetadata)
    assert not answer(c, "c", 1)  # late ack of the bookie being replaced
    assert not completes(answer(c, "a", 1))  # c's earlier ack was dropped
    assert c.last_add_confirmed == -1
