"""etcd driver specifics: member loss where the client is connected, pauses (SUSPENDED /
real lease expiry), a restart of the only member, and the embedded launcher.

These tests kill and pause servers, so they use their own clusters (module-scoped),
not the contract suite's shared ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from scriba.embedded.etcd import EtcdCluster, find_etcd_binary
from scriba.errors import BadVersionError, MetadataUnavailableError, NoSuchKeyError
from scriba.meta import connect
from scriba.meta.etcd import EtcdStore
from scriba.meta.store import EventKind, SessionState, WatchEvent

if TYPE_CHECKING:
    from conftest import Eventually

WAIT_S = 15.0


@pytest.fixture(scope="module")
def etcd3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    with EtcdCluster(tmp_path_factory.mktemp("etcd3-own"), 3) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def etcd1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    with EtcdCluster(tmp_path_factory.mktemp("etcd1-own"), 1) as cluster:
        yield cluster


@contextlib.asynccontextmanager
async def open_store(uri: str, session_timeout_s: float = 2.0) -> AsyncIterator[EtcdStore]:
    store = await connect(uri, connect_timeout_s=5.0, session_timeout_s=session_timeout_s)
    assert isinstance(store, EtcdStore)
    try:
        yield store
    finally:
        await store.close()


async def put_surely(store: EtcdStore, key: str, value: bytes) -> None:
    """Write ``value`` whatever the version; retry an unknown outcome after a member died."""
    for _ in range(30):
        try:
            current = await store.get(key)
            await store.set(key, value, expected_version=current.version)
            return
        except (MetadataUnavailableError, BadVersionError):
            with contextlib.suppress(MetadataUnavailableError, NoSuchKeyError):
                if (await store.get(key)).value == value:
                    return
    pytest.fail(f"could not write {key}")


async def values_until(events: AsyncIterator[WatchEvent], last: bytes) -> list[bytes]:
    got: list[bytes] = []
    async with asyncio.timeout(WAIT_S):
        while last not in got:
            event = await anext(events)
            if event.kind is EventKind.PUT:
                got.append(event.value or b"")
    return got


def member_index(cluster: EtcdCluster, url: str) -> int:
    return [f"http://{h}:{p}" for h, p in cluster.endpoints].index(url)


async def leader_index(cluster: EtcdCluster) -> int:
    for i, (host, port) in enumerate(cluster.endpoints):
        async with open_store(f"etcd://{host}:{port}/probe") as probe:
            if (await probe.serving_member())[1]:
                return i
    pytest.fail("no member says it leads")


@pytest.mark.parametrize("victim", ["serving", "leader"])
async def test_watch_and_session_survive_losing_the_serving_member_or_the_leader(
    etcd3: EtcdCluster, victim: str, eventually: Eventually
) -> None:
    uri = etcd3.uri(f"own-{victim}")
    async with open_store(uri, session_timeout_s=4.0) as store, open_store(uri) as writer:
        url, _ = await store.serving_member()
        index = member_index(etcd3, url)
        if victim == "leader":
            index = await leader_index(etcd3)
        session_id = store.session.session_id
        await store.create("eph", b"e", ephemeral=True)
        await writer.create("k", b"0")
        async with contextlib.aclosing(store.watch("k")) as events:
            assert await values_until(events, b"0") == [b"0"]
            etcd3.kill_member(index)
            try:
                for i in range(1, 6):
                    await put_surely(writer, "k", str(i).encode())
                assert await values_until(events, b"5") == [str(i).encode() for i in range(1, 6)]
                new_url, _ = await store.serving_member()
                assert new_url != url or victim == "leader"

                async def connected() -> bool:
                    return store.session.state is SessionState.CONNECTED

                await eventually(connected, WAIT_S, what="session CONNECTED after the member loss")
                assert store.session.session_id == session_id  # the lease lived on
                assert (await writer.get("eph")).value == b"e"
            finally:
                await asyncio.to_thread(etcd3.start_member, index)


async def test_a_short_pause_suspends_the_session_and_it_comes_back(etcd1: EtcdCluster, eventually: Eventually) -> None:
    async with open_store(etcd1.uri("own-pause"), session_timeout_s=3.0) as store:
        states: list[SessionState] = []
        store.session.add_listener(states.append)
        session_id = store.session.session_id
        await store.create("eph", b"e", ephemeral=True)
        member = etcd1.members[0]
        member.pause()
        try:
            async def suspended() -> bool:
                return SessionState.SUSPENDED in states

            await eventually(suspended, WAIT_S, what="SUSPENDED while the server is paused")
        finally:
            member.resume()

        async def connected() -> bool:
            return store.session.state is SessionState.CONNECTED

        await eventually(connected, WAIT_S, what="CONNECTED after resume")
        assert SessionState.LOST not in states and store.session.session_id == session_id
        assert (await store.get("eph")).value == b"e"


async def test_a_pause_longer_than_the_ttl_expires_the_lease_for_real(
    etcd1: EtcdCluster, eventually: Eventually
) -> None:
    async with open_store(etcd1.uri("own-expire"), session_timeout_s=1.0) as store:
        states: list[SessionState] = []
        store.session.add_listener(states.append)
        session_id = store.session.session_id
        await store.create("eph", b"e", ephemeral=True)
        member = etcd1.members[0]
        member.pause()
        try:
            async def suspended() -> bool:
                return SessionState.SUSPENDED in states

            await eventually(suspended, WAIT_S, what="SUSPENDED while the server is paused")
            await asyncio.sleep(1.5)  # the fault itself: stay paused past the 1 s TTL
        finally:
            member.resume()

        async def renewed() -> bool:
            return store.session.state is SessionState.CONNECTED and store.session.session_id != session_id

        await eventually(renewed, WAIT_S, what="a new session after the lease expired")
        assert states.index(SessionState.LOST) < len(states) - 1
        with pytest.raises(NoSuchKeyError):
            await store.get("eph")


async def test_watch_and_lease_survive_a_restart_of_the_only_member(etcd1: EtcdCluster) -> None:
    async with open_store(etcd1.uri("own-restart"), session_timeout_s=5.0) as store:
        session_id = store.session.session_id
        await store.create("eph", b"e", ephemeral=True)
        await store.create("k", b"0")
        async with contextlib.aclosing(store.watch("k")) as events:
            assert await values_until(events, b"0") == [b"0"]
            etcd1.kill_member(0)
            await asyncio.to_thread(etcd1.start_member, 0)
            for i in range(1, 4):
                await put_surely(store, "k", str(i).encode())
            assert await values_until(events, b"3") == [b"1", b"2", b"3"]
        assert (await store.get("eph")).value == b"e"
        assert store.session.session_id == session_id


def test_the_embedded_launcher_finds_etcd_and_names_every_endpoint(tmp_path: Path) -> None:
    binary = find_etcd_binary()
    assert os.access(binary, os.X_OK)
    cluster = EtcdCluster(tmp_path, 3)
    hosts = ",".join(f"127.0.0.1:{p}" for _, p in cluster.endpoints)
    assert cluster.uri("pfx") == f"etcd://{hosts}/pfx"
    assert len({p for _, p in cluster.endpoints} | set(cluster.peer_ports)) == 6
    assert all(not m.running for m in cluster.members)


async def test_a_cluster_restarted_from_its_data_dirs_keeps_its_records(tmp_path: Path) -> None:
    first = EtcdCluster(tmp_path, 3)
    await asyncio.to_thread(first.start)
    try:
        async with open_store(first.uri("keep")) as store:
            await store.create("k", b"durable")
    finally:
        await asyncio.to_thread(first.stop)
    again = EtcdCluster(tmp_path, 3)  # a new object: same ports from cluster.json, same data
    assert again.endpoints == first.endpoints
    await asyncio.to_thread(again.start)
    try:
        async with open_store(again.uri("keep")) as store:
            assert (await store.get("k")).value == b"durable"
    finally:
        await asyncio.to_thread(again.stop)


async def test_watch_resyncs_when_its_start_revision_was_compacted(
    etcd1: EtcdCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aetcd import rpc  # type: ignore[import-untyped]

    uri = etcd1.uri("own-compact")
    async with open_store(uri) as store, open_store(uri) as other:
        await store.create("d/k", b"0")
        await store.create("d/gone", b"0")
        read_state = store._watcher.read_state
        reads = 0

        async def read_then_compact(key: str, prefix: bool) -> tuple[dict[str, object], int]:
            """The fault: between the watch's read and its start, history is written and compacted."""
            nonlocal reads
            state, revision = await read_state(key, prefix)
            reads += 1
            if reads == 1:
                for value in (b"1", b"2"):
                    await other.set("d/k", value, expected_version=(await other.get("d/k")).version)
                await other.delete("d/gone")
                now = (await other.get("d/k")).version
                await other._conn.kv.Compact(rpc.CompactionRequest(revision=now, physical=True))
            return state, revision  # type: ignore[return-value]

        monkeypatch.setattr(store._watcher, "read_state", read_then_compact)
        got: list[tuple[EventKind, str, bytes | None]] = []
        async with contextlib.aclosing(store.watch("d/", prefix=True)) as events, asyncio.timeout(WAIT_S):
            while len(got) < 5:
                event = await anext(events)
                got.append((event.kind, event.key, event.value))
            await other.set("d/k", b"3", expected_version=(await other.get("d/k")).version)
            event = await anext(events)
            got.append((event.kind, event.key, event.value))
        assert got == [
            (EventKind.PUT, "d/gone", b"0"),
            (EventKind.PUT, "d/k", b"0"),
            (EventKind.SYNCED, "", None),
            (EventKind.DELETE, "d/gone", None),  # re-sync: the difference to the current state
            (EventKind.PUT, "d/k", b"2"),
            (EventKind.PUT, "d/k", b"3"),  # and the watch goes on from there
        ]
        assert reads == 2


def test_a_new_cluster_moves_to_other_ports_when_one_was_taken(tmp_path: Path) -> None:
    cluster = EtcdCluster(tmp_path, 1)
    taken = cluster.endpoints[0][1]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        cluster.start(timeout_s=30.0)
    try:
        assert cluster.endpoints[0][1] != taken
        assert cluster.uri("x") == f"etcd://127.0.0.1:{cluster.endpoints[0][1]}/x"
        assert cluster.members[0].running
    finally:
        cluster.stop()
    assert not cluster.members[0].running
