"""ZooKeeper-specific tests: the embedded ensemble and the zk:// driver under faults.

The cross-backend contract suite (test_meta_contract*.py) covers the operations;
these cover what only ZooKeeper has: process lifecycle, session expiry through a
second client with the same session id and password, watches across a dropped
connection, losing one member of three, containers standing in for parents.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from scriba.embedded.process import free_port, port_open
from scriba.embedded.zookeeper import ZooKeeperEnsemble, four_letter_word
from scriba.errors import (
    BadRequestError,
    BadVersionError,
    ConfigError,
    KeyExistsError,
    MetadataUnavailableError,
    NoSuchKeyError,
)
from scriba.meta import connect
from scriba.meta.store import Check, EventKind, MetadataStore, Put, SessionState, WatchEvent
from scriba.meta.zookeeper import ZooKeeperStore
from scriba.testing.waiting import eventually

SESSION_TIMEOUT_S = 4.0
CONNECT_TIMEOUT_S = 5.0
WAIT_S = 30.0


@pytest.fixture
def zk1(zk1_server: ZooKeeperEnsemble) -> ZooKeeperEnsemble:
    """The session-wide standalone server of tests/meta/conftest.py (the contract suite's)."""
    return zk1_server


@pytest.fixture
def zk3(zk3_server: ZooKeeperEnsemble) -> ZooKeeperEnsemble:
    """The session-wide 3-node ensemble of tests/meta/conftest.py; tests restart what they kill."""
    assert all(m.running for m in zk3_server.members), "a previous test left a member down"
    return zk3_server


_prefix_seq = iter(range(1_000_000))


def _fresh(ensemble: ZooKeeperEnsemble) -> str:
    """A URI with a chroot no other test uses."""
    return ensemble.uri(f"t{os.getpid()}-{next(_prefix_seq)}")


def _on_members(ensemble: ZooKeeperEnsemble, uri: str, members: list[int]) -> str:
    """``uri``'s chroot, reached through only some members."""
    hosts = ",".join(f"{h}:{p}" for i, (h, p) in enumerate(ensemble.endpoints) if i in members)
    return f"zk://{hosts}/{uri.rsplit('/', 1)[1]}"


async def _open(uri: str, session_timeout_s: float = SESSION_TIMEOUT_S) -> ZooKeeperStore:
    return await ZooKeeperStore.open(
        uri, connect_timeout_s=CONNECT_TIMEOUT_S, session_timeout_s=session_timeout_s
    )


async def _eventually(
    what: str, check: Callable[[], Awaitable[bool]], timeout_s: float = WAIT_S
) -> None:
    """:func:`eventually`, with the store's unavailability counting as "not yet"."""

    async def held() -> bool:
        try:
            return await check()
        except MetadataUnavailableError:
            return False

    await eventually(held, timeout_s, what=what, interval_s=0.05)


async def _create_retrying(store: MetadataStore, key: str, value: bytes) -> None:
    """Create through member failures: an in-flight write may fail with an unknown outcome."""
    deadline = time.monotonic() + WAIT_S
    retried = False
    while True:
        try:
            await store.create(key, value)
            return
        except KeyExistsError:
            if retried and (await store.get(key)).value == value:
                return  # the attempt that "failed" had been applied
            raise
        except MetadataUnavailableError:
            if time.monotonic() >= deadline:
                raise
            retried = True
            await asyncio.sleep(0.05)  # retry pacing, not synchronisation


class _Collector:
    """Consumes a watch in a task; applies events to a dict like a cache would."""

    def __init__(self, events: AsyncIterator[WatchEvent]) -> None:
        self.events: list[WatchEvent] = []
        self.state: dict[str, bytes] = {}
        self.versions: dict[str, int] = {}
        self.synced = asyncio.Event()
        self._iter = events
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for event in self._iter:
            self.events.append(event)
            if event.kind is EventKind.SYNCED:
                self.synced.set()
            elif event.kind is EventKind.PUT:
                assert event.value is not None
                self.state[event.key] = event.value
                self.versions[event.key] = event.version
            else:
                self.state.pop(event.key, None)
                self.versions.pop(event.key, None)

    async def close(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


def _connected_member(ensemble: ZooKeeperEnsemble, store: ZooKeeperStore) -> int:
    """The member ``store``'s session is connected to (``cons`` lists each connection's session id)."""
    session_id = int(store.session.session_id, 16)
    found = []
    for i, (host, port) in enumerate(ensemble.endpoints):
        if ensemble.members[i].running:
            text = four_letter_word(host, port, "cons")
            if any(int(sid, 16) == session_id for sid in re.findall(r"sid=0x([0-9a-f]+)", text)):
                found.append(i)
    assert len(found) == 1, f"expected session {session_id:x} on exactly one member, found {found}"
    return found[0]


# --- the embedded ensemble ------------------------------------------------------------


def test_zk_ensemble_start_stop_leaves_no_process(tmp_path: Path) -> None:
    ensemble = ZooKeeperEnsemble(tmp_path, members=1)
    started = time.monotonic()
    ensemble.start(timeout_s=WAIT_S)
    elapsed_s = time.monotonic() - started
    pids = [m.pid for m in ensemble.members]
    try:
        assert ensemble.mode(0) == "standalone"
        assert "imok" in four_letter_word(*ensemble.endpoints[0], "ruok")
        assert ensemble.uri("x") == f"zk://127.0.0.1:{ensemble.endpoints[0][1]}/x"
        assert elapsed_s < WAIT_S
    finally:
        ensemble.stop()
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not port_open(*ensemble.endpoints[0])
    assert "binding to port" in ensemble.members[0].log_path.read_text()  # the log reached its file


def test_zk_missing_jars_say_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scriba.embedded import zookeeper as embedded

    assert (
        "zookeeper" in embedded.find_zookeeper_classpath()
    )  # the Debian package is installed here
    monkeypatch.delenv("ZOOKEEPER_HOME", raising=False)
    monkeypatch.setattr(embedded, "_JAR_DIRS", (str(tmp_path),))
    monkeypatch.setattr(embedded, "_TARBALL_LIBS", (str(tmp_path / "lib"),))
    with pytest.raises(ConfigError, match="apt-get install zookeeper"):
        embedded.find_zookeeper_classpath()
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "zookeeper-3.9.9.jar").write_bytes(b"")
    (tmp_path / "lib" / "slf4j-api-1.7.jar").write_bytes(b"")
    monkeypatch.setenv("ZOOKEEPER_HOME", str(tmp_path))
    assert embedded.find_zookeeper_classpath().split(":") == [
        str(tmp_path / "lib" / "slf4j-api-1.7.jar"),
        str(tmp_path / "lib" / "zookeeper-3.9.9.jar"),
    ]


def test_zk_three_members_have_one_leader(zk3: ZooKeeperEnsemble) -> None:
    modes = [zk3.mode(i) for i in range(3)]
    assert sorted(m or "" for m in modes) == ["follower", "follower", "leader"]
    assert zk3.uri("p").count(",") == 2


def test_zk_start_member_refuses_a_running_member(zk1: ZooKeeperEnsemble) -> None:
    from scriba.embedded.process import ServerStartError

    with pytest.raises(ServerStartError, match="still running"):
        zk1.start_member(0)


# --- driver basics that are ZooKeeper-specific ------------------------------------------


async def test_zk_parents_are_invisible_containers(zk1: ZooKeeperEnsemble) -> None:
    async with await _open(_fresh(zk1)) as store:
        await store.create("a/b/c", b"deep")
        with pytest.raises(NoSuchKeyError):
            await store.get("a/b")
        assert await store.list("") == []
        assert [k for k, _ in await store.list("a/b/")] == ["a/b/c"]
        # a record at a container's path, then deleted while it has a child: the child stays
        await store.create("a/b", b"mid")
        assert (await store.get("a/b")).value == b"mid"
        await store.delete("a/b")
        with pytest.raises(NoSuchKeyError):
            await store.get("a/b")
        assert (await store.get("a/b/c")).value == b"deep"
        # ZooKeeper cannot hold records under an ephemeral one: a clear error, not a crash
        await store.create("eph", b"e", ephemeral=True)
        with pytest.raises(BadRequestError, match="ephemeral"):
            await store.create("eph/child", b"c")


async def test_zk_chroot_is_created_and_isolates(zk1: ZooKeeperEnsemble) -> None:
    uri_a, uri_b = _fresh(zk1), _fresh(zk1)
    async with await connect(uri_a) as a, await connect(uri_b) as b:
        await a.create("k", b"a")
        with pytest.raises(NoSuchKeyError):
            await b.get("k")
        assert [k for k, _ in await a.list("")] == ["k"]


async def test_zk_unreachable_fails_in_bounded_time() -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(MetadataUnavailableError, match=f"127.0.0.1:{port}"):
        await connect(f"zk://127.0.0.1:{port}/x", connect_timeout_s=1.0)
    assert time.monotonic() - started < 3.0


async def test_zk_ids_start_above_those_of_the_older_epoch_scheme(zk1: ZooKeeperEnsemble) -> None:
    uri = _fresh(zk1)
    async with await _open(uri) as a, await _open(uri) as b:
        # The older scheme handed out (epoch << 31) | version of the znodes ids/<name>/<epoch>.
        await a.create("ids/ledger/0000000000", b"")
        version = 0
        for _ in range(3):
            version = await a.set("ids/ledger/0000000000", b"", expected_version=version)
        await a.create("ids/ledger/0000000002", b"")  # epochs 0..2 were opened
        ids = await asyncio.gather(*(s.allocate_id("ledger") for s in [a, b] * 6))
        assert len(set(ids)) == 12
        assert min(ids) >= 3 << 31  # above every id epoch 2 could have handed out
        assert all(0 < i < 1 << 63 for i in ids)
        assert await a.allocate_id("ledger") > max(ids[0::2])  # a store keeps to its newest range
        assert await a.allocate_id("other") == 1  # sequences are independent


async def test_zk_watch_converges_under_concurrent_writes(zk1: ZooKeeperEnsemble) -> None:
    uri = _fresh(zk1)
    rng = random.Random(20261122)
    async with await _open(uri) as writer, await _open(uri) as reader:
        collector = _Collector(reader.watch("r/", prefix=True))
        try:
            await asyncio.wait_for(collector.synced.wait(), WAIT_S)
            for _ in range(300):
                key = f"r/{rng.randrange(6)}"
                try:
                    current = await writer.get(key)
                except NoSuchKeyError:
                    await writer.create(key, rng.randbytes(8))
                    continue
                if rng.random() < 0.25:
                    await writer.delete(key, expected_version=current.version)
                else:
                    await writer.set(key, rng.randbytes(8), expected_version=current.version)
            expected = {k: v.value for k, v in await writer.list("r/")}

            async def caught_up() -> bool:
                return collector.state == expected

            await _eventually("the watcher's view equals the store", caught_up, 10.0)
        finally:
            await collector.close()
    # per key, versions only grow between a PUT and the next DELETE
    last: dict[str, int] = {}
    for event in collector.events:
        if event.kind is EventKind.PUT:
            assert event.version > last.get(event.key, -1), event
            last[event.key] = event.version
        elif event.kind is EventKind.DELETE:
            last.pop(event.key, None)


async def test_zk_silent_server_fails_in_bounded_time() -> None:
    """A peer that accepts TCP but never answers (a hung server) must not hang ``connect``."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes handshakes; nobody ever reads or replies
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(MetadataUnavailableError, match=f"127.0.0.1:{port}"):
            await connect(f"zk://127.0.0.1:{port}/x", connect_timeout_s=1.0)
        assert time.monotonic() - started < 3.0


async def test_zk_calls_to_a_hung_server_end_by_their_deadline(tmp_path: Path) -> None:
    with ZooKeeperEnsemble(tmp_path, members=1) as ensemble:
        store = await ZooKeeperStore.open(
            ensemble.uri("h"), connect_timeout_s=2.0, session_timeout_s=4.0
        )
        try:
            await store.create("k", b"v")
            ensemble.members[0].pause()
            calls: list[Callable[[], Awaitable[object]]] = [
                lambda: store.get("k"),
                lambda: store.set("k", b"w", expected_version=0),
            ]
            for call in calls:
                started = time.monotonic()
                with pytest.raises(MetadataUnavailableError, match=r"unavailable|no answer"):
                    await call()
                assert (
                    time.monotonic() - started < 2.0 + 1.5
                )  # op deadline (connect_timeout_s) + slack
            ensemble.members[0].resume()

            async def served() -> bool:
                return (await store.get("k")).value in (b"v", b"w")  # the set's outcome is unknown

            await _eventually("reads work again after SIGCONT", served)
        finally:
            ensemble.members[0].resume()
            await store.close()


async def test_zk_racing_txns_commit_exactly_once(zk1: ZooKeeperEnsemble) -> None:
    """Races decided inside ZooKeeper's multi (not by the pre-read) still give BadVersionError."""
    uri = _fresh(zk1)
    async with await _open(uri) as a, await _open(uri) as b:
        await a.create("n", b"0")

        async def increment(store: ZooKeeperStore, who: str, times: int) -> None:
            for i in range(times):
                while True:
                    current = await store.get("n")
                    try:
                        await store.txn(
                            [Check("n", current.version)],
                            [Put("n", b"%d" % (int(current.value) + 1)), Put(f"log/{who}{i}", b"")],
                        )
                        break
                    except BadVersionError:
                        continue

        await asyncio.gather(increment(a, "a", 30), increment(b, "b", 30), increment(a, "c", 30))
        assert (await a.get("n")).value == b"90"
        assert len(await a.list("log/")) == 90

        async def create_if_absent(store: ZooKeeperStore, key: str) -> bool:
            try:
                await store.txn([Check(key, None)], [Put(key, store.session.session_id.encode())])
            except BadVersionError:
                return False
            return True

        won = await asyncio.gather(
            *(create_if_absent(s, f"once/{i % 4}") for i in range(24) for s in (a, b))
        )
        assert sum(won) == 4
        assert len(await a.list("once/")) == 4


# --- sessions ---------------------------------------------------------------------------


async def test_zk_session_expiry_removes_ephemerals_and_reports_lost_then_connected(
    zk1: ZooKeeperEnsemble,
) -> None:
    uri = _fresh(zk1)
    async with await _open(uri) as holder, await _open(uri) as observer:
        await holder.create("bookies/available/b1", b"me", ephemeral=True)
        await holder.create("persistent", b"stays")
        assert (await observer.get("bookies/available/b1")).value == b"me"
        states: list[SessionState] = []
        holder.session.add_listener(states.append)
        old_id = holder.session.session_id
        collector = _Collector(holder.watch("bookies/available/", prefix=True))
        await asyncio.wait_for(collector.synced.wait(), WAIT_S)

        await holder.expire_session_for_test()

        assert states[-2:] == [SessionState.LOST, SessionState.CONNECTED], states
        assert holder.session.state is SessionState.CONNECTED
        assert holder.session.session_id != old_id
        assert observer.session.state is SessionState.CONNECTED  # only the holder's session ended
        with pytest.raises(NoSuchKeyError):
            await observer.get("bookies/available/b1")
        assert (await observer.get("persistent")).value == b"stays"
        # the new session can hold ephemerals again, and they go when it closes
        await holder.create("bookies/available/b1", b"again", ephemeral=True)
        assert (await observer.get("bookies/available/b1")).value == b"again"

        async def watch_saw_both() -> bool:  # the holder's own watch re-synced on the new session
            return collector.state == {"bookies/available/b1": b"again"}

        await _eventually("the watch follows the ephemeral across the expiry", watch_saw_both, 10.0)
        await collector.close()
        kinds = [(e.kind, e.value) for e in collector.events if e.kind is not EventKind.SYNCED]
        assert kinds[0] == (EventKind.PUT, b"me") and kinds[-1] == (EventKind.PUT, b"again")
    async with await _open(uri) as later:
        with pytest.raises(NoSuchKeyError):
            await later.get("bookies/available/b1")


async def test_zk_close_removes_ephemerals_at_once(zk1: ZooKeeperEnsemble) -> None:
    uri = _fresh(zk1)
    async with await _open(uri) as observer:
        holder = await _open(uri)
        await holder.create("e", b"x", ephemeral=True)
        await holder.close()
        with pytest.raises(NoSuchKeyError):  # close ends the session: no wait for a timeout
            await observer.get("e")


# --- failures of ensemble members ---------------------------------------------------------


async def test_zk_watch_survives_losing_its_member(zk3: ZooKeeperEnsemble) -> None:
    chroot_uri = _fresh(zk3)
    watcher_store = await _open(chroot_uri)
    try:
        victim = _connected_member(zk3, watcher_store)
        others = [i for i in range(3) if i != victim]
        writer = await _open(_on_members(zk3, chroot_uri, others))
        states: list[SessionState] = []
        watcher_store.session.add_listener(states.append)
        session_id = watcher_store.session.session_id
        collector = _Collector(watcher_store.watch("w/", prefix=True))
        try:
            await asyncio.wait_for(collector.synced.wait(), WAIT_S)
            for i in range(20):
                await writer.create(f"w/{i:03d}", b"before")
            zk3.kill_member(victim)  # if it led, the others elect a new leader meanwhile
            for i in range(20, 40):  # written while the watcher reconnects elsewhere
                await _create_retrying(writer, f"w/{i:03d}", b"during")
            await _create_retrying(writer, "w/changed", b"0")

            async def update_and_delete() -> bool:
                current = await writer.get("w/changed")
                if current.value == b"0":
                    await writer.set("w/changed", b"1", expected_version=current.version)
                if "w/001" in {k for k, _ in await writer.list("w/")}:
                    await writer.delete("w/001")
                return True

            await _eventually("an update and a delete", update_and_delete)
            zk3.start_member(victim, timeout_s=WAIT_S)
            for i in range(40, 50):
                await _create_retrying(writer, f"w/{i:03d}", b"after")
            expected = {k: v.value for k, v in await writer.list("w/")}
            assert len(expected) == 50 and expected["w/changed"] == b"1"

            async def caught_up() -> bool:
                return collector.state == expected

            await _eventually("the watcher's view equals the store", caught_up)
            puts = [e.key for e in collector.events if e.kind is EventKind.PUT]
            assert set(puts) >= {f"w/{i:03d}" for i in range(50)}  # every create was delivered
            assert collector.versions["w/changed"] == 1
            assert SessionState.SUSPENDED in states and states[-1] is SessionState.CONNECTED
            assert (
                watcher_store.session.session_id == session_id
            )  # the session survived the failover
        finally:
            await collector.close()
            await writer.close()
    finally:
        await watcher_store.close()
        for i, member in enumerate(zk3.members):
            if not member.running:
                zk3.start_member(i, timeout_s=WAIT_S)


async def test_zk_store_keeps_serving_after_leader_is_killed(zk3: ZooKeeperEnsemble) -> None:
    store: MetadataStore = await _open(_fresh(zk3))
    leader = [zk3.mode(i) for i in range(3)].index("leader")
    try:
        await store.create("k", b"0")
        zk3.kill_member(leader)
        versions: list[int] = []

        async def write_succeeds() -> bool:
            current = await store.get("k")
            versions.append(await store.set("k", b"1", expected_version=current.version))
            return True

        started = time.monotonic()
        await _eventually("a write after the leader died", write_succeeds)
        recovered_s = time.monotonic() - started
        for i in range(10):  # and keeps serving
            await store.create(f"after/{i}", b"x")
        assert len(await store.list("after/")) == 10
        assert (await store.get("k")).value == b"1"
        assert recovered_s < WAIT_S
        assert sorted(m or "" for m in (zk3.mode(i) for i in range(3) if i != leader)) == [
            "follower",
            "leader",
        ]
    finally:
        await store.close()
        if not zk3.members[leader].running:
            zk3.start_member(leader, timeout_s=WAIT_S)
    assert all(zk3.mode(i) is not None for i in range(3))


async def test_zk_paused_member_is_left_for_another(zk3: ZooKeeperEnsemble) -> None:
    """SIGSTOP: the connection hangs silently (no RST); kazoo's read timeout must move us on."""
    followers = [i for i in range(3) if zk3.mode(i) == "follower"]
    chroot_uri = _fresh(zk3)
    store = await _open(_on_members(zk3, chroot_uri, followers))
    observer = await _open(chroot_uri)
    paused = _connected_member(zk3, store)
    collector = _Collector(observer.watch("p/", prefix=True))
    states: list[SessionState] = []
    store.session.add_listener(states.append)
    try:
        await asyncio.wait_for(collector.synced.wait(), WAIT_S)
        zk3.members[paused].pause()
        started = time.monotonic()
        outcomes: list[str] = []

        async def write_succeeds() -> bool:
            t0 = time.monotonic()
            try:
                await _create_retrying(store, f"p/{len(outcomes)}", b"x")
            finally:  # every attempt ends (ok or a clear error) within its deadline: nothing hangs
                outcomes.append(f"{time.monotonic() - t0:.1f}s")
            return True

        await _eventually("a write while a member is paused", write_succeeds)
        recovered_s = time.monotonic() - started
        assert SessionState.SUSPENDED in states and store.session.state is SessionState.CONNECTED
        assert _connected_member(zk3, store) != paused
        expected = {k: v.value for k, v in await store.list("p/")}

        async def seen() -> bool:
            return collector.state == expected

        await _eventually("the observer saw the writes", seen)
        assert recovered_s < WAIT_S, outcomes
    finally:
        zk3.members[paused].resume()
        await collector.close()
        await store.close()
        await observer.close()

