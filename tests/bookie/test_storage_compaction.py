"""Entry-log GC in DiskLedgerStorage: accounting, compaction, crash points, restarts.

The checker: the accounting kept by storage (``entry_log_meta``) must equal the one
rebuilt from the index, and every entry still stored must read back its bytes. Its
negative control tampers with the accounting and expects the checker to say so.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import lmdb
import pytest

from scriba.bookie import log_compactor
from scriba.bookie.compaction import PassKind, Throttle
from scriba.bookie.entry_log import FILE_HEADER_SIZE, log_ids
from scriba.bookie.entry_log_meta import LogMetaUpdate
from scriba.bookie.storage import DiskLedgerStorage, open_storage
from scriba.bookie.storage_api import AddOp, StorageConfig
from scriba.entry import Crc32cDigest, pack_entry, unpack_entry
from scriba.errors import NoSuchLedgerError, Status
from scriba.testing.waiting import eventually

KEY = b"k" * 32
DIGEST = Crc32cDigest()


def entry(lid: int, eid: int, size: int = 500) -> bytes:
    payload = (f"{lid}:{eid}:".encode() * (size // 4 + 1))[:size]
    return pack_entry(DIGEST, lid, eid, eid - 1, 0, payload)


def config(tmp: Path, **kw: object) -> StorageConfig:
    opts: dict[str, object] = {"checkpoint_interval_s": 3600, "entry_log_file_bytes_max": 64 * 1024}
    opts.update(kw)
    return StorageConfig(tmp / "journal", tmp / "ledgers", **opts)  # type: ignore[arg-type]


def log_dir(tmp: Path) -> Path:
    return tmp / "ledgers" / "entrylogs"


def log_bytes(tmp: Path) -> int:
    return sum(p.stat().st_size for p in log_dir(tmp).glob("*.elog"))


async def fill(s: DiskLedgerStorage, ledgers: list[int], count: int, size: int = 500) -> dict[tuple[int, int], bytes]:
    """``count`` entries in each ledger, interleaved batch by batch (so every log holds all)."""
    out: dict[tuple[int, int], bytes] = {}
    for first in range(0, count, 20):
        ops = [AddOp(lid, e, KEY, entry(lid, e, size)) for lid in ledgers for e in range(first, min(first + 20, count))]
        assert await s.add_batch(ops) == [Status.OK] * len(ops)
        out.update({(o.ledger_id, o.entry_id): o.entry for o in ops})
    await s.checkpoint()
    return out


def accounting_errors(s: DiskLedgerStorage) -> list[str]:
    """How the kept accounting differs from the index and the files (empty: none)."""
    errors: list[str] = []
    kept = s._meta.live()
    rebuilt = {log: per for log, per in s._index.rebuild_log_meta().items() if per}
    if kept != rebuilt:
        errors.append(f"live bytes differ: kept {kept} rebuilt {rebuilt}")
    on_disk = s._logs.record_bytes()
    for u in s._meta.usages():
        if u.log_id not in on_disk:
            errors.append(f"log {u.log_id} accounted but has no file")
        elif u.total_bytes < on_disk[u.log_id]:
            errors.append(f"log {u.log_id}: total {u.total_bytes} < file {on_disk[u.log_id]}")
        if u.live_bytes > u.total_bytes:
            errors.append(f"log {u.log_id}: live {u.live_bytes} > total {u.total_bytes}")
        if u.live_bytes != sum(kept.get(u.log_id, {}).values()):
            errors.append(f"log {u.log_id}: live sum {u.live_bytes} is not its ledgers' total")
    return errors


def check_entries(s: DiskLedgerStorage, expected: dict[tuple[int, int], bytes]) -> None:
    for (lid, eid), data in expected.items():
        got = s.read_entry(lid, eid)
        assert got == data, f"ledger {lid} entry {eid} changed"
        unpack_entry(DIGEST, got)  # digest checked


async def check_after_restart(cfg: StorageConfig, expected: dict[tuple[int, int], bytes]) -> list[int]:
    """Reopen, check every expected entry and the accounting; the ledgers stored."""
    s = await open_storage(cfg)
    try:
        check_entries(s, expected)
        assert accounting_errors(s) == []
        return s.ledger_ids()
    finally:
        await s.close()


async def test_accounting_checker_catches_a_tampered_table(tmp_path: Path) -> None:
    s = await open_storage(config(tmp_path))
    try:
        await fill(s, [1, 2], 60)
        assert accounting_errors(s) == []
        log_id = next(iter(s._meta.live()))
        s._meta.apply(LogMetaUpdate({}, {(log_id, 1): 0}))  # a ledger's bytes forgotten
        assert accounting_errors(s) and "live bytes differ" in accounting_errors(s)[0]
    finally:
        await s.close()


async def test_accounting_matches_the_index_through_random_work_and_restarts(tmp_path: Path) -> None:
    rnd = random.Random(11)
    cfg = config(tmp_path, entry_log_file_bytes_max=32 * 1024)
    s = await open_storage(cfg)
    expected: dict[tuple[int, int], bytes] = {}
    next_eid: dict[int, int] = {}
    try:
        for step in range(60):
            action = rnd.random()
            if action < 0.5:
                lids = rnd.sample(range(1, 12), 3)
                ops = []
                for lid in lids:
                    for _ in range(rnd.randrange(1, 30)):
                        eid = next_eid.get(lid, 0)
                        next_eid[lid] = eid + 1
                        ops.append(AddOp(lid, eid, KEY, entry(lid, eid, rnd.randrange(40, 900))))
                if rnd.random() < 0.2:
                    rnd.shuffle(ops)  # out of order: single-entry records
                assert await s.add_batch(ops) == [Status.OK] * len(ops)
                expected.update({(o.ledger_id, o.entry_id): o.entry for o in ops})
            elif action < 0.65 and next_eid:
                lid = rnd.choice(sorted(next_eid))
                await s.delete_ledgers([lid])
                next_eid.pop(lid)
                expected = {k: v for k, v in expected.items() if k[0] != lid}
            elif action < 0.85:
                await s.compact(rnd.choice([0.0, 0.3, 0.6, 0.95]))
            elif action < 0.95:
                await s.checkpoint()
            else:
                await s.close()
                s = await open_storage(cfg)
            await s.checkpoint()
            assert accounting_errors(s) == [], f"step {step}"
            check_entries(s, expected)
    finally:
        await s.close()


async def test_all_deleted_gives_back_every_entry_log_byte_even_across_a_restart(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    s = await open_storage(cfg)
    try:
        await fill(s, list(range(1, 21)), 40)
        assert len(log_ids(log_dir(tmp_path))) > 5
        await s.delete_ledgers(list(range(1, 21)))
        assert s.stats()["entry_log_reclaimable_bytes"] > 300_000
    finally:
        await s.close()
    s = await open_storage(cfg)  # the deletion happened before this process: nothing "deleted now"
    try:
        result = await s.compact(0.0)
        assert result.rolled is False  # nothing was appended since the restart
        assert result.logs_removed > 5 and result.entries_copied == 0
        assert log_bytes(tmp_path) == 0
        stats = s.stats()
        assert stats["entry_log_bytes"] == 0 and stats["entry_log_reclaimable_bytes"] == 0
        assert accounting_errors(s) == []
    finally:
        await s.close()


async def test_current_log_mostly_dead_is_rolled_and_compacted(tmp_path: Path) -> None:
    cfg = config(tmp_path, entry_log_file_bytes_max=1 << 20)
    s = await open_storage(cfg)
    try:
        data = await fill(s, [1, 2, 3, 4, 5], 40)
        (only,) = log_ids(log_dir(tmp_path))
        assert s._logs.current_id == only
        await s.delete_ledgers([1, 2, 3, 4])
        result = await s.compact(0.5, kind=PassKind.MINOR)
        assert result.rolled and result.logs_compacted == 1 and result.entries_copied == 40
        assert only not in log_ids(log_dir(tmp_path))
        assert log_bytes(tmp_path) == FILE_HEADER_SIZE + result.bytes_copied
        assert result.bytes_reclaimed == FILE_HEADER_SIZE + 5 * result.bytes_copied - result.bytes_copied
        live = {k: v for k, v in data.items() if k[0] == 5}
        check_entries(s, live)
        with pytest.raises(NoSuchLedgerError):
            s.read_entry(1, 0)
        assert s.read_range(5, 0, 39, 100, 1 << 20) == [live[(5, e)] for e in range(40)]
        assert accounting_errors(s) == []
        assert await s.add_batch([AddOp(5, 40, KEY, entry(5, 40))]) == [Status.OK]  # still writable
    finally:
        await s.close()
    await check_after_restart(cfg, live)


class SimulatedCrash(Exception):
    pass


@pytest.mark.parametrize("crash_at", [1, 3])
async def test_crash_between_copy_and_index_update_loses_nothing(
    tmp_path: Path, crash_at: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copies reached the current log (synced), the index commit never happened: on
    reopen the index still points at the old log (still there), the copies are dead.
    Crashing at the 3rd step leaves a run record split by the first two."""
    monkeypatch.setattr(log_compactor, "STEP_BYTES_MAX", 64 * 1024)
    cfg = config(tmp_path, entry_log_file_bytes_max=1 << 20)
    s = await open_storage(cfg)
    data = await fill(s, [1, 2, 3, 4], 300)  # one log of ~600 KiB: several steps at 64 KiB
    await s.close()
    s = await open_storage(cfg)
    (old,) = log_ids(log_dir(tmp_path))
    await s.delete_ledgers([1, 2, 3])
    calls = 0
    commit = s._index.commit_moves

    def crashing_commit(*args: object, **kw: object) -> None:
        nonlocal calls
        calls += 1
        if calls == crash_at:
            raise SimulatedCrash
        commit(*args, **kw)  # type: ignore[arg-type]

    s._index.commit_moves = crashing_commit  # type: ignore[method-assign]
    with pytest.raises(SimulatedCrash):
        await s.compact(0.5)
    assert calls == crash_at
    await s.abandon()
    live = {k: v for k, v in data.items() if k[0] == 4}
    s = await open_storage(cfg)
    try:
        assert old in log_ids(log_dir(tmp_path))
        check_entries(s, live)
        assert accounting_errors(s) == []
        copies = max(log_ids(log_dir(tmp_path)))
        usage = s._meta.usage(copies)
        assert usage is not None and usage.dead_bytes > 0  # the uncommitted copies
        result = await s.compact(0.5)
        assert result.logs_compacted == 1 and old not in log_ids(log_dir(tmp_path))
        check_entries(s, live)
        assert accounting_errors(s) == []
    finally:
        await s.close()
    assert (await check_after_restart(cfg, live)) == [4]


@pytest.mark.parametrize("how", ["compacted", "dead"])
async def test_crash_between_index_update_and_file_delete_loses_nothing(tmp_path: Path, how: str) -> None:
    """The index points at the copies (or at nothing), the old file is still there: on
    reopen it has no accounting row, so it is all dead and the next pass removes it."""
    cfg = config(tmp_path, entry_log_file_bytes_max=1 << 20)
    s = await open_storage(cfg)
    data = await fill(s, [1, 2, 3, 4], 100)
    await s.close()
    s = await open_storage(cfg)
    (old,) = log_ids(log_dir(tmp_path))
    await s.delete_ledgers([1, 2, 3] if how == "compacted" else [1, 2, 3, 4])

    def crashing_remove(log_id: int) -> None:
        raise SimulatedCrash

    s._logs.remove = crashing_remove  # type: ignore[method-assign]
    with pytest.raises(SimulatedCrash):
        await s.compact(0.5)
    await s.abandon()
    live = {k: v for k, v in data.items() if k[0] == 4 and how == "compacted"}
    s = await open_storage(cfg)
    try:
        assert old in log_ids(log_dir(tmp_path))
        usage = s._meta.usage(old)
        assert usage is not None and usage.live_bytes == 0 and usage.total_bytes > 0
        check_entries(s, live)
        result = await s.compact(0.0)  # dead logs only: no copying needed
        assert result.logs_removed == 1 and result.entries_copied == 0
        assert old not in log_ids(log_dir(tmp_path))
        check_entries(s, live)
        assert accounting_errors(s) == []
    finally:
        await s.close()
    await check_after_restart(cfg, live)


async def test_an_index_without_accounting_is_rebuilt_from_its_records(tmp_path: Path) -> None:
    """An index written before the accounting existed (or with it lost) is counted again
    from its run and entry records at open; nothing is removed that is live."""
    cfg = config(tmp_path)
    s = await open_storage(cfg)
    data = await fill(s, [1, 2, 3], 80)
    await s.delete_ledgers([2])
    before = s._meta.live()
    await s.close()
    env = lmdb.open(str(tmp_path / "ledgers" / "index"), max_dbs=8)
    with env.begin(write=True) as txn:
        for name in (b"log_totals", b"ledger_logs"):
            txn.drop(env.open_db(name, txn=txn), delete=True)
        txn.delete(b"log_meta_version", db=env.open_db(b"meta", txn=txn))
    env.close()
    s = await open_storage(cfg)
    try:
        assert s._meta.live() == before
        assert accounting_errors(s) == []
        await s.compact(0.9)
        check_entries(s, {k: v for k, v in data.items() if k[0] != 2})
    finally:
        await s.close()


async def test_a_torn_tail_does_not_keep_a_log_whose_live_entries_all_moved(tmp_path: Path) -> None:
    cfg = config(tmp_path, entry_log_file_bytes_max=1 << 20)
    s = await open_storage(cfg)
    data = await fill(s, [1, 2], 50)
    await s.close()
    (old,) = log_ids(log_dir(tmp_path))
    path = log_dir(tmp_path) / f"{old:08x}.elog"
    path.write_bytes(path.read_bytes() + b"\x00\x00\x02\x00\xde\xad")  # a crash mid-append
    s = await open_storage(cfg)
    try:
        await s.delete_ledgers([1])
        result = await s.compact(0.9)
        assert result.logs_compacted == 1 and result.logs_skipped == 0
        assert old not in log_ids(log_dir(tmp_path))
        check_entries(s, {k: v for k, v in data.items() if k[0] == 2})
    finally:
        await s.close()


class RecordingThrottle(Throttle):
    def __init__(self) -> None:
        super().__init__(1024 * 1024, 0, asyncio.get_running_loop().time)
        self.steps: list[int] = []

    def delay_s(self, nbytes: int, nentries: int) -> float:
        self.steps.append(nbytes)
        return super().delay_s(nbytes, nentries)


async def test_throttled_compaction_lets_writers_and_checkpoints_through(tmp_path: Path) -> None:
    cfg = config(tmp_path, entry_log_file_bytes_max=4 << 20)
    s = await open_storage(cfg)
    data = await fill(s, [1, 2], 600, size=1000)  # ~1.2 MB in one log
    await s.close()
    s = await open_storage(cfg)
    try:
        await s.delete_ledgers([1])
        throttle = RecordingThrottle()
        task = asyncio.ensure_future(s.compact(0.9, throttle=throttle))
        written: dict[tuple[int, int], bytes] = {}
        checkpoints = s.stats()["checkpoints_total"]
        eid = 0
        while not task.done():
            ops = [AddOp(3, eid + i, KEY, entry(3, eid + i)) for i in range(10)]
            assert await s.add_batch(ops) == [Status.OK] * 10
            written.update({(3, o.entry_id): o.entry for o in ops})
            eid += 10
            await s.checkpoint()
            assert s.stats()["compaction_running"] in (0, 1)
        result = task.result()
        assert result.logs_compacted == 1
        assert len(throttle.steps) >= 4 and max(throttle.steps) <= 256 * 1024 + 1000 + 8
        assert s.stats()["checkpoints_total"] - checkpoints >= 2  # flushed while compacting
        assert s.stats()["compaction_running"] == 0
        assert s.stats()["compaction_pass_scanned_bytes"] == s.stats()["compaction_pass_bytes"]
        check_entries(s, {**{k: v for k, v in data.items() if k[0] == 2}, **written})
        assert accounting_errors(s) == []
    finally:
        await s.close()


async def test_a_pass_cancelled_midway_loses_nothing_and_the_next_one_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GC stopping (bookie shutdown) cancels a pass between or during steps."""
    monkeypatch.setattr(log_compactor, "STEP_BYTES_MAX", 64 * 1024)
    cfg = config(tmp_path, entry_log_file_bytes_max=1 << 20)
    s = await open_storage(cfg)
    data = await fill(s, [1, 2], 300)
    await s.close()
    s = await open_storage(cfg)
    live = {k: v for k, v in data.items() if k[0] == 2}
    try:
        await s.delete_ledgers([1])
        throttle = RecordingThrottle()
        task = asyncio.ensure_future(s.compact(0.9, throttle=throttle))
        await eventually(lambda: len(throttle.steps) >= 2, 30, what="two throttled compaction steps")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        check_entries(s, live)
    finally:
        await s.close()
    s = await open_storage(cfg)
    try:
        check_entries(s, live)
        assert accounting_errors(s) == []
        result = await s.compact(0.9)
        assert result.logs_compacted == 1
        check_entries(s, live)
    finally:
        await s.close()
