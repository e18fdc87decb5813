"""The metadata round trips of create+close: one record create and one compare-and-set.

Counted on a ``memory://`` store wrapped by a counter: creating a ledger allocates its id
from a reserved range (no round trip for most ledgers), creates the record, and closing
it compare-and-sets the record from the version the writer created or last wrote, never
reading it back. When someone else changed the record meanwhile, the close reads it
again and still succeeds.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

import scriba.meta
from scriba.client import Client
from scriba.meta.records import LEDGER_CODEC, LEDGERS_PREFIX, LedgerState, ledger_key
from scriba.meta.store import MetadataStore, Versioned
from scriba.meta.update import update_metadata
from scriba.testing.sim import StorageTransport, register_bookies

BOOKIES = ["bk0", "bk1", "bk2"]


class CountingStore:
    """Delegates to a store; counts record operations on ledger records."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def _count(self, op: str, key: str) -> None:
        if key.startswith(LEDGERS_PREFIX):
            self.calls[op] += 1

    async def get(self, key: str) -> Versioned[bytes]:
        self._count("get", key)
        return await self._store.get(key)

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> int:
        self._count("create", key)
        return await self._store.create(key, value, ephemeral=ephemeral)

    async def set(self, key: str, value: bytes, *, expected_version: int) -> int:
        self._count("set", key)
        return await self._store.set(key, value, expected_version=expected_version)

    async def allocate_id(self, name: str) -> int:
        self.calls["allocate_id"] += 1
        return await self._store.allocate_id(name)


@pytest.fixture
async def counted() -> AsyncIterator[tuple[Client, CountingStore, MetadataStore]]:
    store = await scriba.meta.connect(f"memory://round-trips-{uuid.uuid4().hex[:10]}")
    await register_bookies(store, BOOKIES)
    counting = CountingStore(store)
    transport = StorageTransport(BOOKIES)
    client = await Client.connect(store.uri, store=counting, transport=transport)  # type: ignore[arg-type]
    try:
        yield client, counting, store
    finally:
        await client.close()
        await transport.close()
        await store.close()


async def test_create_and_close_cost_one_create_and_one_cas(
    counted: tuple[Client, CountingStore, MetadataStore],
) -> None:
    client, counting, store = counted
    for _ in range(20):
        w = await client.create_ledger(3, 3, 2)
        await w.append(b"x")
        await w.close()
    assert counting.calls == Counter(allocate_id=20, create=20, set=20)  # no get: nothing read back
    counter = int((await store.get("ids/ledger")).value)
    assert counter < 40  # ids came from a few reserved ranges, not a write per id


async def test_close_after_someone_else_changed_the_record_reads_it_and_closes(
    counted: tuple[Client, CountingStore, MetadataStore],
) -> None:
    client, counting, store = counted
    w = await client.create_ledger(3, 3, 2)
    await w.append(b"x")
    key = ledger_key(w.ledger_id)

    await update_metadata(  # another client's change between the writer's create and its close
        store, key, LEDGER_CODEC, lambda md: not md.custom_metadata,
        lambda md: dataclasses.replace(md, custom_metadata={"k": "v"}),
    )
    await w.close()
    assert counting.calls["get"] == 1 and counting.calls["set"] == 2  # a lost CAS, a read, a CAS
    record = LEDGER_CODEC.from_bytes((await store.get(key)).value)
    assert record.state is LedgerState.CLOSED and record.last_entry_id == 0
    assert record.custom_metadata == {"k": "v"}  # the other change was kept
