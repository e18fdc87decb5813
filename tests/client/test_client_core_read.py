"""ReadCore with scripted answers: one replica's failed range goes to the next as one read."""

from __future__ import annotations

from scriba.client.effects import DeliverEntries, OperationDone, ReadEntries, StartTimer
from scriba.client.read_core import ReadCore
from scriba.entry import make_digest, pack_entry
from scriba.errors import Status
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.records import LedgerMetadata, LedgerState

DIGEST = make_digest("crc32c", b"")
A, B, C = BookieId("a"), BookieId("b"), BookieId("c")


def closed_md(last: int) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=LedgerId(5), ensemble_size=3, write_quorum_size=3, ack_quorum_size=2,
        ensembles=((EntryId(0), (A, B, C)),), state=LedgerState.CLOSED,
        last_entry_id=EntryId(last), length=last + 1,
    )


def packed(entry_id: int) -> bytes:
    return pack_entry(DIGEST, 5, entry_id, entry_id - 1, entry_id + 1, b"p")


def test_failed_range_is_asked_of_the_next_replica_as_one_read() -> None:
    core = ReadCore(closed_md(9), 0, 9, digest=DIGEST, read_order=lambda ws: list(ws))
    (read, timer) = core.start()
    assert isinstance(read, ReadEntries) and read.bookie_id == A and read.entry_ids == tuple(range(10))
    assert isinstance(timer, StartTimer)
    # a answered the first three, then failed for the rest: the rest go to b together.
    effects = core.on_entries(A, [(e, packed(e), Status.OK) for e in range(3)])
    assert [len(e.entries) for e in effects if isinstance(e, DeliverEntries)] == [3]
    effects = core.on_entries(A, [(e, None, Status.UNAVAILABLE) for e in range(3, 10)])
    reads = [e for e in effects if isinstance(e, ReadEntries)]
    assert [(r.bookie_id, r.entry_ids) for r in reads] == [(B, tuple(range(3, 10)))]
    assert sum(isinstance(e, StartTimer) for e in effects) == 1
    # b returns a corrupt copy of entry 5 among good ones: only 5 goes to c.
    answers = [(e, packed(e), Status.OK) for e in range(3, 10)]
    answers[2] = (5, packed(5)[:-1] + b"q", Status.OK)
    effects = core.on_entries(B, answers)
    assert [len(e.entries) for e in effects if isinstance(e, DeliverEntries)] == [2]
    assert [(r.bookie_id, r.entry_ids) for r in effects if isinstance(r, ReadEntries)] == [(C, (5,))]
    effects = core.on_entry(C, 5, packed(5), Status.OK)
    delivered = [x.entry_id for e in effects if isinstance(e, DeliverEntries) for x in e.entries]
    assert delivered == [5, 6, 7, 8, 9] and isinstance(effects[-1], OperationDone)
