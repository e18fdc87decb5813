"""DiskLedgerStorage across restarts: replay, checkpoints, journal trimming, GC/compaction."""

from __future__ import annotations

from pathlib import Path

import pytest

from scriba.bookie import journal as jr
from scriba.bookie.entry_log import log_ids
from scriba.bookie.storage import DiskLedgerStorage, open_storage
from scriba.bookie.storage_api import AddOp, StorageConfig
from scriba.entry import Crc32cDigest, pack_entry
from scriba.errors import NoSuchLedgerError, Status

KEY = b"k" * 32
DIGEST = Crc32cDigest()


def op(ledger_id: int, entry_id: int, lac: int = -1, size: int = 100, **kw: object) -> AddOp:
    payload = (f"{ledger_id}:{entry_id}:".encode() * (size // 4 + 1))[:size]
    return AddOp(ledger_id, entry_id, KEY, pack_entry(DIGEST, ledger_id, entry_id, lac, 0, payload),
                 **kw)  # type: ignore[arg-type]


def config(tmp: Path, **kw: object) -> StorageConfig:
    return StorageConfig(tmp / "journal", tmp / "ledgers", checkpoint_interval_s=3600, **kw)  # type: ignore[arg-type]


async def test_restart_after_clean_close(tmp_path: Path) -> None:
    s = await open_storage(config(tmp_path))
    ops = [op(1, i, i - 1) for i in range(50)]
    assert await s.add_batch(ops) == [Status.OK] * 50
    await s.fence(2, KEY)
    await s.write_lac(1, 49, KEY)
    await s.close()
    s = await open_storage(config(tmp_path))
    try:
        assert [s.read_entry(1, i) for i in range(50)] == [o.entry for o in ops]
        st = s.lac_state(1)
        assert (st.lac, st.last_entry_id, st.fenced) == (49, 49, False)
        assert s.lac_state(2).fenced
        assert await s.add_batch([op(2, 0)]) == [Status.FENCED]
    finally:
        await s.close()


async def test_replay_after_crash_without_checkpoint(tmp_path: Path) -> None:
    s = await open_storage(config(tmp_path))
    ops = [op(3, i, i - 1) for i in range(20)]
    for i in range(0, 20, 5):
        assert await s.add_batch(ops[i : i + 5]) == [Status.OK] * 5
    await s.fence(3, KEY)
    await s.write_lac(3, 19, KEY)
    await s.abandon()  # crash: nothing flushed to entry logs or index
    assert not any(p.stat().st_size > 16 for p in (tmp_path / "ledgers" / "entrylogs").glob("*"))
    s = await open_storage(config(tmp_path))
    try:
        assert [s.read_entry(3, i) for i in range(20)] == [o.entry for o in ops]
        st = s.lac_state(3)
        assert st.fenced and st.last_entry_id == 19 and st.lac == 19
        assert await s.add_batch([op(3, 20)]) == [Status.FENCED]
        assert await s.add_batch([op(3, 20, recovery=True)]) == [Status.OK]
        assert await s.add_batch([AddOp(3, 21, b"x" * 32, op(3, 21).entry, True)]) == [
            Status.UNAUTHORIZED
        ]
    finally:
        await s.close()


async def test_replay_is_idempotent_over_checkpointed_entries(tmp_path: Path) -> None:
    s = await open_storage(config(tmp_path))
    ops = [op(4, i) for i in range(10)]
    await s.add_batch(ops)
    await s.checkpoint()
    await s.add_batch([op(4, 10)])
    await s.abandon()
    for _ in range(2):
        s = await open_storage(config(tmp_path))
        try:
            assert s.read_range(4, 0, 100, 100, 1 << 20) == [o.entry for o in ops] + [op(4, 10).entry]
        finally:
            await s.abandon()


async def test_checkpoint_trims_journal_files(tmp_path: Path) -> None:
    cfg = config(tmp_path, journal_file_bytes_max=64 * 1024, journal_group_bytes_max=4096)
    s = await open_storage(cfg)
    try:
        for b in range(40):
            assert await s.add_batch([op(5, b * 4 + i, size=1000) for i in range(4)]) == [Status.OK] * 4
        files_before = jr.journal_files(cfg.journal_dir)
        assert len(files_before) >= 3
        await s.checkpoint()
        files_after = jr.journal_files(cfg.journal_dir)
        assert len(files_after) == 1 and files_after[0][0] == files_before[-1][0]
        assert s.read_entry(5, 0) == op(5, 0, size=1000).entry
    finally:
        await s.close()
    s = await open_storage(cfg)
    try:
        assert s.read_range(5, 0, 159, 1000, 1 << 30) == [op(5, i, size=1000).entry for i in range(160)]
    finally:
        await s.close()


async def test_write_cache_bound_triggers_flush(tmp_path: Path) -> None:
    cfg = config(tmp_path, write_cache_bytes_max=64 * 1024)
    s = await open_storage(cfg)
    try:
        for b in range(50):
            await s.add_batch([op(6, b * 8 + i, size=1000) for i in range(8)])
        assert s._cache.bytes <= 3 * cfg.write_cache_bytes_max
        assert any(p.stat().st_size > 100_000 for p in (tmp_path / "ledgers" / "entrylogs").glob("*"))
        assert s.read_range(6, 0, 399, 1000, 1 << 30) == [op(6, i, size=1000).entry for i in range(400)]
    finally:
        await s.close()


async def test_gc_compaction_keeps_live_entries(tmp_path: Path) -> None:
    cfg = config(tmp_path, entry_log_file_bytes_max=32 * 1024)
    s: DiskLedgerStorage = await open_storage(cfg)
    try:
        # interleave a dead and a live ledger so every log is about half dead
        for b in range(60):
            await s.add_batch([op(7, b, size=500), op(8, b, size=500)])
            if b % 20 == 19:
                await s.checkpoint()
        logs_before = log_ids(tmp_path / "ledgers" / "entrylogs")
        assert len(logs_before) >= 2
        await s.delete_ledgers([7])
        # ~half dead is not below 0.5 everywhere; delete more to force compaction
        await s.add_batch([op(9, 0, size=500)])
        await s.checkpoint()
        await s.delete_ledgers([9])
        result = await s.compact(0.6)
        assert result.logs_compacted >= 1 and result.entries_copied >= 1
        with_dead = log_ids(tmp_path / "ledgers" / "entrylogs")
        assert s.ledger_ids() == [8]
        assert s.read_range(8, 0, 59, 100, 1 << 30) == [op(8, b, size=500).entry for b in range(60)]
        with pytest.raises(NoSuchLedgerError):
            s.read_entry(7, 0)
        assert with_dead  # logs still exist for ledger 8
    finally:
        await s.close()
    s = await open_storage(cfg)
    try:
        assert s.ledger_ids() == [8]
        assert s.read_range(8, 0, 59, 100, 1 << 30) == [op(8, b, size=500).entry for b in range(60)]
    finally:
        await s.close()


async def test_compaction_removes_mostly_dead_logs(tmp_path: Path) -> None:
    cfg = config(tmp_path, entry_log_file_bytes_max=16 * 1024)
    s = await open_storage(cfg)
    try:
        for b in range(40):
            # 3 dead entries for each live one
            await s.add_batch([op(10, b, size=400), op(11, b, size=400), op(12, b, size=400),
                               op(13, b, size=400)])
        await s.checkpoint()
        before = set(log_ids(tmp_path / "ledgers" / "entrylogs"))
        await s.delete_ledgers([10, 11, 12])
        assert set(log_ids(tmp_path / "ledgers" / "entrylogs")) == before  # deleting only
        await s.compact(0.5)
        after = set(log_ids(tmp_path / "ledgers" / "entrylogs"))
        assert before - after, "no log was compacted"
        assert s.read_range(13, 0, 39, 100, 1 << 30) == [op(13, b, size=400).entry for b in range(40)]
    finally:
        await s.close()
    s = await open_storage(cfg)
    try:
        assert s.read_range(13, 0, 39, 100, 1 << 30) == [op(13, b, size=400).entry for b in range(40)]
        assert s.ledger_ids() == [13]
    finally:
        await s.close()


async def test_group_commit_shares_fsyncs_and_reports_stats(tmp_path: Path) -> None:
    import asyncio

    s = await open_storage(config(tmp_path))
    try:
        await s.add_batch([op(20, 0)])
        one = s.journal_stats()
        assert one["groups"] == one["records"]  # one writer: one record per sync, no waiting
        await asyncio.gather(*(s.add_batch([op(21 + w, i) for i in range(16)]) for w in range(32)))
        st = s.stats()
        assert st["journal_records_total"] == one["records"] + 32
        assert st["journal_groups_total"] < st["journal_records_total"]
        assert st["write_cache_entries"] == 1 + 32 * 16 and st["ledgers"] == 33
        assert st["read_only"] == 0
    finally:
        await s.close()


async def test_long_journal_tail_replays_through_bounded_cache(tmp_path: Path) -> None:
    cfg = config(tmp_path, write_cache_bytes_max=1 << 30)
    s = await open_storage(cfg)
    for b in range(30):
        await s.add_batch([op(40, b * 8 + i, size=1000) for i in range(8)])
    await s.abandon()  # all 240 KB only in the journal
    small = config(tmp_path, write_cache_bytes_max=32 * 1024)
    s = await open_storage(small)
    try:
        assert s._checkpoints >= 1
        assert s.read_range(40, 0, 239, 1000, 1 << 30) == [op(40, i, size=1000).entry for i in range(240)]
    finally:
        await s.abandon()
    s = await open_storage(small)
    try:
        assert s.read_range(40, 0, 239, 1000, 1 << 30) == [op(40, i, size=1000).entry for i in range(240)]
    finally:
        await s.close()


async def test_second_open_of_the_same_dirs_is_refused(tmp_path: Path) -> None:
    from scriba.errors import StorageError

    s = await open_storage(config(tmp_path))
    try:
        with pytest.raises(StorageError, match="in use"):
            await open_storage(config(tmp_path))
        assert await s.add_batch([op(50, 0)]) == [Status.OK]
    finally:
        await s.close()
    s = await open_storage(config(tmp_path))  # released on close
    await s.close()


async def test_compaction_keeps_a_log_it_cannot_read_to_the_end(tmp_path: Path) -> None:
    from scriba.bookie import entry_log as el
    from scriba.testing.diskfaults import flip_bit

    cfg = config(tmp_path, entry_log_file_bytes_max=1 << 20)
    s = await open_storage(cfg)
    try:
        for b in range(20):
            await s.add_batch([op(70, b, size=400), op(71, b, size=400), op(72, b, size=400),
                               op(73, b, size=400)])
        await s.checkpoint()
        await s.add_batch([op(74, 0)])
        await s.checkpoint()  # reopening below makes this log a non-current one
    finally:
        await s.close()
    s = await open_storage(cfg)
    try:
        loc = s._index.get(70, 3)  # a record early in the log, of a ledger about to be deleted
        assert loc is not None
        flip_bit(s._logs.path(loc[0]), loc[1] + 20, 2)
        before = set(el.log_ids(tmp_path / "ledgers" / "entrylogs"))
        await s.delete_ledgers([70, 71, 72])
        result = await s.compact(0.5)
        assert result.logs_skipped == 1 and result.logs_compacted == 0
        assert set(el.log_ids(tmp_path / "ledgers" / "entrylogs")) == before  # kept
        assert [s.read_entry(73, b) for b in range(20)] == [op(73, b, size=400).entry for b in range(20)]
        with pytest.raises(NoSuchLedgerError):
            s.read_entry(70, 3)
    finally:
        await s.close()
