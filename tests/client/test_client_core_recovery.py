"""RecoveryCore and ReadCore with scripted events."""

from __future__ import annotations

import dataclasses

import pytest

from scriba.client.effects import (
    DeliverEntries,
    OperationDone,
    OperationFailed,
    ReadEntries,
    ReadLac,
    SendAdd,
    StartTimer,
    WriteMetadata,
)
from scriba.client.read_core import LacReadCore, ReadConfig, ReadCore
from scriba.client.recovery_core import RecoveryCore, RecoveryPhase
from scriba.client.transport import LacResult
from scriba.entry import make_digest, pack_entry
from scriba.errors import (
    DigestMismatchError,
    InternalError,
    NoSuchEntryError,
    Status,
    UnavailableError,
)
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.records import LedgerMetadata, LedgerState

DIGEST = make_digest("crc32c", b"")
B = BookieId


def md(e: int = 3, w: int = 3, a: int = 2) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=LedgerId(9), ensemble_size=e, write_quorum_size=w, ack_quorum_size=a,
        ensembles=((EntryId(0), tuple(B(b) for b in "abcde"[:e])),),
    )


def packed(entry_id: int, lac: int = -1) -> bytes:
    return pack_entry(DIGEST, 9, entry_id, lac, (entry_id + 1) * 3, b"e%02d" % entry_id)


def corrupt(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0xFF])


def start_recovery(meta: LedgerMetadata) -> tuple[RecoveryCore, LedgerMetadata]:
    core = RecoveryCore(meta, digest=DIGEST)
    (wm,) = core.start()
    assert isinstance(wm, WriteMetadata) and wm.needs_update(meta)
    marked = wm.transform(meta)
    assert marked.state is LedgerState.IN_RECOVERY
    effects = core.on_metadata_written(marked)
    # Every bookie of the last ensemble is fenced (and nothing else happens first).
    assert all(isinstance(e, ReadLac) and e.fence for e in effects)
    assert sorted(e.bookie_id for e in effects) == sorted(meta.current_ensemble)  # type: ignore[union-attr]
    return core, marked


def answer_reads(core: RecoveryCore, effects, stores: dict[str, dict[int, bytes]]):  # type: ignore[no-untyped-def]
    """Answer every ReadEntries from ``stores`` until no reads remain; returns other effects."""
    queue = list(effects)
    out = []
    while queue:
        effect = queue.pop(0)
        if isinstance(effect, ReadEntries):
            assert effect.fence, "recovery reads carry the fence flag"
            for entry_id in effect.entry_ids:
                data = stores[effect.bookie_id].get(entry_id)
                status = Status.OK if data is not None else Status.NO_SUCH_ENTRY
                queue.extend(core.on_entry(effect.bookie_id, entry_id, data, status))
        else:
            out.append(effect)
    return out


def test_recovery_keeps_an_entry_found_on_one_replica_and_rewrites_it() -> None:
    core, _ = start_recovery(md())
    stores = {"a": {0: packed(0), 1: packed(1, 0)}, "b": {0: packed(0)}, "c": {0: packed(0)}}
    assert not core.on_lac_response(B("a"), LacResult(EntryId(0), EntryId(1)), Status.OK)
    effects = core.on_lac_response(B("b"), LacResult(EntryId(0), EntryId(0)), Status.OK)
    assert core.fenced
    rest = answer_reads(core, effects, stores)
    sends = [e for e in rest if isinstance(e, SendAdd)]
    assert [(s.entry_id, s.recovery, s.entry) for s in sends] == [(1, True, packed(1, 0))]
    assert set(sends[0].bookies) == {"a", "b", "c"}
    assert not core.on_add_response(B("b"), 1, Status.OK)
    (wm,) = core.on_add_response(B("c"), 1, Status.OK)
    closed = wm.transform(dataclasses.replace(md(), state=LedgerState.IN_RECOVERY))
    assert closed.last_entry_id == 1 and closed.length == 6
    (done,) = core.on_metadata_written(closed)
    assert isinstance(done, OperationDone) and core.phase is RecoveryPhase.DONE


def test_corrupt_copy_is_unknown_never_absent() -> None:
    # Entry 1: a corrupt copy on a, absent on b, c unreachable -> cannot decide.
    core, _ = start_recovery(md())
    core.on_lac_response(B("a"), LacResult(EntryId(0), EntryId(1)), Status.OK)
    effects = core.on_lac_response(B("b"), LacResult(EntryId(0), EntryId(0)), Status.OK)
    reads = [e for e in effects if isinstance(e, ReadEntries)]
    result = []
    for r in reads:
        for entry_id in r.entry_ids:
            if entry_id == 0:
                result += core.on_entry(r.bookie_id, 0, packed(0), Status.OK)
    result += core.on_entry(B("a"), 1, corrupt(packed(1, 0)), Status.OK)
    result += core.on_entry(B("b"), 1, None, Status.NO_SUCH_ENTRY)
    assert core.phase is RecoveryPhase.READING  # one NO is not enough (need Qw-Qa+1 = 2)
    result += core.on_entry(B("c"), 1, None, Status.TIMEOUT)
    (failed,) = [e for e in result if isinstance(e, OperationFailed)]
    assert isinstance(failed.error, UnavailableError) and failed.error.retriable


def test_two_no_answers_make_an_entry_absent() -> None:
    core, _ = start_recovery(md())
    for b in "abc":
        effects = core.on_lac_response(B(b), LacResult(EntryId(-1), EntryId(-1)), Status.OK)
        if effects:
            break
    rest = answer_reads(core, effects, {"a": {}, "b": {}, "c": {}})
    (wm,) = rest
    closed = wm.transform(dataclasses.replace(md(), state=LedgerState.IN_RECOVERY))
    assert closed.last_entry_id == -1 and closed.length == 0


def test_fencing_fails_when_a_write_set_cannot_be_covered() -> None:
    core, _ = start_recovery(md(3, 3, 3))  # need 1 per write set; fails only if all fail
    assert not core.on_lac_response(B("a"), None, Status.UNAVAILABLE)
    assert not core.on_lac_response(B("b"), None, Status.TIMEOUT)
    (failed,) = core.on_lac_response(B("c"), None, Status.UNAVAILABLE)
    assert isinstance(failed, OperationFailed)


def test_second_recoverer_adopts_the_closed_record() -> None:
    core = RecoveryCore(md(), digest=DIGEST)
    (wm,) = core.start()
    closed = dataclasses.replace(md(), state=LedgerState.CLOSED, last_entry_id=EntryId(4))
    assert not wm.needs_update(closed)
    (done,) = core.on_metadata_written(closed)
    assert isinstance(done, OperationDone) and done.value == closed


def read_core(meta: LedgerMetadata, first: int, last: int) -> ReadCore:
    return ReadCore(
        meta, first, last, digest=DIGEST, read_order=lambda ws: list(ws),
        config=ReadConfig(speculative_timeout_s=0.1),
    )


def test_read_falls_back_to_the_next_replica_on_a_bad_digest() -> None:
    core = read_core(md(), 0, 1)
    effects = core.start()
    (read,) = [e for e in effects if isinstance(e, ReadEntries)]
    assert read.bookie_id == "a" and read.entry_ids == (0, 1)  # Qw == E: one range
    out = core.on_entry(B("a"), 0, corrupt(packed(0)), Status.OK)
    (retry,) = [e for e in out if isinstance(e, ReadEntries)]
    assert retry.bookie_id == "b" and retry.entry_ids == (0,)
    assert not [e for e in core.on_entry(B("a"), 1, packed(1), Status.OK) if isinstance(e, DeliverEntries)]
    out = core.on_entry(B("b"), 0, packed(0), Status.OK)
    (delivered,) = [e for e in out if isinstance(e, DeliverEntries)]
    assert [e.entry_id for e in delivered.entries] == [0, 1]  # type: ignore[attr-defined]
    assert any(isinstance(e, OperationDone) for e in out)


def test_digest_mismatch_only_when_every_replica_is_bad() -> None:
    core = read_core(md(), 0, 0)
    core.start()
    core.on_entry(B("a"), 0, corrupt(packed(0)), Status.OK)
    core.on_entry(B("b"), 0, None, Status.CORRUPT)
    (failed,) = [e for e in core.on_entry(B("c"), 0, corrupt(packed(0)), Status.OK)
                 if isinstance(e, OperationFailed)]
    assert isinstance(failed.error, DigestMismatchError)

    core = read_core(md(), 0, 0)
    core.start()
    for b in "abc":
        out = core.on_entry(B(b), 0, None, Status.NO_SUCH_ENTRY)
    (failed,) = [e for e in out if isinstance(e, OperationFailed)]
    assert isinstance(failed.error, NoSuchEntryError)


def test_speculative_read_after_timeout() -> None:
    core = read_core(md(), 0, 0)
    effects = core.start()
    (timer,) = [e for e in effects if isinstance(e, StartTimer)]
    out = core.on_timer(timer.key)
    (spec,) = [e for e in out if isinstance(e, ReadEntries)]
    assert spec.bookie_id == "b"
    out = core.on_entry(B("b"), 0, packed(0), Status.OK)
    assert any(isinstance(e, DeliverEntries) for e in out)
    assert not core.on_entry(B("a"), 0, packed(0), Status.OK)  # the slow answer is ignored


def test_lac_read_needs_quorum_coverage() -> None:
    core = LacReadCore(md(3, 3, 2))
    assert len(core.start()) == 3
    assert not core.on_lac_response(B("a"), LacResult(EntryId(5), EntryId(6)), Status.OK)
    (done,) = core.on_lac_response(B("c"), LacResult(EntryId(7), EntryId(7)), Status.OK)
    assert isinstance(done, OperationDone) and done.value == 7


def fenced_reading(meta: LedgerMetadata, lacs: list[tuple[str, int]]):  # type: ignore[no-untyped-def]
    """Start a recovery and answer the fencing LAC reads in the order given (bookie, LAC);
    returns the core and the effects of the answer that completed fencing."""
    core, _ = start_recovery(meta)
    effects: list = []
    for bookie, lac in lacs:
        assert not core.fenced
        effects = list(core.on_lac_response(B(bookie), LacResult(EntryId(lac), EntryId(lac)), Status.OK))
    assert core.fenced
    return core, effects


def test_recovery_reads_from_the_largest_lac_whatever_the_answer_order() -> None:
    stores = {b: {e: packed(e, e - 1) for e in range(7)} for b in "abc"}
    for order in (["a", "b"], ["b", "a"]):
        lacs = {"a": 5, "b": 3}
        core, effects = fenced_reading(md(), [(b, lacs[b]) for b in order])
        reads = [e for e in effects if isinstance(e, ReadEntries)]
        assert reads and min(min(r.entry_ids) for r in reads) == 5, order
        rest = answer_reads(core, effects, stores)
        # Entries at or below the largest LAC are confirmed: only 6 is re-written.
        assert [s.entry_id for s in rest if isinstance(s, SendAdd)] == [6], order


def test_entry_below_the_largest_lac_that_reads_absent_fails_the_recovery() -> None:
    # a answered LAC 5 first, b LAC 2 last: entry 4 is confirmed, so 2 NO answers for it
    # mean something is badly wrong; recovery must not close the ledger below it.
    core, effects = fenced_reading(md(), [("a", 5), ("b", 2)])
    stores: dict[str, dict[int, bytes]] = {b: {e: packed(e, e - 1) for e in range(4)} for b in "abc"}
    (failed,) = answer_reads(core, effects, stores)
    assert isinstance(failed, OperationFailed) and isinstance(failed.error, InternalError)


@pytest.mark.parametrize("wrong", ["entry", "ledger"])
def test_valid_copy_with_another_entrys_header_is_unknown_never_present(wrong: str) -> None:
    """A replica that returns a valid entry of another position (or ledger) for entry 1
    is counted as unknown, like a corrupt copy: never as entry 1, never as absent."""
    other = packed(2, 1) if wrong == "entry" else pack_entry(DIGEST, 8, 1, 0, 6, b"e01")
    core, _ = fenced_reading(md(), [("a", 0), ("b", 0)])
    for b in "abc":  # entry 0 (the LAC) is present; entries 1.. are being read
        core.on_entry(B(b), 0, packed(0), Status.OK)
    assert core.phase is RecoveryPhase.READING
    out = list(core.on_entry(B("a"), 1, other, Status.OK))
    out += core.on_entry(B("b"), 1, None, Status.NO_SUCH_ENTRY)
    assert core.phase is RecoveryPhase.READING  # one NO and one unknown: undecided
    out += core.on_entry(B("c"), 1, None, Status.TIMEOUT)
    (failed,) = [e for e in out if isinstance(e, OperationFailed)]
    assert isinstance(failed.error, UnavailableError) and "wrong entry header" in str(failed.error)


def test_valid_copy_with_another_entrys_header_does_not_hide_the_right_one() -> None:
    core, _ = fenced_reading(md(), [("a", 0), ("b", 0)])
    for b in "abc":
        core.on_entry(B(b), 0, packed(0), Status.OK)
    out = list(core.on_entry(B("a"), 1, packed(2, 1), Status.OK))
    out += core.on_entry(B("b"), 1, packed(1, 0), Status.OK)
    for entry_id in range(2, 17):  # the rest of the read window: absent everywhere
        for b in "abc":
            out += core.on_entry(B(b), entry_id, None, Status.NO_SUCH_ENTRY)
    (send,) = [e for e in out if isinstance(e, SendAdd)]
    assert (send.entry_id, send.entry, send.recovery) == (1, packed(1, 0), True)


def test_rewrite_needs_qa_acks_and_fails_once_qa_is_out_of_reach() -> None:
    stores = {"a": {0: packed(0), 1: packed(1, 0)}, "b": {0: packed(0)}, "c": {0: packed(0)}}
    core, effects = fenced_reading(md(), [("a", 0), ("b", 0)])
    (send,) = answer_reads(core, effects, stores)
    assert isinstance(send, SendAdd) and send.recovery
    assert not core.on_add_response(B("a"), 1, Status.FENCED)  # one failure: 2 can still ack
    assert not core.on_add_response(B("b"), 1, Status.OK)
    assert core.phase is RecoveryPhase.WRITING
    (failed,) = core.on_add_response(B("c"), 1, Status.UNAVAILABLE)
    assert isinstance(failed, OperationFailed) and isinstance(failed.error, UnavailableError)


def test_lac_read_answers_the_largest_lac_whatever_the_order() -> None:
    core = LacReadCore(md(3, 3, 2))
    core.start()
    assert not core.on_lac_response(B("a"), LacResult(EntryId(9), EntryId(9)), Status.OK)
    (done,) = core.on_lac_response(B("c"), LacResult(EntryId(4), EntryId(4)), Status.OK)
    assert isinstance(done, OperationDone) and done.value == 9
