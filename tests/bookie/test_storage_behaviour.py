"""Behaviour every LedgerStorage shares: the in-memory twin and the disk storage."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from scriba.bookie.memory_storage import InMemoryLedgerStorage
from scriba.bookie.storage_api import AddOp, LedgerStorage, StorageConfig
from scriba.entry import Crc32cDigest, pack_entry
from scriba.errors import (
    BookieReadOnlyError,
    ConfigError,
    NoSuchEntryError,
    NoSuchLedgerError,
    Status,
    UnauthorizedError,
)

KEY = b"k" * 32
OTHER = b"o" * 32
DIGEST = Crc32cDigest()


def entry(ledger_id: int, entry_id: int, lac: int = -1, payload: bytes | None = None) -> bytes:
    body = payload if payload is not None else f"{ledger_id}:{entry_id}".encode() * 8
    return pack_entry(DIGEST, ledger_id, entry_id, lac, 0, body)


def op(ledger_id: int, entry_id: int, lac: int = -1, *, key: bytes = KEY, recovery: bool = False,
       payload: bytes | None = None) -> AddOp:
    return AddOp(ledger_id, entry_id, key, entry(ledger_id, entry_id, lac, payload), recovery)


@pytest.fixture(params=["memory", "disk"])
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LedgerStorage]:
    if request.param == "memory":
        s: LedgerStorage = InMemoryLedgerStorage()
    else:
        from scriba.bookie.storage import open_storage

        s = await open_storage(StorageConfig(tmp_path / "journal", tmp_path / "ledgers"))
    assert isinstance(s, LedgerStorage)
    yield s
    await s.close()


async def test_add_and_read_back(storage: LedgerStorage) -> None:
    ops = [op(1, i, i - 1) for i in range(10)]
    assert await storage.add_batch(ops) == [Status.OK] * 10
    for i in range(10):
        assert storage.read_entry(1, i) == ops[i].entry
    assert storage.read_entry(1, -1) == ops[9].entry
    st = storage.lac_state(1)
    assert (st.lac, st.last_entry_id, st.fenced) == (8, 9, False)
    assert storage.ledger_ids() == [1]


async def test_missing_ledger_and_entry(storage: LedgerStorage) -> None:
    with pytest.raises(NoSuchLedgerError):
        storage.read_entry(7, 0)
    with pytest.raises(NoSuchLedgerError):
        storage.lac_state(7)
    await storage.add_batch([op(7, 0)])
    with pytest.raises(NoSuchEntryError):
        storage.read_entry(7, 1)


async def test_read_range_stops_at_gap_and_bounds(storage: LedgerStorage) -> None:
    ops = [op(2, i) for i in (0, 1, 2, 4)]
    assert await storage.add_batch(ops) == [Status.OK] * 4
    got = storage.read_range(2, 0, 10, 100, 1 << 20)
    assert got == [o.entry for o in ops[:3]]
    assert storage.read_range(2, 0, 10, 2, 1 << 20) == [o.entry for o in ops[:2]]
    assert storage.read_range(2, 0, 10, 100, 1) == [ops[0].entry]  # at least one
    assert storage.read_range(2, 0, 1, 100, 1 << 20) == [o.entry for o in ops[:2]]
    with pytest.raises(NoSuchEntryError):
        storage.read_range(2, 3, 10, 100, 1 << 20)


async def test_master_key_fixed_by_first_add(storage: LedgerStorage) -> None:
    assert await storage.add_batch([op(3, 0)]) == [Status.OK]
    assert await storage.add_batch([op(3, 1, key=OTHER)]) == [Status.UNAUTHORIZED]
    assert storage.ledger_master_key(3) == KEY  # the second add's key did not replace it
    with pytest.raises(UnauthorizedError):
        await storage.fence(3, OTHER)
    assert storage.ledger_master_key(99) is None  # not here


async def test_fence_blocks_normal_adds_but_not_recovery(storage: LedgerStorage) -> None:
    assert await storage.add_batch([op(4, 0)]) == [Status.OK]
    st = await storage.fence(4, KEY)
    assert st.fenced and st.last_entry_id == 0
    assert await storage.add_batch([op(4, 1)]) == [Status.FENCED]
    assert await storage.add_batch([op(4, 1, recovery=True)]) == [Status.OK]
    assert storage.lac_state(4).last_entry_id == 1


async def test_fence_unknown_ledger_creates_state(storage: LedgerStorage) -> None:
    st = await storage.fence(5, KEY)
    assert st.fenced and st.last_entry_id == -1 and st.lac == -1
    assert await storage.add_batch([op(5, 0)]) == [Status.FENCED]
    assert await storage.add_batch([op(5, 0, key=OTHER, recovery=True)]) == [Status.UNAUTHORIZED]


async def test_idempotent_readd_keeps_first_bytes(storage: LedgerStorage) -> None:
    first = op(6, 0, payload=b"first")
    assert await storage.add_batch([first]) == [Status.OK]
    assert await storage.add_batch([op(6, 0, payload=b"second")]) == [Status.OK]
    assert storage.read_entry(6, 0) == first.entry
    # duplicates inside one batch too
    a, b = op(6, 1, payload=b"a"), op(6, 1, payload=b"b")
    assert await storage.add_batch([a, b]) == [Status.OK, Status.OK]
    assert storage.read_entry(6, 1) == a.entry


async def test_bad_requests(storage: LedgerStorage) -> None:
    good = op(8, 0)
    wrong_ledger = AddOp(9, 0, KEY, good.entry)
    wrong_entry = AddOp(8, 1, KEY, good.entry)
    short = AddOp(8, 0, KEY, b"xx")
    negative = AddOp(8, -1, KEY, entry(8, -1))
    got = await storage.add_batch([wrong_ledger, wrong_entry, short, negative, good])
    assert got == [Status.BAD_REQUEST] * 4 + [Status.OK]
    assert storage.ledger_ids() == [8]


async def test_too_large_is_bad_request(storage: LedgerStorage) -> None:
    big = op(10, 0, payload=b"x" * (5 * 1024 * 1024 + 1))
    assert await storage.add_batch([big]) == [Status.BAD_REQUEST]


async def test_write_lac_and_long_poll(storage: LedgerStorage) -> None:
    await storage.add_batch([op(11, 0)])
    assert storage.lac_state(11).lac == -1
    # no change: the poll times out and returns the current state
    st = await storage.wait_lac(11, -1, 0.05)
    assert st.lac == -1
    waiter = asyncio.create_task(storage.wait_lac(11, -1, 10.0))
    await asyncio.sleep(0)
    assert not waiter.done()
    await storage.add_batch([op(11, 1, lac=0)])
    st = await asyncio.wait_for(waiter, 5.0)
    assert st.lac == 0
    waiter = asyncio.create_task(storage.wait_lac(11, 0, 10.0))
    await storage.write_lac(11, 1, KEY)
    assert (await asyncio.wait_for(waiter, 5.0)).lac == 1
    with pytest.raises(UnauthorizedError):
        await storage.write_lac(11, 2, OTHER)


async def test_long_poll_on_unknown_ledger_waits_for_it(storage: LedgerStorage) -> None:
    with pytest.raises(NoSuchLedgerError):
        await storage.wait_lac(12, -1, 0.01)
    waiter = asyncio.create_task(storage.wait_lac(12, -1, 10.0))
    await asyncio.sleep(0)
    await storage.add_batch([op(12, 0, lac=-1), op(12, 1, lac=0)])
    assert (await asyncio.wait_for(waiter, 5.0)).lac == 0


async def test_read_only_switch(storage: LedgerStorage) -> None:
    events: list[tuple[bool, str]] = []
    storage.add_state_listener(lambda ro, why: events.append((ro, why)))
    await storage.add_batch([op(13, 0)])
    await storage.set_read_only(True, "maintenance")
    assert storage.read_only and storage.read_only_reason == "maintenance"
    assert await storage.add_batch([op(13, 1)]) == [Status.READ_ONLY]
    with pytest.raises(BookieReadOnlyError):
        await storage.write_lac(13, 0, KEY)
    assert storage.read_entry(13, 0) == op(13, 0).entry  # reads keep working
    await storage.set_read_only(False, "")
    assert not storage.read_only
    assert await storage.add_batch([op(13, 1)]) == [Status.OK]
    assert events == [(True, "maintenance"), (False, "")]
    free, total = storage.disk_usage()
    assert 0 <= free <= total and total > 0


async def test_delete_ledgers(storage: LedgerStorage) -> None:
    await storage.add_batch([op(14, i) for i in range(5)] + [op(15, i) for i in range(5)])
    await storage.delete_ledgers([14])
    assert storage.ledger_ids() == [15]
    with pytest.raises(NoSuchLedgerError):
        storage.read_entry(14, 0)
    assert storage.read_entry(15, 4) == op(15, 4).entry
    await storage.checkpoint()
    assert storage.read_entry(15, 0) == op(15, 0).entry


async def test_many_concurrent_batches(storage: LedgerStorage) -> None:
    async def writer(lid: int) -> list[Status]:
        out: list[Status] = []
        for b in range(5):
            out += await storage.add_batch([op(lid, b * 16 + i) for i in range(16)])
        return out

    results = await asyncio.gather(*(writer(100 + w) for w in range(8)))
    assert all(s == Status.OK for r in results for s in r)
    for w in range(8):
        assert storage.lac_state(100 + w).last_entry_id == 79
        assert storage.read_range(100 + w, 0, 79, 1000, 1 << 30) == [
            op(100 + w, i).entry for i in range(80)
        ]


def test_config_validate(tmp_path: Path) -> None:
    StorageConfig(tmp_path, tmp_path).validate()
    with pytest.raises(ConfigError, match="disk_usage_threshold"):
        StorageConfig(tmp_path, tmp_path, disk_usage_lwm=0.99).validate()
    with pytest.raises(ConfigError, match="journal_group_bytes_max"):
        StorageConfig(tmp_path, tmp_path, journal_group_bytes_max=1).validate()


async def test_twin_fail_disk_hook() -> None:
    s = InMemoryLedgerStorage()
    await s.add_batch([op(1, 0)])
    s.fail_disk("injected EIO")
    assert s.read_only and s.read_only_reason == "injected EIO"
    assert await s.add_batch([op(1, 1)]) == [Status.STORAGE]
    from scriba.errors import StorageError

    with pytest.raises(StorageError):
        await s.fence(1, KEY)
    await s.set_read_only(False, "")
    assert s.read_only  # a disk failure holds until restart
    assert s.read_entry(1, 0) == op(1, 0).entry
    s.set_disk_usage(10, 100, full=True)
    assert s.disk_usage() == (10, 100)


async def test_fence_works_while_read_only(storage: LedgerStorage) -> None:
    await storage.add_batch([op(16, 0)])
    await storage.set_read_only(True, "draining")
    st = await storage.fence(16, KEY)
    assert st.fenced and st.last_entry_id == 0
    await storage.set_read_only(False, "")
    assert await storage.add_batch([op(16, 1)]) == [Status.FENCED]
