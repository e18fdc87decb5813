"""A bookie whose metadata steps fail at start-up for a while still comes up, and registers once.

The core (``meta/startup.py``'s verdicts, ``bookie/registration.py``'s owner rule) is
tested alone on a manual clock. The rest runs against real etcd and ZooKeeper servers
started by this module: an in-process bookie whose store (a real one) is wrapped to fail
its first registration attempts; the failure seen on a loaded machine reproduced through
the fault proxy (ZooKeeper applies the create, its answer is held, kazoo drops the
connection: ConnectionLoss); and a bookie process started while the metadata server is
stopped with SIGSTOP, which comes up once the server is continued with SIGCONT.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scriba.bookie.config import BookieConfig
from scriba.bookie.cookie import write_dir_cookie
from scriba.bookie.memory_storage import InMemoryLedgerStorage
from scriba.bookie.registration import Existing, existing_registration
from scriba.bookie.server import Bookie
from scriba.bookie.storage_api import LedgerStorage, StorageConfig
from scriba.clock import ManualClock
from scriba.embedded.bookie import BookieProcess
from scriba.embedded.process import ServerStartError, wait_until
from scriba.errors import (
    BadRequestError,
    ConfigError,
    CookieMismatchError,
    DeadlineExceededError,
    KeyExistsError,
    MetadataUnavailableError,
    NoSuchKeyError,
    SessionExpiredError,
    StorageError,
    UnauthorizedError,
)
from scriba.meta import connect
from scriba.meta.records import BookieRegistration, Cookie, bookie_key, cookie_key
from scriba.meta.session import BasicSession
from scriba.meta.startup import StartVerdict, retry_start_step, start_verdict
from scriba.meta.store import MetadataStore, SessionState, Versioned
from scriba.testing.faults import FaultProxyConfig, ToxiproxyServer, toxiproxy_client

pytestmark = [pytest.mark.timeout(180)]

SESSION_TIMEOUT_S = 2.0
WAIT_S = 30.0

# --- the core: verdicts and the owner rule (no I/O) ---------------------------------------


@pytest.mark.parametrize(
    ("error", "verdict"),
    [
        (MetadataUnavailableError("ConnectionLoss"), StartVerdict.RETRY),
        (DeadlineExceededError("late"), StartVerdict.RETRY),
        (TimeoutError(), StartVerdict.RETRY),
        (SessionExpiredError("lease expired"), StartVerdict.RENEW),
        (CookieMismatchError("swapped disk"), StartVerdict.FAIL),
        (ConfigError("bad uri"), StartVerdict.FAIL),
        (UnauthorizedError("wrong password"), StartVerdict.FAIL),
        (StorageError("LOCK held"), StartVerdict.FAIL),
        (BadRequestError("parent is ephemeral"), StartVerdict.FAIL),
        (KeyExistsError("exists"), StartVerdict.FAIL),
        (ValueError("a bug"), StartVerdict.FAIL),
    ],
)
def test_start_verdict_retries_only_lost_connections_sessions_and_deadlines(
    error: BaseException, verdict: StartVerdict
) -> None:
    assert start_verdict(error) is verdict


def test_a_registration_is_ours_only_when_our_session_owns_it() -> None:
    assert existing_registration("1a2b", "1a2b") is Existing.OURS
    assert existing_registration("1a2b", "9f00") is Existing.STALE  # an earlier incarnation's
    assert existing_registration("", "9f00") is Existing.STALE  # a persistent record: not ours
    assert existing_registration("", "") is Existing.STALE


class Script:
    """A start-up step that raises the listed errors in turn, then returns ``"up"``."""

    def __init__(self, errors: list[BaseException]) -> None:
        self.errors = list(errors)
        self.clock = ManualClock()
        self.calls = 0

    async def call(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "up"

    async def sleep(self, seconds: float) -> None:
        self.clock.advance(seconds)

    async def run(self, timeout_s: float = 30.0, session: BasicSession | None = None) -> str:
        return await retry_start_step(
            "registration", self.call, owner="bookie b1", timeout_s=timeout_s, clock=self.clock, sleep=self.sleep,
            session=(lambda: session) if session is not None else None,  # type: ignore[arg-type,return-value]
        )


async def test_retriable_failures_are_retried_until_the_step_succeeds() -> None:
    s = Script([MetadataUnavailableError("ConnectionLoss"), TimeoutError(), MetadataUnavailableError("again")])
    assert await s.run() == "up"
    assert s.calls == 4


async def test_a_non_retriable_failure_ends_the_start_at_once_with_its_own_type() -> None:
    s = Script([MetadataUnavailableError("ConnectionLoss"), CookieMismatchError("swapped disk")])
    with pytest.raises(CookieMismatchError, match="swapped disk"):
        await s.run()
    assert s.calls == 2  # nothing after the refusal


async def test_the_time_bound_ends_retries_with_a_typed_error_naming_the_last_cause() -> None:
    s = Script([MetadataUnavailableError(f"ConnectionLoss {i}") for i in range(10_000)])
    with pytest.raises(MetadataUnavailableError) as caught:
        await s.run(timeout_s=5.0)
    message = str(caught.value)
    assert "registration still failing at the end of its 5s bound" in message and f"{s.calls} attempts" in message
    assert f"last error: MetadataUnavailableError: ConnectionLoss {s.calls - 1}" in message
    assert isinstance(caught.value.__cause__, MetadataUnavailableError)
    assert s.calls >= 3
    assert s.clock.monotonic() < 5.0  # no attempt started past the bound


async def test_an_expired_session_is_retried_once_a_new_session_is_connected() -> None:
    session = BasicSession("s1")
    session.set_state(SessionState.LOST)
    s = Script([SessionExpiredError("lease expired")])
    seen: list[tuple[SessionState, str]] = []
    call = s.call

    async def noting() -> str:
        seen.append((session.state, session.session_id))
        return await call()

    s.call = noting  # type: ignore[method-assign]
    asyncio.get_running_loop().call_later(0.05, session.renew, "s2")  # the driver's new session
    assert await s.run(session=session) == "up"
    assert seen == [(SessionState.CONNECTED, "s2")] * 2  # no attempt without a connected session


async def test_a_session_that_stays_lost_ends_the_start_at_the_bound() -> None:
    session = BasicSession("s1")
    session.set_state(SessionState.LOST)
    s = Script([])
    with pytest.raises(MetadataUnavailableError, match="session still lost"):
        await retry_start_step("cookie check", s.call, owner="bookie b1", timeout_s=0.2, session=lambda: session)
    assert s.calls == 0  # never tried without a session


# --- real servers: an in-process bookie on a wrapped real store -----------------------------


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from scriba.embedded.etcd import EtcdCluster

    with EtcdCluster(tmp_path_factory.mktemp("etcd-start"), 1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from scriba.embedded.zookeeper import ZooKeeperEnsemble

    cluster = ZooKeeperEnsemble(tmp_path_factory.mktemp("zk-start"), 1)
    cluster.start(timeout_s=60.0)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["etcd", "zk"])
def server(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_server")


@pytest.fixture
def uri(server: Any) -> str:
    return str(server.uri(f"t{uuid.uuid4().hex[:12]}"))


class FlakyStore:
    """A real store whose first ``fail`` registration creates fail as ``mode`` says.

    ``before``: the create is not sent. ``lost``: it is applied, then its answer is lost.
    ``expire``: the session is expired on the server, then the create fails with it.
    ``refuse``: the server refuses it (a non-retriable error). ``fault``: ``self.fault``
    sends it under a real fault of the test's making."""

    def __init__(self, inner: MetadataStore, *, fail: int, mode: str) -> None:
        self.inner = inner
        self.fail = fail
        self.mode = mode
        self.fault: Callable[[Callable[[], Awaitable[int]]], Awaitable[int]] | None = None  # mode "fault"
        self.creates = 0
        self.deletes = 0
        self.cookie_reads = 0
        self.lost_created: int | None = None  # ``created`` of the record a lost create made

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get(self, key: str) -> Any:
        if key.startswith("bookies/cookies/"):
            self.cookie_reads += 1
        return await self.inner.get(key)

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> int:
        if not key.startswith("bookies/available/"):
            return await self.inner.create(key, value, ephemeral=ephemeral)
        self.creates += 1
        if self.creates > self.fail:
            return await self.inner.create(key, value, ephemeral=ephemeral)
        if self.mode == "lost":
            await self.inner.create(key, value, ephemeral=ephemeral)
            self.lost_created = (await self.inner.get(key)).created
            raise MetadataUnavailableError(f"create {key}: ConnectionLoss (outcome unknown)")
        if self.mode == "expire":
            await self.inner.expire_session_for_test()  # type: ignore[attr-defined]
            raise SessionExpiredError(f"create {key}: lease expired")
        if self.mode == "fault" and self.fault is not None:
            return await self.fault(lambda: self.inner.create(key, value, ephemeral=ephemeral))
        if self.mode == "refuse":
            raise UnauthorizedError(f"create {key}: not allowed")
        raise MetadataUnavailableError(f"create {key}: outstanding heartbeat ping not received")

    async def delete(self, key: str, *, expected_version: int | None = None) -> None:
        if key.startswith("bookies/available/"):
            self.deletes += 1
        await self.inner.delete(key, expected_version=expected_version)


@pytest.fixture
async def open_store(uri: str) -> AsyncIterator[Callable[[], Awaitable[MetadataStore]]]:
    opened: list[MetadataStore] = []

    async def make() -> MetadataStore:
        store = await connect(uri, connect_timeout_s=10.0, session_timeout_s=SESSION_TIMEOUT_S)
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()


def config(uri: str, tmp_path: Path, **overrides: Any) -> BookieConfig:
    return BookieConfig(metadata_uri=uri, data_dir=tmp_path / "data", listen_port=0, bookie_id="b1",
                        metadata_session_timeout_s=SESSION_TIMEOUT_S, **overrides)


async def memory_storage(_: StorageConfig) -> LedgerStorage:
    return InMemoryLedgerStorage()


async def start(cfg: BookieConfig, store: FlakyStore) -> Bookie:
    bookie = Bookie(cfg, storage_factory=memory_storage, store=store)  # type: ignore[arg-type]
    await bookie.start()
    return bookie


async def registered(bookie: Bookie, flaky: FlakyStore, observer: MetadataStore) -> Versioned[bytes]:
    """The bookie's record, as another client reads it, checked to be the bookie's own:
    it advertises the bookie's address, the bookie's session holds it, the bookie takes adds."""
    record = await observer.get(bookie_key("b1"))
    assert BookieRegistration.from_bytes(record.value).address == bookie.address
    assert record.owner == flaky.inner.session.session_id
    assert bookie.registration is not None and bookie.registration.registered and bookie.state.accepting_adds
    return record


@pytest.mark.parametrize("mode", ["before", "lost"])
async def test_a_bookie_whose_first_registrations_fail_comes_up_and_registers_once(
    uri: str, tmp_path: Path, open_store: Callable[[], Awaitable[MetadataStore]], mode: str
) -> None:
    flaky = FlakyStore(await open_store(), fail=3, mode=mode)
    bookie = await start(config(uri, tmp_path), flaky)
    try:
        record = await registered(bookie, flaky, await open_store())
        assert flaky.creates == (4 if mode == "before" else 2)  # a lost create is found at once
        assert flaky.deletes == 0, "our own record was deleted and created again"
        if mode == "lost":
            assert record.created == flaky.lost_created, "registered twice: the record was re-created"
    finally:
        await bookie.stop()
    assert flaky.deletes == 1  # the clean stop's deregistration, nothing before it


async def test_a_registration_create_whose_answer_zookeeper_never_sent_is_kept_not_made_twice(
    zk_server: Any, tmp_path: Path
) -> None:
    """The failure seen on a loaded machine, for real: the create reaches ZooKeeper and is
    applied, its answer (and the pings') is held by the fault proxy, kazoo gives up on the
    connection ("outstanding heartbeat ping not received") and the create fails with
    ConnectionLoss. The session survives (the client's pings still arrive), the bookie
    retries, finds the record its own session created, and keeps it."""
    host, port = zk_server.endpoints[0]
    prefix = f"t{uuid.uuid4().hex[:12]}"
    with ToxiproxyServer(config=FaultProxyConfig(seed=7)) as proxy_server:
        proxy = toxiproxy_client(proxy_server.url).create(upstream=f"{host}:{port}", name="zk-answers")
        via_proxy = await connect(f"zk://{proxy.listen}/{prefix}", connect_timeout_s=10.0, session_timeout_s=6.0)
        observer = await connect(zk_server.uri(prefix), connect_timeout_s=10.0, session_timeout_s=10.0)
        await observer.create("bookies/available/parent", b"")  # the parent exists: one request, one answer
        await observer.delete("bookies/available/parent")
        flaky = FlakyStore(via_proxy, fail=1, mode="fault")
        lost: list[tuple[BaseException, int, str]] = []

        async def answer_lost(create: Callable[[], Awaitable[int]]) -> int:
            await asyncio.to_thread(proxy.add_toxic, type="timeout", stream="downstream",
                                    attributes={"timeout": 0}, name="hold_answers")
            try:
                return await create()
            except MetadataUnavailableError as exc:
                record = await observer.get(bookie_key("b1"))  # applied, though unanswered
                lost.append((exc, record.created, record.owner))
                raise
            finally:
                await asyncio.to_thread(proxy.destroy_toxic, "hold_answers")

        flaky.fault = answer_lost
        try:
            bookie = await start(config("zk://unused/x", tmp_path), flaky)
            try:
                assert len(lost) == 1, "the held answer did not fail the create"
                error, created, owner = lost[0]
                assert "ConnectionLoss" in str(error) or "ConnectionDropped" in str(error), error
                assert owner == via_proxy.session.session_id  # same session after the reconnect
                record = await registered(bookie, flaky, observer)
                assert (record.created, record.owner) == (created, owner), "registered twice"
                assert (flaky.creates, flaky.deletes) == (2, 0)
            finally:
                await bookie.stop()
        finally:
            await observer.close()
            await via_proxy.close()


async def test_a_registration_under_a_lease_etcd_has_expired_is_made_under_the_new_lease(
    etcd_server: Any, tmp_path: Path
) -> None:
    """The etcd failure seen on a loaded machine, for real: the bookie's lease is gone on the
    server (revoked here, as expiry would) before its registration is written; etcd refuses
    the create ("requested lease not found"), the driver grants a new lease, the bookie
    retries under it."""
    uri = etcd_server.uri(f"t{uuid.uuid4().hex[:12]}")
    async with contextlib.AsyncExitStack() as stores:
        inner = await stores.enter_async_context(await connect(uri, session_timeout_s=SESSION_TIMEOUT_S))
        observer = await stores.enter_async_context(await connect(uri, session_timeout_s=SESSION_TIMEOUT_S))
        await registered_under_a_new_lease(etcd_server, tmp_path, inner, observer)


async def registered_under_a_new_lease(
    etcd_server: Any, tmp_path: Path, inner: MetadataStore, observer: MetadataStore
) -> None:
    old_lease = inner.session.session_id
    flaky = FlakyStore(inner, fail=1, mode="fault")
    refused: list[BaseException] = []

    async def lease_gone(create: Callable[[], Awaitable[int]]) -> int:
        host, port = etcd_server.endpoints[0]
        done = await asyncio.to_thread(subprocess.run, ["etcdctl", f"--endpoints={host}:{port}", "lease", "revoke",
                                                        old_lease], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        try:
            return await create()
        except SessionExpiredError as exc:
            refused.append(exc)
            raise

    flaky.fault = lease_gone
    bookie = await start(config("etcd://unused/x", tmp_path), flaky)
    try:
        assert len(refused) == 1 and "lease" in str(refused[0]), refused
        assert (await registered(bookie, flaky, observer)).owner != old_lease
        assert (flaky.creates, flaky.deletes) == (2, 0)
    finally:
        await bookie.stop()


async def test_a_registration_lost_with_its_session_is_made_under_the_new_session(
    uri: str, tmp_path: Path, open_store: Callable[[], Awaitable[MetadataStore]]
) -> None:
    """etcd's lease (ZooKeeper's session) expires before the registration is written."""
    inner = await open_store()
    old_session = inner.session.session_id
    flaky = FlakyStore(inner, fail=1, mode="expire")
    bookie = await start(config(uri, tmp_path), flaky)
    try:
        assert (await registered(bookie, flaky, await open_store())).owner != old_session
        assert flaky.deletes == 0
    finally:
        await bookie.stop()


async def test_an_earlier_incarnations_registration_is_replaced_once(
    uri: str, tmp_path: Path, open_store: Callable[[], Awaitable[MetadataStore]]
) -> None:
    """A record of another session (a bookie killed before its session expired) is not ours."""
    killed = await open_store()
    await killed.create(bookie_key("b1"), b"left by the killed incarnation", ephemeral=True)
    flaky = FlakyStore(await open_store(), fail=0, mode="before")
    bookie = await start(config(uri, tmp_path), flaky)
    try:
        assert (await registered(bookie, flaky, killed)).owner != killed.session.session_id
        assert (flaky.creates, flaky.deletes) == (2, 1)
    finally:
        await bookie.stop()


async def test_a_second_bookie_with_the_same_id_fails_at_once_and_leaves_the_first_registered(
    uri: str, tmp_path: Path, open_store: Callable[[], Awaitable[MetadataStore]]
) -> None:
    """Another live bookie of this id is refused before registration: on the same dirs by
    their LOCK (StorageError), on other dirs by the cookie (CookieMismatchError)."""
    first = Bookie(config(uri, tmp_path))  # disk storage: holds the dirs' LOCK
    await first.start()
    try:
        observer = await open_store()
        before = await observer.get(bookie_key("b1"))
        same_dirs = Bookie(config(uri, tmp_path))
        with pytest.raises(StorageError, match="LOCK held"):
            await same_dirs.start()
        other_dirs = Bookie(config(uri, tmp_path / "other"))
        with pytest.raises(CookieMismatchError, match="is registered with instance"):
            await other_dirs.start()
        after = await observer.get(bookie_key("b1"))
        assert (after.created, after.owner) == (before.created, before.owner)  # the first's, untouched
        assert first.registration is not None and first.registration.registered
    finally:
        await first.stop()


async def test_a_refused_registration_fails_the_start_at_once_with_its_type(
    uri: str, tmp_path: Path, open_store: Callable[[], Awaitable[MetadataStore]]
) -> None:
    flaky = FlakyStore(await open_store(), fail=1, mode="refuse")
    bookie = Bookie(config(uri, tmp_path), storage_factory=memory_storage, store=flaky)  # type: ignore[arg-type]
    with pytest.raises(UnauthorizedError, match="not allowed"):
        await bookie.start()
    assert flaky.creates == 1  # not retried
    with pytest.raises(NoSuchKeyError):
        await flaky.inner.get(bookie_key("b1"))


async def test_a_cookie_mismatch_fails_the_start_at_once(
    uri: str, tmp_path: Path, open_store: Callable[[], Awaitable[MetadataStore]]
) -> None:
    flaky = FlakyStore(await open_store(), fail=0, mode="before")
    await flaky.inner.create(cookie_key("b1"), Cookie("b1", "instance-a", (), ()).to_bytes())  # type: ignore[arg-type]
    write_dir_cookie(tmp_path / "data", Cookie("b1", "instance-b", (), ()))  # type: ignore[arg-type]
    bookie = Bookie(config(uri, tmp_path), storage_factory=memory_storage, store=flaky)  # type: ignore[arg-type]
    with pytest.raises(CookieMismatchError, match="instance-b"):
        await bookie.start()
    assert flaky.cookie_reads == 1 and flaky.creates == 0


async def test_a_registration_that_keeps_failing_gives_up_at_the_bound_naming_the_cause(
    uri: str, tmp_path: Path, open_store: Callable[[], Awaitable[MetadataStore]]
) -> None:
    flaky = FlakyStore(await open_store(), fail=10_000, mode="before")
    bookie = Bookie(config(uri, tmp_path, metadata_start_timeout_s=1.0), storage_factory=memory_storage,
                    store=flaky)  # type: ignore[arg-type]
    with pytest.raises(MetadataUnavailableError) as caught:
        await bookie.start()
    assert "bookie b1: registration still failing at the end of its 1s bound" in str(caught.value)
    assert "outstanding heartbeat ping not received" in str(caught.value)
    assert isinstance(caught.value.__cause__, MetadataUnavailableError)
    assert flaky.creates >= 2
    with pytest.raises(NoSuchKeyError):
        await flaky.inner.get(bookie_key("b1"))
    await bookie.stop()  # already closed by the failed start: a no-op


def test_config_refuses_a_start_timeout_that_is_not_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="metadata_start_timeout_s"):
        config("memory://x", tmp_path, metadata_start_timeout_s=0).validate()


# --- a real bookie process against a stopped (SIGSTOP) metadata server ----------------------


@contextlib.contextmanager
def starting_while_stopped(member: Any, bookie: BookieProcess) -> Iterator[concurrent.futures.Future[None]]:
    """Start ``bookie`` while the metadata server ``member`` is stopped (SIGSTOP); yield the
    start (running in a thread) once the bookie has logged a retry; SIGCONT on the way out,
    then wait for the start to end (serving, or exited)."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    member.pause()
    try:
        starting = pool.submit(bookie.start, 150.0)
        wait_until(lambda: "bookie_start_retry" in _log(bookie) or starting.done(), WAIT_S,
                   what="the bookie retrying its connect while the server is stopped")
        assert bookie.running, bookie.log_tail()
        yield starting
    finally:
        member.resume()
        pool.shutdown(wait=True)


def test_a_bookie_started_while_the_metadata_server_is_stopped_comes_up_when_it_resumes(
    server: Any, uri: str, tmp_path: Path
) -> None:
    bookie = BookieProcess(tmp_path / "b", uri, bookie_id="paused-start",
                           extra_args=["--session-timeout-s", "2", "--start-timeout-s", "120"])
    try:
        with starting_while_stopped(server.members[0], bookie) as starting:
            pass
        starting.result()
        assert bookie.serving()
        assert any("bookie_start_retry" in line and "connect" in line for line in _log(bookie).splitlines())
    finally:
        bookie.stop()
    assert bookie.returncode == 0


def test_sigterm_ends_a_start_that_is_still_retrying(server: Any, uri: str, tmp_path: Path) -> None:
    """A start retrying for minutes must not outlive the SIGTERM that a supervisor sends."""
    bookie = BookieProcess(tmp_path / "b", uri, bookie_id="abandoned-start",
                           extra_args=["--start-timeout-s", "120"])
    with starting_while_stopped(server.members[0], bookie) as starting:
        bookie.stop(timeout_s=WAIT_S)  # SIGTERM; SIGKILL only if it does not exit by then
    with pytest.raises(ServerStartError, match="exited with 0 before it was ready"):
        starting.result()
    assert bookie.returncode == 0, bookie.log_tail()  # exited on SIGTERM, not killed
    assert "bookie_start_abandoned" in _log(bookie)


def _log(bookie: BookieProcess) -> str:
    try:
        return bookie.log_path.read_text(errors="replace")
    except OSError:
        return ""
