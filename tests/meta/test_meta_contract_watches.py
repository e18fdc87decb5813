"""The metadata contract, watches: the state, then SYNCED, then every change in order (per
key, on ZooKeeper, an in-order subsequence ending at the last change), for keys, absent
keys and prefixes, and nothing written while a watch starts is missed. Run against
memory, etcd x1/x3 and ZooKeeper x1/x3 (conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from meta_contract_waits import assert_changes, collect_until, next_event, read_until_synced

from scriba.meta.store import EventKind, MetadataStore

if TYPE_CHECKING:
    from conftest import Backend, StoreFactory


async def test_watch_key_gives_state_then_synced_then_changes(backend: Backend, store: MetadataStore) -> None:
    v = await store.create("w/key", b"v0")
    async with contextlib.aclosing(store.watch("w/key")) as events:
        initial = await read_until_synced(events)
        assert [(e.kind, e.key, e.value, e.version) for e in initial] == [(EventKind.PUT, "w/key", b"v0", v)]
        v = await store.set("w/key", b"v1", expected_version=v)
        v = await store.set("w/key", b"v2", expected_version=v)
        await store.delete("w/key")
        await store.create("w/key", b"v3")
        await store.create("w/other", b"not watched")
        expected = [("PUT", "w/key", b"v1"), ("PUT", "w/key", b"v2"), ("DELETE", "w/key", None), ("PUT", "w/key", b"v3")]
        got = await collect_until(events, expected[-1])
        assert_changes(backend, got, expected)


async def test_watch_absent_key_syncs_then_sees_its_creation(store: MetadataStore) -> None:
    async with contextlib.aclosing(store.watch("w/later")) as events:
        assert await read_until_synced(events) == []
        version = await store.create("w/later", b"hello")
        event = await next_event(events)
        assert (event.kind, event.key, event.value, event.version) == (EventKind.PUT, "w/later", b"hello", version)


async def test_watch_prefix_sees_children_in_order(backend: Backend, store: MetadataStore) -> None:
    for name in ("b", "a", "c"):
        await store.create(f"dir/{name}", name.encode())
    async with contextlib.aclosing(store.watch("dir/", prefix=True)) as events:
        initial = await read_until_synced(events)
        assert sorted((e.key, e.value) for e in initial) == [("dir/a", b"a"), ("dir/b", b"b"), ("dir/c", b"c")]
        await store.create("dir/d", b"d")
        b = await store.get("dir/b")
        await store.set("dir/b", b"b2", expected_version=b.version)
        await store.delete("dir/a")
        await store.create("dir/e", b"e")
        expected = [
            ("PUT", "dir/d", b"d"),
            ("PUT", "dir/b", b"b2"),
            ("DELETE", "dir/a", None),
            ("PUT", "dir/e", b"e"),
        ]
        got = await collect_until(events, expected[-1])
        assert_changes(backend, got, expected)


async def test_watch_misses_nothing_written_while_it_starts(backend: Backend, make_store: StoreFactory) -> None:
    reader, writer = await make_store(), await make_store()
    version = await writer.create("race/k", b"0")
    writes_max = 40

    async def write_all() -> None:
        nonlocal version
        for i in range(1, writes_max + 1):
            version = await writer.set("race/k", str(i).encode(), expected_version=version)

    write_task = asyncio.create_task(write_all())
    seen: list[int] = []
    async with contextlib.aclosing(reader.watch("race/k")) as events:
        while not seen or seen[-1] != writes_max:
            event = await next_event(events)
            if event.kind is EventKind.PUT:
                seen.append(int(event.value or b"-1"))
    await write_task
    assert seen == sorted(seen) and seen[-1] == writes_max
    if backend.exact_watch:  # from the initial value on, every later write is there, once
        assert seen == list(range(seen[0], writes_max + 1))
