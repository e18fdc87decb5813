"""The metadata contract, sessions: ephemerals name their session and vanish when it
closes, expires or its client is killed (within the session timeout, 2 s here); the
election hands over when its leader's session dies; a cluster store keeps working after
one member is killed. Run against memory, etcd x1/x3 and ZooKeeper x1/x3 (conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import pytest
from meta_contract_waits import (
    EVENT_WAIT_S,
    EXPIRY_WAIT_S,
    SESSION_TIMEOUT_S,
    Change,
    assert_changes,
    client_process,
    collect_until,
    next_event,
    read_settles,
    read_until_synced,
    value_of,
)

from scriba.errors import BadVersionError, MetadataUnavailableError, NoSuchKeyError
from scriba.meta.election import Election
from scriba.meta.store import EventKind, MetadataStore, SessionState

if TYPE_CHECKING:
    from conftest import Backend, Eventually, StoreFactory


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
    await asyncio.sleep(3600)  # the child holds its session until the test kills it

asyncio.run(main())
"""


async def test_ephemeral_of_a_killed_client_vanishes_within_the_session_timeout(
    backend: Backend, store: MetadataStore, eventually: Eventually
) -> None:
    if backend.cluster is None:
        pytest.skip("memory:// lives in one process: nothing to kill")
    holder, line = await client_process(
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
