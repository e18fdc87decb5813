"""``zk://HOST:PORT[,...]/CHROOT``: the metadata store on ZooKeeper, through kazoo.

Layout: key ``a/b`` is the znode ``/CHROOT/a/b``. Parent znodes that hold no record
(``/CHROOT``, ``/CHROOT/a``) are persistent *containers* whose data is
:data:`CONTAINER`; every operation treats a container as absent, so ``get("a")``
raises ``NoSuchKeyError`` and ``list("")`` does not show ``a`` (as on etcd and
memory). Deleting a record that has records under it turns it into a container.

Threads: kazoo runs its connection and its callbacks on its own threads. Every
result comes back to the event loop through ``loop.call_soon_threadsafe``; no call
here blocks the loop (kazoo's ``*_async`` calls only queue a request). Every wait
has a deadline (``op_timeout_s``).

Sessions: kazoo's CONNECTED / SUSPENDED / LOST become ``SessionState``. After LOST
kazoo opens a new session by itself; that is reported as CONNECTED with the new
``session_id`` (the hex session id).

Watches: ZooKeeper watches fire once and carry no data. A watch here re-reads what
fired (re-arming the watch in the same read), compares with what it has delivered
(version and czxid per key) and emits PUT / DELETE. After every reconnect it
re-reads everything it covers and diffs, so no change is missed; intermediate
versions may be coalesced, but per key the order and the last value are right.

Retries: reads retry connection drops within ``op_timeout_s`` through ``scriba.retry``.
The create / delete / parent and watch-arming loops stay hand-written: the store did
answer, and each pass takes the step that answer calls for (create the parent, turn a
container into a record, look again), so there is no error to back off from; they are
bounded by ``WRITE_ATTEMPTS_MAX``.

Writes: ``create`` and ``set`` go through ``scriba.meta.zk_multi``: the writes issued in
one loop tick travel as one ZooKeeper multi (one request, one answer, one hand-off
through kazoo's threads), and each caller still gets its own outcome, as if it had
sent its write alone.

Authentication (URI options ``digest_file=`` / ``digest_env=``, ``USER:PASSWORD``):
the session adds digest credentials, and every znode Scriba creates (the chroot, its
containers, records, ephemerals, transaction creates) gets one ACL: that digest user,
all permissions; nobody else, not even readers. A request the ACLs refuse is an
``UnauthorizedError`` (a wrong password shows as that: ZooKeeper accepts any digest
credentials and refuses at each znode). A chroot someone else created world-open is
logged (``zookeeper_chroot_world_open``): its ACL is not ours to change.

TLS (``zk+tls://``, ``ca=``, ``cert=``, ``key=``): kazoo dials the server's secure client
port and verifies its certificate and host name; ZooKeeper asks for a client
certificate by default (``ssl.clientAuth=need``). The Debian ZooKeeper 3.8 serves TLS
with ``serverCnxnFactory=NettyServerCnxnFactory``, PEM key and trust stores and the
Debian Netty jars on its classpath (``scriba.embedded.zookeeper`` does this).

Versions: ``version`` = stat.version, ``created`` = stat.czxid, ``owner`` = the hex
ephemeralOwner (the session id of an ephemeral's session). Ids: ranges reserved by
CAS on a counter record ``ids/<name>`` (``scriba.meta.id_ranges``); a counter created
where the older per-id epoch znodes ``ids/<name>/<epoch>`` exist starts above them.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar, cast

from kazoo import exceptions as kz
from kazoo.client import KazooClient
from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.protocol.states import KazooState, WatchedEvent, ZnodeStat
from kazoo.retry import KazooRetry
from kazoo.security import ACL, make_digest_acl

from scriba.errors import (
    BadRequestError,
    BadVersionError,
    ConfigError,
    InternalError,
    KeyExistsError,
    MetadataUnavailableError,
    NoSuchKeyError,
    SessionExpiredError,
    UnauthorizedError,
)
from scriba.invariant import invariant
from scriba.log import get_logger
from scriba.meta.credentials import secret
from scriba.meta.id_ranges import IdRanges
from scriba.meta.session import BasicSession
from scriba.meta.store import (
    Check,
    Delete,
    EventKind,
    Put,
    SessionState,
    Versioned,
    WatchEvent,
    check_key,
    check_prefix,
    check_value,
)
from scriba.meta.uri import MetadataUri, parse_uri
from scriba.meta.zk_multi import MultiWriter, WriteKind, ZkWrite
from scriba.retry import RetryPolicy, retry_async
from scriba.tls import TlsConfig

log = get_logger(__name__)

T = TypeVar("T")

CONTAINER: Final = b"\x00scriba-container\x00"
"""Data of a znode that only exists to hold records under it (treated as absent)."""

LIST_LIMIT_MAX: Final = 10_000
READS_INFLIGHT_MAX: Final = 64
WATCHES_MAX: Final = 4096
TXN_OPS_MAX: Final = 128
TXN_ATTEMPTS_MAX: Final = 16
WRITE_ATTEMPTS_MAX: Final = 8
CONTAINER_CACHE_MAX: Final = 10_000
RETRY_DELAY_S_MAX: Final = 0.5
READ_RETRY: Final = RetryPolicy(attempts_max=64, delay_s_min=0.02, delay_s_max=RETRY_DELAY_S_MAX).validate()
CLOSE_TIMEOUT_S: Final = 10.0
EXPIRE_TIMEOUT_S: Final = 30.0

_CONNECTIVITY_ERRORS = (
    kz.ConnectionLoss,
    kz.ConnectionClosedError,
    kz.SessionExpiredError,
    kz.SessionMovedError,
    kz.OperationTimeoutError,
    kz.ConnectionDropped,
    kz.ZookeeperStoppedError,
    kz.RequestTimeoutError,
)
_ROLLED_BACK = (kz.RolledBackError, kz.RuntimeInconsistency)

_Node = tuple[bytes, ZnodeStat]
_Nodes = list[_Node | None]
_Keys = set[str]
_Owners = list[Check | None]
_Listing = list[tuple[str, Versioned[bytes]]]
_Events = list[WatchEvent]


def _session_hex(session_id: int) -> str:
    return f"{session_id & 0xFFFFFFFFFFFFFFFF:016x}"


def _versioned(data: bytes, stat: ZnodeStat) -> Versioned[bytes]:
    owner = _session_hex(stat.ephemeralOwner) if stat.ephemeralOwner else ""
    return Versioned(data, stat.version, stat.czxid, owner)


def _connection_retry() -> KazooRetry:
    """Reconnect forever, quickly: the store reports SUSPENDED/LOST meanwhile."""
    return KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_jitter=0.05, max_delay=1.0)


def _run_in_thread(
    loop: asyncio.AbstractEventLoop, fn: Callable[[], T], name: str
) -> asyncio.Future[T]:
    """Run blocking kazoo housekeeping on a daemon thread; the result comes back to the loop."""
    fut: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if fut.done():
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def run() -> None:
        try:
            result: Any = fn()
            ok = True
        except BaseException as exc:
            result, ok = exc, False
        try:
            loop.call_soon_threadsafe(settle, ok, result)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    threading.Thread(target=run, name=name, daemon=True).start()
    return fut


def _set_once(fut: asyncio.Future[T], value: T) -> None:
    if not fut.done():
        fut.set_result(value)


def _stop_and_close(client: KazooClient) -> None:
    try:
        client.stop()
    finally:
        client.close()


class _Watch:
    """What one ``watch()`` covers, what fired since its last read, and what it delivered."""

    def __init__(self, key: str, prefix: bool, path: str) -> None:
        self.key = key  # a key, or a prefix ("" or "a/b/")
        self.prefix = prefix
        self.path = path  # the key's znode, or the prefix's parent znode
        self.dirty: set[str] = set()
        self.resync = True
        self.wake = asyncio.Event()
        self.delivered: dict[str, tuple[int, int]] = {}  # key -> (version, czxid)

    def notify(self, path: str) -> None:
        if path == self.path or (self.prefix and path.rpartition("/")[0] == self.path):
            self.dirty.add(path)
            self.wake.set()

    def notify_reconnect(self) -> None:
        self.resync = True
        self.wake.set()

    def diff(self, key: str, node: _Node | None) -> list[WatchEvent]:
        """Events that bring what was delivered for ``key`` up to ``node``."""
        old = self.delivered.get(key)
        if node is None or node[0] == CONTAINER:
            if old is None:
                return []
            del self.delivered[key]
            return [WatchEvent(EventKind.DELETE, key, None, old[0])]
        data, stat = node
        self.delivered[key] = (stat.version, stat.czxid)
        put = WatchEvent(EventKind.PUT, key, data, stat.version)
        if old is None:
            return [put]
        if old[1] != stat.czxid:  # deleted and created again in between
            return [WatchEvent(EventKind.DELETE, key, None, old[0]), put]
        if old[0] != stat.version:
            return [put]
        return []


class ZooKeeperStore:
    """One kazoo client (one ZooKeeper session); implements ``scriba.meta.store.MetadataStore``."""

    def __init__(
        self,
        parsed: MetadataUri,
        client: KazooClient,
        loop: asyncio.AbstractEventLoop,
        *,
        op_timeout_s: float,
        session_timeout_s: float,
    ) -> None:
        self.uri = parsed.text
        self.hosts = parsed.hosts_text
        self.root = "/" + parsed.path
        self.op_timeout_s = op_timeout_s
        self.session_timeout_s = session_timeout_s
        self._client = client
        self._loop = loop
        self._session: BasicSession | None = None
        self._watches: set[_Watch] = set()
        self._containers: set[str] = set()  # container znodes known to exist
        self._ids = IdRanges(self, floor=self._legacy_id_floor)
        self._writes = MultiWriter(
            loop, self._commit_one, self._commit_many, _ROLLED_BACK, self._write_error
        )
        self._closed = False

    # --- opening and the session ------------------------------------------------------

    @classmethod
    async def open(
        cls,
        parsed: MetadataUri | str,
        *,
        connect_timeout_s: float = 5.0,
        session_timeout_s: float = 10.0,
    ) -> ZooKeeperStore:
        """Connect within ``connect_timeout_s`` (else ``MetadataUnavailableError``) and create the chroot."""
        if isinstance(parsed, str):
            parsed = parse_uri(parsed)
        invariant(parsed.scheme == "zk", f"ZooKeeperStore cannot open {parsed.text!r}")
        loop = asyncio.get_running_loop()
        auth_data, acl = _digest_auth(parsed)
        client = KazooClient(
            hosts=parsed.hosts_text,
            timeout=session_timeout_s,
            connection_retry=_connection_retry(),
            randomize_hosts=True,
            logger=logging.getLogger("scriba.meta.zookeeper.kazoo"),
            auth_data=auth_data,
            default_acl=acl,
            **_tls_options(parsed),
        )
        store = cls(
            parsed,
            client,
            loop,
            op_timeout_s=connect_timeout_s,
            session_timeout_s=session_timeout_s,
        )
        connected: asyncio.Future[tuple[int, bytes]] = loop.create_future()

        def first_connect(state: str) -> bool:  # kazoo's connection thread
            if state != KazooState.CONNECTED:
                return False
            client_id = client.client_id
            if client_id is None:  # dropped again at once; wait for the next CONNECTED
                return False
            try:
                loop.call_soon_threadsafe(_set_once, connected, client_id)
            except RuntimeError:
                pass
            return True  # remove this listener

        client.add_listener(store._on_kazoo_state)
        client.add_listener(first_connect)
        client.start_async()
        try:
            client_id = await asyncio.wait_for(connected, connect_timeout_s)
        except BaseException as exc:  # the deadline, or the caller was cancelled
            store._closed = True
            _run_in_thread(loop, lambda: _stop_and_close(client), "scriba-zk-close")
            if isinstance(exc, TimeoutError):
                raise MetadataUnavailableError(
                    f"cannot connect to ZooKeeper at {parsed.hosts_text} within {connect_timeout_s:.1f}s"
                ) from None
            raise
        store._session = BasicSession(_session_hex(client_id[0]))
        if not client.connected:
            store._session.set_state(SessionState.SUSPENDED)
        try:
            await store._ensure_path(store.root)
            if auth_data:
                await store._check_root_acl()
        except BaseException:
            await store.close()
            raise
        log.info(
            "zookeeper_store_open",
            hosts=parsed.hosts_text,
            chroot=store.root,
            session_id=store._session.session_id,
        )
        return store

    @property
    def session(self) -> BasicSession:
        session = self._session
        invariant(session is not None, "session used before open() finished")
        return cast(BasicSession, session)

    def _on_kazoo_state(self, state: str) -> None:
        """kazoo's connection thread: hand the transition to the loop, never block."""
        client_id = self._client.client_id if state == KazooState.CONNECTED else None
        try:
            self._loop.call_soon_threadsafe(self._apply_state, state, client_id)
        except RuntimeError:  # loop closed
            pass

    def _apply_state(self, state: str, client_id: tuple[int, bytes] | None) -> None:
        session = self._session
        if self._closed or session is None:
            return
        if state == KazooState.CONNECTED:
            if client_id is not None and _session_hex(client_id[0]) != session.session_id:
                session.renew(_session_hex(client_id[0]))
            else:
                session.set_state(SessionState.CONNECTED)
            for watch in self._watches:
                watch.notify_reconnect()
        elif state == KazooState.SUSPENDED:
            session.set_state(SessionState.SUSPENDED)
        elif state == KazooState.LOST:
            session.set_state(SessionState.LOST)

    def _on_zk_event(self, event: WatchedEvent) -> None:
        """kazoo's callback thread: a one-shot watch fired on ``event.path``."""
        if event.path is None:  # connection loss; the session transition re-syncs every watch
            return
        try:
            self._loop.call_soon_threadsafe(self._dispatch, event.path)
        except RuntimeError:
            pass

    def _dispatch(self, path: str) -> None:
        for watch in self._watches:
            watch.notify(path)

    def _check_open(self) -> None:
        invariant(not self._closed, f"{self.uri}: store used after close()")

    # --- paths ----------------------------------------------------------------------

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def _dir(self, prefix: str) -> str:
        """The znode whose children a prefix (``""`` or ``"a/b/"``) lists."""
        return self.root if prefix == "" else self._path(prefix[:-1])

    def _key(self, path: str) -> str:
        return path[len(self.root) + 1 :]

    # --- bridging kazoo results onto the loop -----------------------------------------

    def _bridge(self, result: Any) -> asyncio.Future[Any]:
        loop = self._loop
        fut: asyncio.Future[Any] = loop.create_future()

        def settle() -> None:
            if fut.done():  # cancelled by a deadline
                return
            if result.successful():
                fut.set_result(result.value)
            else:
                fut.set_exception(result.exception)

        def on_done(_: Any) -> None:  # kazoo's completion thread
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:
                pass

        result.rawlink(on_done)
        return fut

    async def _kz(
        self,
        what: str,
        fn: Callable[..., Any],
        *args: Any,
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Issue one kazoo request and await it on the loop.

        Raises kazoo's NoNode / NodeExists / BadVersion / NotEmpty errors unchanged (callers
        map them); connectivity problems and the deadline become ``MetadataUnavailableError``.
        """
        timeout = self.op_timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(self._bridge(fn(*args, **kwargs)), timeout)
        except TimeoutError:
            raise MetadataUnavailableError(
                f"{what}: no answer from ZooKeeper at {self.hosts} within {timeout:.1f}s (outcome unknown)"
            ) from None
        except kz.KazooException as exc:
            raise self._kazoo_error(what, exc) from None

    def _kazoo_error(self, what: str, exc: BaseException) -> BaseException:
        """The error a caller sees for kazoo's ``exc``: NoNode / NodeExists / BadVersion /
        NotEmpty unchanged (callers map them), connectivity as ``MetadataUnavailableError``."""
        if isinstance(exc, kz.NoNodeError | kz.NodeExistsError | kz.BadVersionError | kz.NotEmptyError):
            return exc
        if isinstance(exc, _CONNECTIVITY_ERRORS):
            return MetadataUnavailableError(
                f"{what}: ZooKeeper at {self.hosts} unavailable ({type(exc).__name__}; outcome unknown)"
            )
        if isinstance(exc, kz.NoChildrenForEphemeralsError):
            return BadRequestError(f"{what}: a parent is an ephemeral record")
        if isinstance(exc, kz.NoAuthError | kz.AuthFailedError):
            return _unauthorized(what, self.hosts, exc)
        if isinstance(exc, kz.KazooException):
            return InternalError(f"{what}: ZooKeeper error {type(exc).__name__}: {exc}")
        return exc

    # --- writes coalesced into multis (scriba.meta.zk_multi) --------------------------

    async def _write(
        self, kind: WriteKind, path: str, value: bytes, *, version: int = -1, ephemeral: bool = False
    ) -> int:
        """A create or set through the write queue: its new version, or kazoo's error as ``_kz``."""
        fut: asyncio.Future[int] = self._loop.create_future()
        write = ZkWrite(kind, path, value, fut, version=version, ephemeral=ephemeral)
        return await self._writes.write(write)

    async def _commit_one(self, write: ZkWrite) -> int:
        client, what = self._client, f"{write.kind.value} {self._key(write.path)}"
        if write.kind is WriteKind.CREATE:
            _, stat = await self._kz(
                what, client.create_async, write.path, write.value,
                ephemeral=write.ephemeral, include_data=True,
            )
        else:
            stat = await self._kz(what, client.set_async, write.path, write.value, write.version)
        return int(stat.version)

    async def _commit_many(self, writes: Sequence[ZkWrite]) -> list[Any]:
        t = self._client.transaction()
        for write in writes:
            if write.kind is WriteKind.CREATE:
                t.create(write.path, write.value, ephemeral=write.ephemeral)
            else:
                t.set_data(write.path, write.value, write.version)
        return cast(list[Any], await self._kz(f"multi of {len(writes)} writes", t.commit_async))

    def _write_error(self, write: ZkWrite, exc: BaseException) -> BaseException:
        return self._kazoo_error(f"{write.kind.value} {self._key(write.path)}", exc)

    async def _check_root_acl(self) -> None:
        acls, _ = await self._kz("acl of the chroot", self._client.get_acls_async, self.root)
        if any(acl.id.scheme == "world" for acl in acls):
            log.warning("zookeeper_chroot_world_open", chroot=self.root, hosts=self.hosts)

    async def _read(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A read, retried across connection drops until ``op_timeout_s`` has passed."""
        deadline = time.monotonic() + self.op_timeout_s

        async def attempt() -> Any:
            remaining = deadline - time.monotonic()
            return await self._kz(what, fn, *args, timeout_s=max(0.05, remaining), **kwargs)

        def worth_retrying(exc: BaseException) -> bool:  # back off while kazoo reconnects
            return isinstance(exc, MetadataUnavailableError) and not self._closed

        return await retry_async(attempt, policy=READ_RETRY, what=what, deadline=deadline, retry_if=worth_retrying)

    async def _get_node(self, path: str, *, watch: bool = False) -> _Node | None:
        client = self._client
        watcher = self._on_zk_event if watch else None
        try:
            data, stat = await self._read(f"get {path}", client.get_async, path, watch=watcher)
        except kz.NoNodeError:
            return None
        return data, stat

    async def _get_many(self, paths: Sequence[str], *, watch: bool = False) -> list[_Node | None]:
        """``_get_node`` for each path, at most READS_INFLIGHT_MAX at a time, in order."""
        out: list[_Node | None] = []
        for i in range(0, len(paths), READS_INFLIGHT_MAX):
            chunk = paths[i : i + READS_INFLIGHT_MAX]
            results = await asyncio.gather(
                *(self._get_node(p, watch=watch) for p in chunk), return_exceptions=True
            )
            for r in results:
                if isinstance(r, BaseException):
                    raise r
                out.append(r)
        return out

    async def _ensure_path(self, path: str) -> None:
        """Create ``path`` and its ancestors as containers where missing."""
        parts = path.strip("/").split("/")
        client = self._client
        # Hand-written: each pass acts on what the last one found (see Retries above).
        for _ in range(WRITE_ATTEMPTS_MAX):
            try:
                for i in range(1, len(parts) + 1):
                    node = "/" + "/".join(parts[:i])
                    if node in self._containers:
                        continue
                    try:
                        await self._kz(f"create {node}", client.create_async, node, CONTAINER)
                    except kz.NodeExistsError:
                        pass
                    if len(self._containers) >= CONTAINER_CACHE_MAX:
                        self._containers.clear()
                    self._containers.add(node)
                return
            except kz.NoNodeError:  # a cached ancestor was deleted: forget the cache, start over
                self._containers.clear()
        raise MetadataUnavailableError(f"create {path}: its parents keep disappearing")

    async def _ensure_parent(self, path: str) -> None:
        """A create found ``path``'s parent missing: create the parents (the cache was stale)."""
        self._containers.clear()
        await self._ensure_path(path.rpartition("/")[0])

    # --- the MetadataStore operations ---------------------------------------------------

    async def get(self, key: str) -> Versioned[bytes]:
        self._check_open()
        node = await self._get_node(self._path(check_key(key)))
        if node is None or node[0] == CONTAINER:
            raise NoSuchKeyError(f"{key}: no such key")
        data, stat = node
        return _versioned(data, stat)

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> int:
        self._check_open()
        value = check_value(check_key(key), value)
        if ephemeral and self.session.state is SessionState.LOST:
            raise SessionExpiredError(f"{key}: the session is lost; a new one is being opened")
        path = self._path(key)
        client = self._client
        # Hand-written: each pass acts on what the last one found (see Retries above).
        for _ in range(WRITE_ATTEMPTS_MAX):
            try:
                return await self._write(WriteKind.CREATE, path, value, ephemeral=ephemeral)
            except kz.NoNodeError:
                await self._ensure_parent(path)
                continue
            except kz.NodeExistsError:
                pass
            node = await self._get_node(path)
            if node is None:
                continue  # deleted meanwhile: try again
            if node[0] != CONTAINER:
                raise KeyExistsError(f"{key}: already exists")
            if ephemeral:
                raise KeyExistsError(f"{key}: has records under it, so it cannot be ephemeral")
            try:  # a container becomes a record
                stat = await self._kz(
                    f"create {key}", client.set_async, path, value, node[1].version
                )
                return int(stat.version)
            except (kz.BadVersionError, kz.NoNodeError):
                continue
        raise MetadataUnavailableError(f"create {key}: lost {WRITE_ATTEMPTS_MAX} races in a row")

    async def set(self, key: str, value: bytes, *, expected_version: int) -> int:
        self._check_open()
        value = check_value(check_key(key), value)
        path = self._path(key)
        if expected_version < 0:  # -1 would mean "any version" to ZooKeeper
            await self.get(key)
            raise BadVersionError(f"{key}: expected version {expected_version} never matches")
        try:
            return await self._write(WriteKind.SET, path, value, version=expected_version)
        except kz.NoNodeError:
            raise NoSuchKeyError(f"{key}: no such key") from None
        except kz.BadVersionError:
            raise BadVersionError(f"{key}: version is not {expected_version}") from None

    async def delete(self, key: str, *, expected_version: int | None = None) -> None:
        self._check_open()
        path = self._path(check_key(key))
        client = self._client
        # Hand-written: each pass acts on what the last one found (see Retries above).
        for _ in range(WRITE_ATTEMPTS_MAX):
            node = await self._get_node(path)
            if node is None or node[0] == CONTAINER:
                raise NoSuchKeyError(f"{key}: no such key")
            stat = node[1]
            if expected_version is not None and stat.version != expected_version:
                raise BadVersionError(
                    f"{key}: version is {stat.version}, expected {expected_version}"
                )
            try:
                if stat.numChildren:  # records live under it: keep the znode as a container
                    await self._kz(f"delete {key}", client.set_async, path, CONTAINER, stat.version)
                else:
                    await self._kz(f"delete {key}", client.delete_async, path, stat.version)
                return
            except (kz.BadVersionError, kz.NoNodeError, kz.NotEmptyError):
                continue  # changed under us: look again
        raise MetadataUnavailableError(f"delete {key}: lost {WRITE_ATTEMPTS_MAX} races in a row")

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> _Listing:
        self._check_open()
        check_prefix(prefix)
        if limit is not None and not 0 < limit <= LIST_LIMIT_MAX:
            raise BadRequestError(f"list limit must be in 1..{LIST_LIMIT_MAX}, got {limit}")
        if start_after is not None and not start_after.startswith(prefix):
            start_after = prefix + start_after
        parent = self._dir(prefix)
        client = self._client
        try:
            names = await self._read(f"list {prefix!r}", client.get_children_async, parent)
        except kz.NoNodeError:
            return []
        keys = sorted(prefix + name for name in names)
        if start_after is not None:
            keys = [k for k in keys if k > start_after]
        out: _Listing = []
        i = 0
        while i < len(keys) and (limit is None or len(out) < limit):
            wanted = (
                READS_INFLIGHT_MAX if limit is None else min(READS_INFLIGHT_MAX, limit - len(out))
            )
            chunk = keys[i : i + wanted]
            i += len(chunk)
            nodes = await self._get_many([self._path(k) for k in chunk])
            for key, node in zip(chunk, nodes, strict=True):
                if node is None or node[0] == CONTAINER:
                    continue
                out.append((key, _versioned(*node)))
        return out if limit is None else out[:limit]

    async def scan(
        self, prefix: str, *, page_size: int = 500
    ) -> AsyncIterator[tuple[str, Versioned[bytes]]]:
        after: str | None = None
        while True:
            page = await self.list(prefix, start_after=after, limit=page_size)
            for item in page:
                yield item
            if len(page) < page_size:
                return
            after = page[-1][0]

    # --- watches ----------------------------------------------------------------------

    async def watch(self, key: str, *, prefix: bool = False) -> AsyncGenerator[WatchEvent, None]:
        self._check_open()
        if prefix:
            check_prefix(key)
        else:
            check_key(key)
        if len(self._watches) >= WATCHES_MAX:
            raise BadRequestError(f"more than {WATCHES_MAX} watches open on {self.uri}")
        watch = _Watch(key, prefix, self._dir(key) if prefix else self._path(key))
        self._watches.add(watch)
        synced = False
        delay_s = 0.02
        try:
            # Hand-written: a watch lives as long as its reader, re-syncing after every outage.
            while not self._closed:
                try:
                    if watch.resync:
                        watch.resync = False
                        watch.dirty.clear()
                        events = await self._watch_read_all(watch)
                    else:
                        paths, watch.dirty = watch.dirty, set()
                        events = await self._watch_read_paths(watch, paths)
                except MetadataUnavailableError:
                    watch.resync = True  # read everything again once reachable
                    watch.wake.clear()
                    try:
                        await asyncio.wait_for(watch.wake.wait(), delay_s)
                    except TimeoutError:
                        pass
                    delay_s = min(delay_s * 2, RETRY_DELAY_S_MAX)
                    continue
                delay_s = 0.02
                for event in events:
                    yield event
                if not synced:
                    synced = True
                    yield WatchEvent(EventKind.SYNCED)
                if not watch.dirty and not watch.resync and not self._closed:
                    watch.wake.clear()
                    await watch.wake.wait()
        finally:
            self._watches.discard(watch)

    async def _watch_children(self, watch: _Watch) -> _Keys:
        """Keys under the watched prefix now, with a child watch (or an exists watch) armed."""
        client, parent, watcher = self._client, watch.path, self._on_zk_event
        # Hand-written: each pass acts on what the last one found (see Retries above).
        for _ in range(WRITE_ATTEMPTS_MAX):
            try:
                names = await self._read(
                    f"watch {watch.key!r}", client.get_children_async, parent, watch=watcher
                )
                return {watch.key + name for name in names}
            except kz.NoNodeError:
                stat = await self._read(
                    f"watch {watch.key!r}", client.exists_async, parent, watch=watcher
                )
                if stat is None:
                    return set()
        raise MetadataUnavailableError(f"watch {watch.key!r}: {parent} keeps changing")

    async def _watch_key_node(self, watch: _Watch) -> _Node | None:
        """The watched key's znode, with a data watch (or an exists watch if absent) armed."""
        client, path, watcher = self._client, watch.path, self._on_zk_event
        # Hand-written: each pass acts on what the last one found (see Retries above).
        for _ in range(WRITE_ATTEMPTS_MAX):
            node = await self._get_node(path, watch=True)
            if node is not None:
                return node
            stat = await self._read(f"watch {watch.key}", client.exists_async, path, watch=watcher)
            if stat is None:
                return None
        raise MetadataUnavailableError(f"watch {watch.key}: {path} keeps changing")

    async def _watch_read_all(self, watch: _Watch) -> _Events:
        if not watch.prefix:
            return watch.diff(watch.key, await self._watch_key_node(watch))
        keys = await self._watch_children(watch)
        events: _Events = []
        for gone in sorted(watch.delivered.keys() - keys):
            events.extend(watch.diff(gone, None))
        ordered = sorted(keys)
        nodes = await self._get_many([self._path(k) for k in ordered], watch=True)
        for key, node in zip(ordered, nodes, strict=True):
            events.extend(watch.diff(key, node))
        return events

    async def _watch_read_paths(self, watch: _Watch, paths: _Keys) -> _Events:
        if not watch.prefix:
            return watch.diff(watch.key, await self._watch_key_node(watch))
        events: _Events = []
        to_read = {self._key(p) for p in paths if p != watch.path}
        if watch.path in paths:
            keys = await self._watch_children(watch)
            for gone in sorted(watch.delivered.keys() - keys):
                events.extend(watch.diff(gone, None))
                to_read.discard(gone)
            to_read |= keys - watch.delivered.keys()
        ordered = sorted(to_read)
        nodes = await self._get_many([self._path(k) for k in ordered], watch=True)
        for key, node in zip(ordered, nodes, strict=True):
            events.extend(watch.diff(key, node))
        return events

    # --- transactions and ids -------------------------------------------------------

    async def txn(self, checks: Sequence[Check], writes: Sequence[Put | Delete]) -> None:
        """ZooKeeper multi: user checks first, then writes guarded by the versions just read.

        A failed user check is ``BadVersionError``; a failed guard (someone wrote a key
        between our read and the multi) makes us read again and retry.
        """
        self._check_open()
        if len(checks) + len(writes) > TXN_OPS_MAX:
            raise BadRequestError(f"a transaction holds at most {TXN_OPS_MAX} checks and writes")
        final: dict[str, bytes | None] = {}  # applied in order: the last write of a key wins
        for write in writes:
            if isinstance(write, Put):
                final[check_key(write.key)] = check_value(write.key, write.value)
            else:
                final[check_key(write.key)] = None
        for check in checks:
            check_key(check.key)
        # Hand-written: a failed guard means read again and rebuild the multi at once.
        for _ in range(TXN_ATTEMPTS_MAX):
            if await self._txn_attempt(checks, final):
                return
        raise BadVersionError(f"txn: lost {TXN_ATTEMPTS_MAX} races in a row")

    async def _txn_attempt(self, checks: Sequence[Check], final: dict[str, bytes | None]) -> bool:
        """One try: True if committed, False if a guard failed (retry), BadVersionError if a check did."""
        keys = sorted(final.keys() | {c.key for c in checks})
        read = await self._get_many([self._path(k) for k in keys])
        nodes = {
            k: (None if n is None or n[0] == CONTAINER else n)
            for k, n in zip(keys, read, strict=True)
        }
        raw = dict(zip(keys, read, strict=True))
        for check in checks:  # a check failing now is a valid outcome: the txn aborts at this read
            node = nodes[check.key]
            actual = None if node is None else node[1].version
            if actual != check.version:
                raise BadVersionError(
                    f"txn check failed: {check.key} is at {actual}, expected {check.version}"
                )
        for key in keys:
            if raw[key] is None:
                await self._ensure_path(self._path(key).rpartition("/")[0])
        put_keys = [k for k, v in final.items() if v is not None]
        t = self._client.transaction()
        owners: _Owners = []  # per op: the user check it implements, or None for a guard
        for check in checks:
            self._txn_guard(t, owners, self._path(check.key), raw[check.key], check)
        for key in sorted(final):
            path, node, value = self._path(key), raw[key], final[key]
            if value is not None:
                if node is None:
                    t.create(path, value)
                else:
                    t.set_data(path, value, node[1].version)
                owners.append(None)
            elif nodes[key] is None:  # already absent: guard against a concurrent create
                self._txn_guard(t, owners, path, node, None)
            elif node is not None and (
                node[1].numChildren or any(k.startswith(key + "/") for k in put_keys)
            ):
                t.set_data(path, CONTAINER, node[1].version)  # records stay under it
                owners.append(None)
            elif node is not None:
                t.delete(path, node[1].version)
                owners.append(None)
        results = await self._kz("txn", t.commit_async)
        for i, result in enumerate(results):
            if not isinstance(result, Exception) or isinstance(result, _ROLLED_BACK):
                continue
            if isinstance(result, kz.NoAuthError):
                raise _unauthorized("txn", self.hosts, result)
            owner = owners[i]
            if owner is None:
                return False  # a key changed between our read and the multi: read again
            raise BadVersionError(
                f"txn check failed: {owner.key} changed from version {owner.version} ({type(result).__name__})"
            )
        return True

    @staticmethod
    def _txn_guard(
        t: Any, owners: _Owners, path: str, node: _Node | None, check: Check | None
    ) -> None:
        """Ops that fail unless ``path`` is as read: absent, a container, or a record at its version."""
        if node is None:  # absent: creating it must succeed (then undo)
            t.create(path, b"")
            t.delete(path, -1)
            owners += [check, check]
        elif node[0] == CONTAINER:  # absent as a record: the container must stay untouched
            t.check(path, node[1].version)
            owners.append(None)
        else:
            t.check(path, node[1].version)
            owners.append(check)

    async def allocate_id(self, name: str) -> int:
        """From a range this client reserved (``scriba.meta.id_ranges``)."""
        self._check_open()
        return await self._ids.allocate(name)

    async def _legacy_id_floor(self, name: str) -> int:
        """Where a sequence's counter starts: above every id the epoch scheme handed out.

        Before id ranges, ids were ``(epoch << 31) | version`` of the znodes
        ``ids/<name>/<epoch>``; a new counter starts past the newest epoch, so none of
        those ids is handed out again.
        """
        base = self._path(f"ids/{name}")
        try:
            names = await self._read(f"allocate_id {name}", self._client.get_children_async, base)
        except kz.NoNodeError:
            return 0
        epochs = [int(n) for n in names if n.isdigit()]
        return (max(epochs) + 1) << 31 if epochs else 0

    # --- session tools and closing -------------------------------------------------

    async def expire_session_for_test(self) -> None:
        """Expire this session as ZooKeeper tests do; return once LOST and a new CONNECTED were seen.

        A second client joins the same session (id and password) and closes it; the server
        then ends the session and deletes its ephemerals.
        """
        self._check_open()
        client_id = self._client.client_id
        if client_id is None:
            raise MetadataUnavailableError(f"{self.uri}: not connected, no session to expire")
        session = self.session
        old_id = session.session_id
        saw_lost = asyncio.Event()

        def on_state(state: SessionState) -> None:
            if state is SessionState.LOST:
                saw_lost.set()

        session.add_listener(on_state)
        try:
            hosts, timeout_s = self.hosts, self.session_timeout_s

            def join_and_close() -> None:
                other = KazooClient(
                    hosts=hosts,
                    client_id=client_id,
                    timeout=timeout_s,
                    connection_retry=_connection_retry(),
                )
                try:
                    other.start(timeout=EXPIRE_TIMEOUT_S)
                finally:
                    _stop_and_close(other)

            await asyncio.wait_for(
                _run_in_thread(self._loop, join_and_close, "scriba-zk-expire"), EXPIRE_TIMEOUT_S
            )
            deadline = time.monotonic() + EXPIRE_TIMEOUT_S
            while not (
                saw_lost.is_set()
                and session.session_id != old_id
                and session.state is SessionState.CONNECTED
            ):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise MetadataUnavailableError(
                        f"{self.uri}: session {old_id} not replaced within {EXPIRE_TIMEOUT_S:.0f}s "
                        f"(state {session.state.value})"
                    )
                await session.wait_change(remaining)
        finally:
            session.remove_listener(on_state)

    async def close(self) -> None:
        """End the session (ZooKeeper deletes its ephemerals at once) and stop kazoo's threads."""
        if self._closed:
            return
        self._closed = True
        for watch in self._watches:
            watch.wake.set()
        client = self._client
        try:
            await asyncio.wait_for(
                _run_in_thread(self._loop, lambda: _stop_and_close(client), "scriba-zk-close"),
                CLOSE_TIMEOUT_S,
            )
        except TimeoutError:
            log.warning("zookeeper_close_slow", hosts=self.hosts, timeout_s=CLOSE_TIMEOUT_S)

    async def __aenter__(self) -> ZooKeeperStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _tls_options(parsed: MetadataUri) -> dict[str, Any]:
    """kazoo's arguments for ``zk+tls://``: a handler dialing with Scriba's client context
    (chain and host name verified; files checked first: a clear ConfigError)."""
    if not parsed.tls:
        return {}
    ca, cert, key = (parsed.option(name) for name in ("ca", "cert", "key"))
    loaded = TlsConfig(cert=Path(cert) if cert else None, key=Path(key) if key else None,
                       ca=Path(ca) if ca else None).load()
    return {"use_ssl": True, "handler": _TlsHandler(loaded.client_ssl_context())}


class _TlsHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's threading handler, dialing TLS with our context. Unlike kazoo 2.11's own
    TLS dialer it closes the socket of a failed handshake (a client retrying against a
    server it must refuse would otherwise leak one descriptor per attempt)."""

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__()
        self._context = context

    def create_connection(self, address: tuple[str, int], hostname: str | None = None,
                          timeout: float | None = None, **_kazoo_tls_args: Any) -> ssl.SSLSocket:
        sock = socket.create_connection(address, timeout)
        try:
            conn = self._context.wrap_socket(sock, server_hostname=hostname or address[0])
        except BaseException:
            sock.close()
            raise
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn


def _digest_auth(parsed: MetadataUri) -> tuple[list[tuple[str, str]], list[ACL] | None]:
    """kazoo's ``auth_data`` and ``default_acl`` for the URI's digest credentials (or none)."""
    digest = secret(parsed, "digest_file", "digest_env")
    if digest is None:
        return [], None
    user, sep, password = digest.partition(":")
    if not sep or not user or not password:
        where = parsed.option("digest_file") or parsed.option("digest_env")
        raise ConfigError(f"ZooKeeper digest from {where}: expected USER:PASSWORD")
    return [("digest", digest)], [make_digest_acl(user, password, all=True)]


def _unauthorized(what: str, hosts: str, exc: BaseException) -> UnauthorizedError:
    return UnauthorizedError(
        f"{what}: ZooKeeper at {hosts} refused ({type(exc).__name__}): this session's digest "
        "credentials are not on the znode's ACL (missing or wrong digest_file=/digest_env=?)"
    )
