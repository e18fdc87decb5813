"""The metadata contract, transactions and ids: a transaction is all or nothing; ids are
unique across concurrent allocators, increasing per client, and never handed out again
after their client closed or was killed. Run against memory, etcd x1/x3 and ZooKeeper
x1/x3 (conftest.py).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING

import pytest
from meta_contract_waits import client_process

from scriba.errors import BadVersionError, NoSuchKeyError
from scriba.meta.store import Check, Delete, MetadataStore, Put

if TYPE_CHECKING:
    from conftest import Backend, StoreFactory


async def test_txn_is_all_or_nothing(store: MetadataStore) -> None:
    va = await store.create("tx/a", b"a")
    vb = await store.create("tx/b", b"b")
    await store.create("tx/gone", b"x")
    with pytest.raises(BadVersionError):
        await store.txn(
            [Check("tx/a", va), Check("tx/b", vb + 1000)],
            [Put("tx/a", b"a2"), Put("tx/new", b"n"), Delete("tx/gone")],
        )
    assert (await store.get("tx/a")).value == b"a"
    assert (await store.get("tx/gone")).value == b"x"
    with pytest.raises(NoSuchKeyError):
        await store.get("tx/new")
    with pytest.raises(BadVersionError):  # "must not exist" check fails
        await store.txn([Check("tx/a", None)], [Put("tx/new", b"n")])
    with pytest.raises(NoSuchKeyError):
        await store.get("tx/new")

    await store.txn(
        [Check("tx/a", va), Check("tx/b", vb), Check("tx/new", None)],
        [Put("tx/a", b"a2"), Put("tx/new", b"n"), Delete("tx/gone")],
    )
    assert (await store.get("tx/a")).value == b"a2"
    assert (await store.get("tx/new")).value == b"n"
    with pytest.raises(NoSuchKeyError):
        await store.get("tx/gone")
    with pytest.raises(BadVersionError):  # the old version of tx/a is stale now
        await store.txn([Check("tx/a", va)], [Put("tx/b", b"b2")])
    assert (await store.get("tx/b")).value == b"b"


async def test_allocate_id_is_unique_under_concurrent_allocators(make_store: StoreFactory) -> None:
    stores = [await make_store() for _ in range(4)]
    per_store = 25

    async def allocate(s: MetadataStore) -> list[int]:
        return [await s.allocate_id("ledger") for _ in range(per_store)]

    results = await asyncio.gather(*(allocate(s) for s in stores))
    ids = [i for r in results for i in r]
    assert len(set(ids)) == len(ids) == 4 * per_store
    assert all(0 < i < 2**63 for i in ids)
    assert all(r == sorted(r) for r in results)  # each allocator sees increasing ids
    assert await stores[0].allocate_id("other") != 0


async def test_allocate_id_is_unique_and_increasing_per_client_under_64_concurrent_tasks(
    make_store: StoreFactory,
) -> None:
    stores = [await make_store() for _ in range(4)]
    tasks, per_task = 64, 50
    handed_out: list[list[int]] = [[] for _ in stores]  # per store, in the order ids came back

    async def allocate(i: int) -> None:
        store = stores[i % len(stores)]
        for _ in range(per_task):
            handed_out[i % len(stores)].append(await store.allocate_id("ledger"))

    await asyncio.wait_for(asyncio.gather(*(allocate(i) for i in range(tasks))), 120.0)
    ids = [i for per_store in handed_out for i in per_store]
    assert len(ids) == tasks * per_task
    assert len(set(ids)) == len(ids), "an id was handed out twice"
    assert all(0 < i < 2**63 for i in ids)
    for per_store in handed_out:  # strictly increasing per client, in the order handed out
        assert all(a < b for a, b in itertools.pairwise(per_store))


_ALLOCATOR = """
import asyncio, sys
from scriba.meta import connect

async def main() -> None:
    store = await connect(sys.argv[1])
    ids = [await store.allocate_id("ledger") for _ in range(int(sys.argv[2]))]
    print("ids", *ids, flush=True)
    await asyncio.sleep(3600)  # the child holds its session until the test kills it

asyncio.run(main())
"""


async def _ids_of_a_killed_client(backend: Backend, make_store: StoreFactory, count: int) -> list[int]:
    """Ids a client handed out before it died without closing (SIGKILL; memory: abandoned)."""
    if backend.cluster is None:
        store = await make_store()
        return [await store.allocate_id("ledger") for _ in range(count)]
    child, line = await client_process(
        _ALLOCATOR, backend.uri, str(count), ready=lambda line: line.startswith(b"ids ")
    )
    child.kill()
    await asyncio.wait_for(child.wait(), 10.0)
    return [int(word) for word in line.split()[1:]]


async def test_allocate_id_never_reuses_ids_after_clients_close_or_crash(
    backend: Backend, make_store: StoreFactory
) -> None:
    first = await make_store()
    closed_ids = [await first.allocate_id("ledger") for _ in range(5)]
    await first.close()
    crashed_ids = await _ids_of_a_killed_client(backend, make_store, 7)
    assert len(crashed_ids) == 7
    again = await make_store()
    new_ids = [await again.allocate_id("ledger") for _ in range(20)]
    earlier = closed_ids + crashed_ids
    assert len(set(earlier)) == len(earlier)
    assert min(new_ids) > max(earlier), "an id of a closed or crashed client was handed out again"
    assert all(a < b for a, b in itertools.pairwise(new_ids))
