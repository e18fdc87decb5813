"""The metadata contract: one suite, run against memory, etcd x1/x3 and ZooKeeper x1/x3.

Each test gets a fresh prefix (see conftest.py). This file: records, listing and bad
input; watches, transactions and ids, and sessions (ephemerals, election, membership
loss) are in ``test_meta_contract_watches.py``, ``test_meta_contract_txn_ids.py`` and
``test_meta_contract_sessions.py``; the waits they share in ``meta_contract_waits.py``. Session timeouts are 2 s so
expiry tests stay fast; every wait is a condition with a deadline.

Two documented differences of ZooKeeper: watches may coalesce intermediate
versions (per key, order and the last value hold), and a read by another client
may lag a completed write briefly (sequential consistency; ``read_settles``).
Versions restart when a znode is re-created, so ``created`` tells incarnations apart.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING

import pytest
from meta_contract_waits import read_settles, value_of

from scriba.errors import (
    BadRequestError,
    BadVersionError,
    KeyExistsError,
    NoSuchKeyError,
    ValueTooLargeError,
)
from scriba.meta.store import VALUE_SIZE_MAX, MetadataStore, Put

if TYPE_CHECKING:
    from conftest import Backend, StoreFactory


# --- records ----------------------------------------------------------------------------


async def test_create_get_set_delete_with_versions(store: MetadataStore) -> None:
    v1 = await store.create("cfg/a", b"one")
    got = await store.get("cfg/a")
    assert (got.value, got.version) == (b"one", v1)
    v2 = await store.set("cfg/a", b"two", expected_version=v1)
    assert v2 != v1
    got2 = await store.get("cfg/a")
    assert (got2.value, got2.version, got2.created) == (b"two", v2, got.created)
    await store.delete("cfg/a", expected_version=v2)
    with pytest.raises(NoSuchKeyError):
        await store.get("cfg/a")
    await store.create("cfg/b", b"")
    assert (await store.get("cfg/b")).value == b""
    await store.delete("cfg/b")  # unconditional
    with pytest.raises(NoSuchKeyError):
        await store.get("cfg/b")


async def test_a_version_from_a_deleted_incarnation_never_matches_again(backend: Backend, store: MetadataStore) -> None:
    if not backend.exact_watch:
        pytest.skip("ZooKeeper versions restart at 0 when a znode is re-created (ABA): compare `created` too")
    old = await store.create("aba", b"first")
    await store.delete("aba")
    new = await store.create("aba", b"second")
    assert new != old
    with pytest.raises(BadVersionError):
        await store.set("aba", b"stale writer", expected_version=old)
    assert (await store.get("aba")).value == b"second"


async def test_created_is_a_store_wide_increasing_revision(store: MetadataStore) -> None:
    await store.create("seq/a", b"a")
    a = await store.get("seq/a")
    await store.set("seq/a", b"a2", expected_version=a.version)
    await store.create("seq/b", b"b")
    b = await store.get("seq/b")
    assert b.created > a.created > 0
    assert (await store.get("seq/a")).created == a.created


async def test_cas_conflict_raises_bad_version(backend: Backend, make_store: StoreFactory) -> None:
    one, two = await make_store(), await make_store()
    v = await one.create("cas/x", b"0")
    await two.set("cas/x", b"two", expected_version=v)
    with pytest.raises(BadVersionError):
        await one.set("cas/x", b"one", expected_version=v)
    with pytest.raises(BadVersionError):
        await one.delete("cas/x", expected_version=v)
    await read_settles(backend, lambda: value_of(one, "cas/x"), b"two")


async def test_create_existing_raises_key_exists(store: MetadataStore) -> None:
    await store.create("dup", b"first")
    with pytest.raises(KeyExistsError):
        await store.create("dup", b"second")
    with pytest.raises(KeyExistsError):
        await store.create("dup", b"third", ephemeral=True)
    assert (await store.get("dup")).value == b"first"


async def test_missing_key_raises_no_such_key(store: MetadataStore) -> None:
    with pytest.raises(NoSuchKeyError):
        await store.get("nope")
    with pytest.raises(NoSuchKeyError):
        await store.set("nope", b"x", expected_version=1)
    with pytest.raises(NoSuchKeyError):
        await store.delete("nope")
    with pytest.raises(NoSuchKeyError):
        await store.delete("nope", expected_version=3)


async def test_concurrent_cas_increments_lose_nothing(backend: Backend, make_store: StoreFactory) -> None:
    stores = [await make_store() for _ in range(3)]
    await stores[0].create("counter", b"0")

    async def bump(s: MetadataStore, times: int) -> None:
        for _ in range(times):
            for _attempt in range(200):
                cur = await s.get("counter")
                try:
                    await s.set("counter", str(int(cur.value) + 1).encode(), expected_version=cur.version)
                    break
                except BadVersionError:
                    continue
            else:
                pytest.fail("no CAS succeeded in 200 attempts")

    await asyncio.gather(*(bump(s, 10) for s in stores))
    await read_settles(backend, lambda: value_of(stores[0], "counter"), b"30")


# --- listing ----------------------------------------------------------------------------


async def test_list_is_sorted_one_level_deep_and_paginated(store: MetadataStore) -> None:
    names = [f"r{i:03d}" for i in range(25)]
    for name in random.Random(7).sample(names, len(names)):
        await store.create(f"rows/{name}", name.encode())
    await store.create("rows/r000/child", b"nested")  # not a direct child of rows/
    await store.create("rowsibling", b"x")  # shares the text prefix, not the path

    listed = await store.list("rows/")
    assert [k for k, _ in listed] == [f"rows/{n}" for n in names]
    assert all(v.value == k.split("/")[1].encode() for k, v in listed)

    pages: list[list[str]] = []
    after: str | None = None
    while True:
        page = await store.list("rows/", start_after=after, limit=10)
        if not page:
            break
        pages.append([k for k, _ in page])
        after = page[-1][0]
    assert [len(p) for p in pages] == [10, 10, 5]
    assert [k for p in pages for k in p] == [f"rows/{n}" for n in names]
    assert await store.list("empty/") == []


async def test_scan_and_unlimited_list_walk_more_than_one_page(store: MetadataStore) -> None:
    count = 520  # above the drivers' internal page (500) too
    for start in range(0, count, 100):
        await asyncio.gather(*(store.create(f"many/{i:04d}", str(i).encode()) for i in range(start, min(count, start + 100))))
    expected = [f"many/{i:04d}" for i in range(count)]
    seen = [key async for key, _ in store.scan("many/", page_size=200)]
    assert seen == expected
    assert [key for key, _ in await store.list("many/")] == expected


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["", "/abs", "trailing/", "a//b"])
async def test_bad_keys_are_rejected(store: MetadataStore, key: str) -> None:
    with pytest.raises(BadRequestError):
        await store.create(key, b"x")
    with pytest.raises(BadRequestError):
        await store.get(key)


async def test_oversized_values_are_rejected(store: MetadataStore) -> None:
    too_big = b"x" * (VALUE_SIZE_MAX + 1)
    with pytest.raises(ValueTooLargeError):
        await store.create("big", too_big)
    v = await store.create("big", b"small")
    with pytest.raises(ValueTooLargeError):
        await store.set("big", too_big, expected_version=v)
    with pytest.raises(ValueTooLargeError):
        await store.txn([], [Put("big", too_big)])
    assert (await store.get("big")).value == b"small"


async def test_a_value_at_the_limit_is_accepted(store: MetadataStore) -> None:
    at_limit = bytes(range(256)) * (VALUE_SIZE_MAX // 256)
    assert len(at_limit) == VALUE_SIZE_MAX
    await store.create("limit", at_limit)
    assert (await store.get("limit")).value == at_limit
