"""ReadCore with scripted answers: one replica's failed range goes to the next as one read."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from scriba.client.effects import (
    DeliverEntries,
    OperationDone,
    OperationFailed,
    ReadEntries,
    StartTimer,
)
from scriba.client.read_core import ReadConfig, ReadCore
from scriba.client.transport import EntryRun
from scriba.entry import Entry, make_digest, pack_entry, unpack_entry
from scriba.errors import DigestMismatchError, Status
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


def run_of(first: int, entries: list[bytes]) -> EntryRun:
    return EntryRun(EntryId(first), list(accumulate(map(len, entries))), b"".join(entries))


def delivered_ids(effects: Sequence[object]) -> list[int]:
    return [x.entry_id for e in effects if isinstance(e, DeliverEntries) for x in e.entries]  # type: ignore[attr-defined]


def test_a_run_is_verified_in_place_and_its_bad_copies_go_to_the_next_replica() -> None:
    core = ReadCore(closed_md(9), 0, 9, digest=DIGEST, read_order=lambda ws: list(ws))
    core.start()
    copies = [packed(e) for e in range(10)]
    copies[5] = copies[5][:-1] + bytes([copies[5][-1] ^ 1])  # payload flipped: digest mismatch
    copies[7] = packed(8)  # a valid entry, but another one
    effects = core.on_run(A, run_of(0, copies))
    assert delivered_ids(effects) == [0, 1, 2, 3, 4]
    got = [x for e in effects if isinstance(e, DeliverEntries) for x in e.entries]
    assert got == [unpack_entry(DIGEST, packed(e)) for e in range(5)]  # equal to the usual decode
    assert type(got[0]) is Entry
    assert [(r.bookie_id, r.entry_ids) for r in effects if isinstance(r, ReadEntries)] == [(B, (5, 7))]
    assert core.on_run(A, run_of(0, [packed(0)])) == []  # late duplicates are ignored
    effects = core.on_run(B, run_of(5, [packed(5), packed(6), packed(7)]))
    assert delivered_ids(effects) == [5, 6, 7, 8, 9] and isinstance(effects[-1], OperationDone)


def test_every_replica_bad_in_runs_fails_with_digest_mismatch() -> None:
    core = ReadCore(closed_md(3), 0, 3, digest=DIGEST, read_order=lambda ws: list(ws))
    core.start()
    bad = packed(2)[:-1] + b"!"
    assert delivered_ids(core.on_run(A, run_of(0, [packed(0), packed(1), bad, packed(3)]))) == [0, 1]
    core.on_run(B, run_of(2, [bad]))
    effects = core.on_run(C, run_of(2, [bad[:20]]))  # too short to carry a digest
    (failed,) = [e for e in effects if isinstance(e, OperationFailed)]
    assert isinstance(failed.error, DigestMismatchError) and "every replica" in str(failed.error)
    assert core.finished and core.on_run(A, run_of(3, [packed(3)])) == ()


def test_runs_with_an_hmac_digest() -> None:
    digest = make_digest("hmac-sha256", b"pw")
    core = ReadCore(closed_md(4), 0, 4, digest=digest, read_order=lambda ws: list(ws))
    core.start()
    copies = [pack_entry(digest, 5, e, e - 1, e + 1, b"h" * e) for e in range(5)]
    copies[3] = pack_entry(DIGEST, 5, 3, 2, 4, b"hhh")  # a CRC32C entry: does not verify
    effects = core.on_run(A, run_of(0, copies))
    assert delivered_ids(effects) == [0, 1, 2]
    assert [(r.bookie_id, r.entry_ids) for r in effects if isinstance(r, ReadEntries)] == [(B, (3,))]
    effects = core.on_run(B, run_of(3, [pack_entry(digest, 5, 3, 2, 4, b"hhh")]))
    assert delivered_ids(effects) == [3, 4] and isinstance(effects[-1], OperationDone)


def test_speculative_reads_of_a_run_and_the_late_answer() -> None:
    core = ReadCore(closed_md(5), 0, 5, digest=DIGEST, read_order=lambda ws: list(ws))
    (_, timer) = core.start()
    assert isinstance(timer, StartTimer)
    effects = core.on_run(A, run_of(0, [packed(0), packed(1)]))  # A is slow with the rest
    assert delivered_ids(effects) == [0, 1]
    effects = core.on_timer(timer.key)
    assert [(r.bookie_id, r.entry_ids) for r in effects if isinstance(r, ReadEntries)] == [(B, (2, 3, 4, 5))]
    effects = core.on_run(B, run_of(2, [packed(e) for e in range(2, 6)]))
    assert delivered_ids(effects) == [2, 3, 4, 5] and isinstance(effects[-1], OperationDone)
    assert core.on_run(A, run_of(2, [packed(2)])) == ()


def test_a_timer_whose_entries_were_all_read_asks_nobody() -> None:
    core = ReadCore(closed_md(2000), 0, 2000, digest=DIGEST, read_order=lambda ws: list(ws))
    (read, timer) = core.start()
    assert isinstance(read, ReadEntries) and isinstance(timer, StartTimer)
    effects = core.on_run(A, run_of(0, [packed(e) for e in read.entry_ids]))
    assert delivered_ids(effects) == list(read.entry_ids)
    assert core.on_timer(timer.key) == ()


def test_striped_ledgers_read_each_entry_from_its_write_set() -> None:
    md = LedgerMetadata(
        ledger_id=LedgerId(5), ensemble_size=3, write_quorum_size=2, ack_quorum_size=2,
        ensembles=((EntryId(0), (A, B, C)), (EntryId(6), (C, B, A))), state=LedgerState.CLOSED,
        last_entry_id=EntryId(9), length=10,
    )
    core = ReadCore(md, 1, 9, digest=DIGEST, read_order=lambda ws: list(ws))
    reads = {r.bookie_id: r.entry_ids for r in core.start() if isinstance(r, ReadEntries)}
    assert reads == {A: (3, 8), B: (1, 4, 7), C: (2, 5, 6, 9)}
    for bookie, ids in reads.items():
        assert all(md.write_set(e)[0] == bookie for e in ids)


def test_the_window_is_bounded_in_bytes_once_entry_sizes_are_known() -> None:
    config = ReadConfig(entries_window=4096, batch_entries_max=64, window_bytes_max=64 * 1024)
    big = [pack_entry(DIGEST, 5, e, e - 1, 0, b"b" * 4000) for e in range(10_000)]
    md = closed_md(9999)
    core = ReadCore(md, 0, 9999, digest=DIGEST, read_order=lambda ws: list(ws), config=config)
    (read, _) = core.start()
    assert isinstance(read, ReadEntries) and read.entry_ids == tuple(range(64))  # one batch before any size
    effects = core.on_run(A, run_of(0, big[:64]))
    issued = [e for r in effects if isinstance(r, ReadEntries) for e in r.entry_ids]
    assert issued and max(issued) == 64 + 64 * 1024 // len(big[0]) - 1  # 16 entries of ~4 KB outstanding
    roomy = ReadConfig(entries_window=4096, batch_entries_max=64, window_bytes_max=1 << 30)
    small = ReadCore(md, 0, 9999, digest=DIGEST, read_order=lambda ws: list(ws), config=roomy)
    small.start()
    effects = small.on_run(A, run_of(0, [packed(e) for e in range(64)]))
    assert max(e for r in effects if isinstance(r, ReadEntries) for e in r.entry_ids) == 64 + 4096 - 1
