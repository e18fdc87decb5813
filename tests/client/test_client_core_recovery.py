"""RecoveryCore and ReadCore with scripted events."""

from __future__ import annotations

import dataclasses

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
from scriba.client.recovery_core import RecoveryCore, RecoveryPhase, covers_every_write_set
from scriba.client.transport import LacResult
from scriba.entry import make_digest, pack_entry
from scriba.errors import DigestMismatchError, NoSuchEntryError, Status, UnavailableError
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


def test_fence_coverage_needs_every_write_set() -> None:
    # E5 W3 A2: need 2 answers in each of the 5 write sets.
    assert covers_every_write_set({0, 1, 2, 3, 4}, 5, 3, 2)
    assert not covers_every_write_set({0, 2}, 5, 3, 2)
    assert covers_every_write_set({0, 1, 3}, 5, 3, 2) is False
    assert covers_every_write_set({0, 1, 2, 3}, 5, 3, 2)
    # E3 W3 A3: one answer is enough; E3 W3 A1: every bookie.
    assert covers_every_write_set({1}, 3, 3, 3)
    assert not covers_every_write_set({0, 1}, 3, 3, 1)


def start_recovery(meta: LedgerMetadata) -> tuple[RecoveryCore, LedgerMetadata]:
    core = RecoveryCore(meta, digest=DIGEST)
    (wm,) = core.start()
    assert isinstance(wm, WriteMetadata) and wm.needs_update(meta)
    marked = wm.transform(meta)
    assert marked.state is LedgerState.IN_RECOVERY
    effects = core.on_metadata_written(marked)
    assert {e.bookie_id for e in effects if isinstance(e, ReadLac) and e.fence} == {"a", "b", "c"}
    return core, marked


def answer_reads(core: RecoveryCore, effects, stores: dict[str, dict[int, bytes]]):  # type: ignore[no-untyped-def]
    """Answer every ReadEntries from ``stores`` until no reads remain; returns other effects."""
    queue = list(effects)
    out = []
    while queue:
        effect = queue.pop(0)
        if isinstance(effect, ReadEntries):
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
