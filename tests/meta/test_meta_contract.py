"""The metadata contract: one suite, run against memory, etcd x1/x3 and ZooKeeper x1/x3.

Each test gets a fresh prefix (see conftest.py). Session timeouts are 2 s so
expiry tests stay fast; every wait is a condition with a deadline.

Two documented differences of ZooKeeper: watches may coalesce intermediate
versions (per key, order and the last value hold), and a read by another client
may lag a completed write briefly (sequential consistency; ``read_settles``).
Versions restart when a znode is re-created, so ``created`` tells incarnations apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import sys
import time
from asyncio.subprocess import Process
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import pytest

from scriba.errors import (
    BadRequestError,
    BadVersionError,
    KeyExistsError,
    MetadataUnavailableError,
    NoSuchKeyError,
    ValueTooLargeError,
)
from scriba.meta.election import Election
from scriba.meta.store import (
    VALUE_SIZE_MAX,
    Check,
    Delete,
    EventKind,
    MetadataStore,
    Put,
    SessionState,
    WatchEvent,
)

if TYPE_CHECKING:
    from conftest import Backend, Eventually, StoreFactory

SESSION_TIMEOUT_S = 2.0  # conftest's default for every store

EVENT_WAIT_S = 10.0
EXPIRY_WAIT_S = SESSION_TIMEOUT_S + 3.0  # "within the session timeout", plus slack for a loaded machine


async def next_event(events: AsyncIterator[WatchEvent], timeout_s: float = EVENT_WAIT_S) -> WatchEvent:
    return await asyncio.wait_for(anext(events), timeout_s)


async def read_until_synced(events: AsyncIterator[WatchEvent]) -> list[WatchEvent]:
    initial: list[WatchEvent] = []
    while True:
        event = await next_event(events)
        if event.kind is EventKind.SYNCED:
            return initial
        initial.append(event)


Change = tuple[str, str, bytes | None]  # (kind name, key, value)


async def read_settles(backend: Backend, read: Callable[[], Awaitable[object]], expected: object) -> None:
    """Another client's read sees a completed write: at once on memory/etcd; on ZooKeeper
    (sequential consistency: that client's server may lag) within a short deadline."""
    if backend.fresh_reads:
        assert await read() == expected
        return
    deadline = time.monotonic() + EVENT_WAIT_S
    while True:
        try:
            got = await read()
        except NoSuchKeyError:
            got = NoSuchKeyError
        if got == expected:
            return
        if time.monotonic() > deadline:
            assert got == expected
        await asyncio.sleep(0.02)


async def value_of(store: MetadataStore, key: str) -> bytes:
    return (await store.get(key)).value


def assert_changes(backend: Backend, got: Sequence[Change], expected: Sequence[Change]) -> None:
    """memory/etcd: exactly ``expected``. ZooKeeper: per key an in-order subsequence ending at the same last change."""
    if backend.exact_watch:
        assert got == expected
        return
    for key in {k for _, k, _ in expected}:
        want = [e for e in expected if e[1] == key]
        have = [e for e in got if e[1] == key]
        assert have, f"no event for {key}"
        assert have[-1] == want[-1], f"{key}: last event {have[-1]} != {want[-1]}"
        it = iter(want)
        assert all(e in it for e in have), f"{key}: {have} is not an in-order subsequence of {want}"


async def collect_until(events: AsyncIterator[WatchEvent], last: tuple[str, str, bytes | None]) -> list[tuple[str, str, bytes | None]]:
    got: list[tuple[str, str, bytes | None]] = []
    while not got or got[-1] != last:
        event = await next_event(events)
        got.append((event.kind.name, event.key, event.value))
    return got


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


# --- watches ----------------------------------------------------------------------------


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


# --- transactions and ids -------------------------------------------------------------


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
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def _client_process(script: str, *args: str, ready: Callable[[bytes], bool]) -> tuple[Process, bytes]:
    """Run ``script`` as a client in its own process; return it once it printed a ``ready`` line."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert child.stdout is not None
        async with asyncio.timeout(30.0):  # unconfigured structlog may print log lines first
            while (line := await child.stdout.readline()) and not ready(line):
                pass
    except BaseException:
        child.kill()
        await asyncio.wait_for(child.wait(), 10.0)
        raise
    return child, line


async def _ids_of_a_killed_client(backend: Backend, make_store: StoreFactory, count: int) -> list[int]:
    """Ids a client handed out before it died without closing (SIGKILL; memory: abandoned)."""
    if backend.cluster is None:
        store = await make_store()
        return [await store.allocate_id("ledger") for _ in range(count)]
    child, line = await _client_process(
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


# --- sessions and ephemerals ----------------------------------------------------------


async def test_ephemeral_vanishes_after_its_session_closes(
    backend: Backend, make_store: StoreFactory, eventually: Eventually
) -> None:
    owner, observer = await make_store(), await make_store()
    await owner.create("live/node", b"here", ephemeral=True)
    await owner.create("live/persistent", b"stays")
    await read_settles(backend, lambda: value_of(observer, "live/node"), b"here")
    await owner.close()

    async def gone() -> bool:
        try:
            await observer.get("live/node")
        except NoSuchKeyError:
            return True
        return False

    await eventually(gone, EXPIRY_WAIT_S, what="ephemeral removal after close")
    assert (await observer.get("live/persistent")).value == b"stays"


async def test_an_ephemeral_names_its_session_as_owner_and_a_persistent_record_none(
    backend: Backend, make_store: StoreFactory
) -> None:
    """How a holder whose create answer was lost recognises the record as its own."""
    owner, other = await make_store(), await make_store()
    await owner.create("own/eph", b"e", ephemeral=True)
    await owner.create("own/persistent", b"p")
    assert owner.session.session_id != other.session.session_id
    assert (await owner.get("own/eph")).owner == owner.session.session_id
    assert (await owner.get("own/persistent")).owner == ""
    listed = dict(await owner.list("own/"))
    assert (listed["own/eph"].owner, listed["own/persistent"].owner) == (owner.session.session_id, "")
    version = (await owner.get("own/eph")).version
    await owner.set("own/eph", b"e2", expected_version=version)  # a write keeps the owner
    assert (await owner.get("own/eph")).owner == owner.session.session_id


async def test_session_expiry_removes_ephemerals_and_reports_lost_then_connected(
    backend: Backend, make_store: StoreFactory, eventually: Eventually
) -> None:
    owner, observer = await make_store(), await make_store()
    states: list[SessionState] = []
    owner.session.add_listener(states.append)
    old_id = owner.session.session_id
    await owner.create("exp/node", b"e", ephemeral=True)
    await owner.create("exp/persistent", b"p")

    await read_settles(backend, lambda: value_of(observer, "exp/node"), b"e")
    async with contextlib.aclosing(observer.watch("exp/node")) as events:
        assert [e.key for e in await read_until_synced(events)] == ["exp/node"]
        await owner.expire_session_for_test()  # type: ignore[attr-defined]
        event = await next_event(events, EXPIRY_WAIT_S)
        assert (event.kind, event.key) == (EventKind.DELETE, "exp/node")

    async def reconnected() -> bool:
        return owner.session.state is SessionState.CONNECTED and owner.session.session_id != old_id

    await eventually(reconnected, EXPIRY_WAIT_S, what="a new session after expiry")
    lost_at = states.index(SessionState.LOST)
    assert SessionState.CONNECTED in states[lost_at + 1 :]
    assert (await observer.get("exp/persistent")).value == b"p"
    await owner.create("exp/node", b"again", ephemeral=True)  # the new session holds ephemerals
    await read_settles(backend, lambda: value_of(observer, "exp/node"), b"again")


_HOLDER = """
import asyncio, sys
from scriba.meta import connect

async def main() -> None:
    store = await connect(sys.argv[1], session_timeout_s=float(sys.argv[2]))
    await store.create("crash/node", b"held", ephemeral=True)
    print("ready", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_ephemeral_of_a_killed_client_vanishes_within_the_session_timeout(
    backend: Backend, store: MetadataStore, eventually: Eventually
) -> None:
    if backend.cluster is None:
        pytest.skip("memory:// lives in one process: nothing to kill")
    holder, line = await _client_process(
        _HOLDER, backend.uri, str(SESSION_TIMEOUT_S), ready=lambda line: line.strip() == b"ready"
    )
    try:
        assert line.strip() == b"ready"
        await read_settles(backend, lambda: value_of(store, "crash/node"), b"held")
    finally:
        holder.kill()  # SIGKILL: no goodbye to the server; only the session timeout removes the node
        await asyncio.wait_for(holder.wait(), 10.0)

    async def gone() -> bool:
        try:
            await store.get("crash/node")
        except NoSuchKeyError:
            return True
        return False

    waited_s = await eventually(gone, EXPIRY_WAIT_S, what="the killed client's ephemeral to vanish")
    assert waited_s <= EXPIRY_WAIT_S


# --- election ---------------------------------------------------------------------------


async def test_election_hands_over_after_the_leader_session_dies(backend: Backend, make_store: StoreFactory) -> None:
    s1, s2, s3 = await make_store(), await make_store(), await make_store()
    e1, e2 = Election(s1, "primary"), Election(s2, "primary")
    assert await Election(s3, "primary").leader() is None

    first = await asyncio.wait_for(e1.campaign("one", b"addr-1"), EVENT_WAIT_S)
    await read_settles(backend, Election(s3, "primary").leader, ("one", first.token))
    observed: list[tuple[str, int] | None] = []

    async def observe() -> None:
        async for leader in Election(s3, "primary").observe():
            observed.append(leader)
            if leader is not None and leader[0] == "two":
                return

    observer = asyncio.create_task(observe())
    second_task = asyncio.create_task(e2.campaign("two"))
    with pytest.raises(TimeoutError):  # "one" still leads: "two" waits
        await asyncio.wait_for(asyncio.shield(second_task), 0.3)

    await s1.expire_session_for_test()  # type: ignore[attr-defined]
    await asyncio.wait_for(first.lost.wait(), EXPIRY_WAIT_S)
    second = await asyncio.wait_for(second_task, EXPIRY_WAIT_S)
    assert second.token > first.token
    assert not second.lost.is_set()
    await read_settles(backend, Election(s3, "primary").leader, ("two", second.token))
    await asyncio.wait_for(observer, EVENT_WAIT_S)
    assert observed[0] == ("one", first.token) and observed[-1] == ("two", second.token)

    # A graceful hand-over: resign, the next campaigner wins with a larger token still.
    third_task = asyncio.create_task(Election(s3, "primary").campaign("three"))
    await e2.resign()
    assert second.lost.is_set()
    third = await asyncio.wait_for(third_task, EVENT_WAIT_S)
    assert third.token > second.token


# --- membership loss ----------------------------------------------------------------------


async def set_surely(store: MetadataStore, key: str, value: bytes, version: int) -> int:
    """CAS ``value``; a write racing a member's death may end with an unknown outcome: re-read and retry."""
    for _attempt in range(20):
        try:
            return await store.set(key, value, expected_version=version)
        except (MetadataUnavailableError, BadVersionError):
            current = await store.get(key)
            if current.value == value:
                return current.version
            version = current.version
    pytest.fail(f"could not write {key} in 20 attempts")


async def test_store_keeps_working_after_one_member_is_killed(
    backend: Backend, make_store: StoreFactory, eventually: Eventually
) -> None:
    if backend.members < 3:
        pytest.skip("needs a 3-member cluster")
    cluster = backend.cluster
    assert cluster is not None
    store = await make_store(session_timeout_s=4.0)
    await store.create("ha/eph", b"e", ephemeral=True)
    v = await store.create("ha/k", b"0")
    async with contextlib.aclosing(store.watch("ha/k")) as events:
        await read_until_synced(events)
        v = await store.set("ha/k", b"1", expected_version=v)
        cluster.kill_member(0)  # the first endpoint: where the client's connection most likely is
        try:
            for i in range(2, 6):
                v = await set_surely(store, "ha/k", str(i).encode(), v)
            got = await collect_until(events, ("PUT", "ha/k", b"5"))
            expected: list[Change] = [("PUT", "ha/k", str(i).encode()) for i in range(1, 6)]
            assert_changes(backend, got, expected)
            assert (await store.get("ha/eph")).value == b"e"  # the session survived

            async def connected() -> bool:
                return store.session.state is SessionState.CONNECTED

            await eventually(connected, EXPIRY_WAIT_S, what="session CONNECTED after member loss")
            assert (await store.get("ha/eph")).value == b"e"
            other = await make_store()
            await read_settles(backend, lambda: value_of(other, "ha/k"), b"5")
        finally:
            await asyncio.to_thread(cluster.start_member, 0)


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
