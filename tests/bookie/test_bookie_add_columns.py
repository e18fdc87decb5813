"""The column path of adds (``add_columns``): its whole-batch fast path and the per-add
fallback give the same answers and stored bytes, on both storages, and survive a restart."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from scriba.bookie.memory_storage import InMemoryLedgerStorage
from scriba.bookie.storage_api import AddColumns, LedgerStorage, StorageConfig
from scriba.entry import Crc32cDigest, pack_entry
from scriba.errors import Status

KEY = b"k" * 32
OTHER = b"o" * 32
DIGEST = Crc32cDigest()


def entry(ledger_id: int, entry_id: int, lac: int = -1, tag: bytes = b"a") -> bytes:
    return pack_entry(DIGEST, ledger_id, entry_id, lac, 0, tag * 40)


def cols(lid: int, eids: list[int], *, lacs: list[int] | None = None, tag: bytes = b"a",
         key: bytes = KEY, recovery: list[bool] | None = None) -> AddColumns:
    lacs = lacs if lacs is not None else [e - 1 for e in eids]
    return AddColumns([lid] * len(eids), list(eids), [key] * len(eids),
                      [entry(lid, e, lac, tag) for e, lac in zip(eids, lacs, strict=True)], recovery)


@pytest.fixture(params=["memory", "disk"])
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LedgerStorage]:
    if request.param == "memory":
        s: LedgerStorage = InMemoryLedgerStorage()
    else:
        from scriba.bookie.storage import open_storage

        s = await open_storage(StorageConfig(tmp_path / "journal", tmp_path / "ledgers"))
    yield s
    await s.close()


async def test_fast_path_batches_store_every_entry_and_the_highest_lac(storage: LedgerStorage) -> None:
    assert await storage.add_columns(cols(1, [0])) == [Status.OK]  # creates the ledger
    assert await storage.add_columns(cols(1, list(range(1, 65)), lacs=[5] * 30 + [40] * 34)) == [Status.OK] * 64
    assert [storage.read_entry(1, e) for e in range(65)] == [entry(1, 0, -1)] + [
        entry(1, e, 5 if e <= 30 else 40) for e in range(1, 65)
    ]
    st = storage.lac_state(1)
    assert (st.lac, st.last_entry_id) == (40, 64)


async def test_in_batch_duplicates_and_disorder_keep_the_first_bytes(storage: LedgerStorage) -> None:
    assert await storage.add_columns(cols(2, [0, 1])) == [Status.OK] * 2
    dup = cols(2, [3, 2, 3, 1], tag=b"b")  # disorder, a duplicate, and a re-add of a stored entry
    assert await storage.add_columns(dup) == [Status.OK] * 4
    assert storage.read_entry(2, 1) == entry(2, 1, 0, b"a")  # first bytes kept
    assert storage.read_entry(2, 3) == entry(2, 3, 2, b"b")
    assert storage.read_entry(2, 2) == entry(2, 2, 1, b"b")
    assert storage.lac_state(2).last_entry_id == 3


async def test_a_bad_add_in_a_batch_is_refused_alone(storage: LedgerStorage) -> None:
    assert await storage.add_columns(cols(3, [0])) == [Status.OK]
    batch = cols(3, [1, 2, 3])
    bad = AddColumns(batch.ledger_ids, batch.entry_ids, [KEY, OTHER, KEY],
                     [batch.entries[0], batch.entries[1], entry(3, 9)])
    assert await storage.add_columns(bad) == [Status.OK, Status.UNAUTHORIZED, Status.BAD_REQUEST]
    assert storage.lac_state(3).last_entry_id == 1


async def test_fenced_ledger_takes_only_recovery_adds(storage: LedgerStorage) -> None:
    assert await storage.add_columns(cols(4, [0, 1])) == [Status.OK] * 2
    await storage.fence(4, KEY)
    assert await storage.add_columns(cols(4, [2, 3])) == [Status.FENCED] * 2
    assert await storage.add_columns(cols(4, [2, 3], recovery=[True, False])) == [Status.OK, Status.FENCED]
    assert await storage.add_columns(cols(4, [3, 4], recovery=[True, True])) == [Status.OK] * 2
    assert storage.lac_state(4).last_entry_id == 4


async def test_column_adds_are_replayed_after_a_crash(tmp_path: Path) -> None:
    from scriba.bookie.storage import open_storage

    config = StorageConfig(tmp_path / "journal", tmp_path / "ledgers")
    s = await open_storage(config)
    assert await s.add_columns(cols(5, [0])) == [Status.OK]
    assert await s.add_columns(cols(5, list(range(1, 33)))) == [Status.OK] * 32
    await s.abandon()  # as a crash: nothing but the journal
    s = await open_storage(config)
    try:
        assert [s.read_entry(5, e) for e in range(33)] == [entry(5, e, e - 1) for e in range(33)]
        assert (s.lac_state(5).lac, s.lac_state(5).last_entry_id) == (31, 32)
    finally:
        await s.close()
