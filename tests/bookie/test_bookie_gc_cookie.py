"""Garbage collection and cookies, in-process (memory:// metadata, in-memory storage twin)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from scriba.bookie.cookie import COOKIE_FILE, format_bookie, read_dir_cookie, verify_or_create
from scriba.bookie.gc import GarbageCollector
from scriba.bookie.memory_storage import InMemoryLedgerStorage
from scriba.bookie.metrics import BookieMetrics
from scriba.bookie.storage_api import AddOp
from scriba.entry import Crc32cDigest, pack_entry
from scriba.errors import CookieMismatchError, MetadataUnavailableError, NoSuchKeyError
from scriba.meta.connect import connect
from scriba.meta.records import Cookie, cookie_key, ledger_key
from scriba.meta.store import MetadataStore

KEY = b"k" * 32


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    s = await connect(f"memory://gc-{uuid.uuid4().hex[:8]}")
    yield s
    await s.close()


async def _fill(storage: InMemoryLedgerStorage, *ledgers: int) -> None:
    ops = [AddOp(lid, 0, KEY, pack_entry(Crc32cDigest(), lid, 0, -1, 1, b"x")) for lid in ledgers]
    assert all(s == 0 for s in await storage.add_batch(ops))


async def test_gc_deletes_only_ledgers_positively_absent(store: MetadataStore) -> None:
    storage = InMemoryLedgerStorage()
    await _fill(storage, 1, 2, 3)
    await store.create(ledger_key(2), b"{}")
    gc = GarbageCollector(storage, store, BookieMetrics(), bookie_id="b", interval_s=60)
    first = await gc.run_once()  # absent once: only suspect
    assert first.deleted == () and storage.ledger_ids() == [1, 2, 3]
    await store.create(ledger_key(3), b"{}")  # created meanwhile: no longer a candidate
    result = await gc.run_once()
    assert result.deleted == (1,) and storage.ledger_ids() == [2, 3]
    assert (await gc.run_once()).deleted == ()


class FlakyStore:
    """Wraps a store: listing works, but gets of chosen keys fail (not 'absent')."""

    def __init__(self, inner: MetadataStore, failing: set[str], *, list_fails: bool = False) -> None:
        self._inner = inner
        self._failing = failing
        self._list_fails = list_fails

    async def get(self, key: str):  # type: ignore[no-untyped-def]
        if key in self._failing:
            raise MetadataUnavailableError(f"{key}: injected")
        return await self._inner.get(key)

    async def scan(self, prefix: str, *, page_size: int = 500):  # type: ignore[no-untyped-def]
        if self._list_fails:
            raise MetadataUnavailableError("listing: injected")
        async for item in self._inner.scan(prefix, page_size=page_size):
            yield item


async def test_gc_keeps_ledgers_when_the_store_cannot_answer(store: MetadataStore) -> None:
    storage = InMemoryLedgerStorage()
    await _fill(storage, 1, 2)
    flaky = FlakyStore(store, {ledger_key(1)})
    gc = GarbageCollector(storage, flaky, BookieMetrics(), bookie_id="b", interval_s=60)  # type: ignore[arg-type]
    await gc.run_once()
    result = await gc.run_once()
    assert result.deleted == (2,) and result.kept_on_error == 1 and storage.ledger_ids() == [1]
    broken = GarbageCollector(storage, FlakyStore(store, set(), list_fails=True), BookieMetrics(),  # type: ignore[arg-type]
                              bookie_id="b", interval_s=60)
    with pytest.raises(MetadataUnavailableError):
        await broken.run_once()
    assert storage.ledger_ids() == [1]


async def test_new_bookie_gets_cookies_then_must_match(store: MetadataStore, tmp_path: Path) -> None:
    data, journal = tmp_path / "data", tmp_path / "journal"
    cookie = await verify_or_create(store, "b1", [data, journal], [data])
    assert read_dir_cookie(data) == cookie == read_dir_cookie(journal)
    assert Cookie.from_bytes((await store.get(cookie_key("b1"))).value) == cookie
    assert await verify_or_create(store, "b1", [data, journal], [data]) == cookie
    # wiped journal dir
    (journal / COOKIE_FILE).unlink()
    with pytest.raises(CookieMismatchError, match=str(journal)):
        await verify_or_create(store, "b1", [data, journal], [data])
    # another bookie's disk
    other = tmp_path / "other"
    await verify_or_create(store, "b2", [other], [other])
    with pytest.raises(CookieMismatchError, match=str(other)):
        await verify_or_create(store, "b1", [other, data], [other])
    # a non-empty dir without a cookie is not taken for a new bookie
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "file").write_text("x")
    with pytest.raises(CookieMismatchError, match=str(junk)):
        await verify_or_create(store, "b3", [junk], [junk])
    # format --force re-initialises: new instance everywhere
    with pytest.raises(CookieMismatchError):
        await format_bookie(store, "b1", [data, journal], [data], force=False)
    fresh = await format_bookie(store, "b1", [data, journal], [data], force=True)
    assert fresh.instance_id != cookie.instance_id
    assert await verify_or_create(store, "b1", [data, journal], [data]) == fresh


async def test_a_disk_from_an_earlier_instance_of_the_same_bookie_is_refused(
    store: MetadataStore, tmp_path: Path
) -> None:
    """Same bookie id, older instance (the bookie was re-formatted since): its data is stale."""
    import shutil

    data, journal, old = tmp_path / "data", tmp_path / "journal", tmp_path / "old-journal"
    first = await verify_or_create(store, "a", [data, journal], [data])
    shutil.copytree(journal, old)
    fresh = await format_bookie(store, "a", [data, journal], [data], force=True)
    assert fresh.bookie_id == first.bookie_id and fresh.instance_id != first.instance_id
    shutil.rmtree(journal)
    shutil.copytree(old, journal)
    with pytest.raises(CookieMismatchError, match=f"{journal}.*instance {first.instance_id}"):
        await verify_or_create(store, "a", [data, journal], [data])


async def test_interrupted_first_start_is_completed(store: MetadataStore, tmp_path: Path) -> None:
    data = tmp_path / "data"
    cookie = await verify_or_create(store, "b9", [data], [data])
    await store.delete(cookie_key("b9"))  # as if the process died before writing the store's copy
    with pytest.raises(NoSuchKeyError):
        await store.get(cookie_key("b9"))
    assert await verify_or_create(store, "b9", [data], [data]) == cookie
    assert Cookie.from_bytes((await store.get(cookie_key("b9"))).value) == cookie


@pytest.mark.parametrize(
    ("damage", "which"),
    [
        ("wipe", "data"), ("wipe", "journal"),
        ("remove", "data"), ("remove", "journal"),
        ("swap", "data"), ("swap", "journal"),
        ("garbage", "data"), ("garbage", "journal"),
    ],
)
async def test_every_damaged_dir_is_refused_by_name(store: MetadataStore, tmp_path: Path, damage: str, which: str) -> None:
    import shutil

    dirs = {"data": tmp_path / "a" / "data", "journal": tmp_path / "a" / "journal"}
    other = {"data": tmp_path / "b" / "data", "journal": tmp_path / "b" / "journal"}
    await verify_or_create(store, "a", [dirs["data"], dirs["journal"]], [dirs["data"]])
    await verify_or_create(store, "b", [other["data"], other["journal"]], [other["data"]])
    (dirs[which] / "ledgers-file").write_text("data")  # the dir is in use
    target = dirs[which]
    if damage == "wipe":
        shutil.rmtree(target)
        target.mkdir()
    elif damage == "remove":
        shutil.rmtree(target)
    elif damage == "swap":
        shutil.rmtree(target)
        shutil.copytree(other[which], target)
    else:
        (target / COOKIE_FILE).write_bytes(b"\x00not a cookie")
    with pytest.raises(CookieMismatchError, match=str(target)):
        await verify_or_create(store, "a", [dirs["data"], dirs["journal"]], [dirs["data"]])
