"""``zk://HOST:PORT[,...]/CHROOT``: the metadata store on ZooKeeper, through kazoo.

Layout: key ``a/b`` is the znode ``/CHROOT/a/b``. Parent znodes that hold no record
(``/CHROOT``, ``/CHROOT/a``) are persistent *containers* whose data is
:data:`~scriba.meta.zk_requests.CONTAINER`; every operation treats a container as
absent, so ``get("a")`` raises ``NoSuchKeyError`` and ``list("")`` does not show ``a``
(as on etcd and memory). Deleting a record that has records under it turns it into a
container.

The parts, each in its own module:

- ``scriba.meta.zk_requests``: kazoo's threads bridged onto the event loop, deadlines,
  read retries, what kazoo's errors become, the containers;
- ``scriba.meta.zk_multi``: ``create`` and ``set`` coalesced: the writes issued in one
  loop tick travel as one ZooKeeper multi (one request, one answer, one hand-off through
  kazoo's threads), and each caller still gets its own outcome, as if it had sent its
  write alone;
- ``scriba.meta.zk_watch``: one-shot ZooKeeper watches turned into lasting streams;
- ``scriba.meta.zk_txn``: transactions as a guarded multi;
- ``scriba.meta.zk_security``: digest credentials and ACLs, TLS;
- ``scriba.meta.zk_connect``: kazoo's client with each connect attempt bounded to a
  third of the session timeout, so a server that accepts and does not answer cannot
  hold the attempt until the session it came to keep has expired.

This module holds the store: opening, the session, the record operations and ids.

Sessions: kazoo's CONNECTED / SUSPENDED / LOST become ``SessionState``. After LOST
kazoo opens a new session by itself; that is reported as CONNECTED with the new
``session_id`` (the hex session id). Every CONNECTED makes every watch re-read.

Retries: the create / delete loops stay hand-written: the store did answer, and each
pass takes the step that answer calls for (create the parent, turn a container into a
record, look again), so there is no error to back off from; they are bounded by
``WRITE_ATTEMPTS_MAX``.

Versions: ``version`` = stat.version, ``created`` = stat.czxid, ``owner`` = the hex
ephemeralOwner (the session id of an ephemeral's session). Ids: ranges reserved by
CAS on a counter record ``ids/<name>`` (``scriba.meta.id_ranges``); a counter created
where the older per-id epoch znodes ``ids/<name>/<epoch>`` exist starts above them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any, Final, TypeVar, cast

from kazoo import exceptions as kz
from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState

from scriba.errors import (
    BadRequestError,
    BadVersionError,
    KeyExistsError,
    MetadataUnavailableError,
    NoSuchKeyError,
    SessionExpiredError,
)
from scriba.invariant import invariant
from scriba.log import get_logger
from scriba.meta.id_ranges import IdRanges
from scriba.meta.session import BasicSession
from scriba.meta.store import (
    Check,
    Delete,
    Put,
    SessionState,
    Versioned,
    WatchEvent,
    check_key,
    check_prefix,
    check_value,
)
from scriba.meta.uri import MetadataUri, parse_uri
from scriba.meta.zk_connect import kazoo_client
from scriba.meta.zk_multi import MultiWriter, WriteKind, ZkWrite
from scriba.meta.zk_requests import (
    CONTAINER,
    READS_INFLIGHT_MAX,
    ROLLED_BACK,
    WRITE_ATTEMPTS_MAX,
    ZkRequests,
    connection_retry,
    run_in_thread,
    session_hex,
    stop_and_close,
    versioned,
)
from scriba.meta.zk_security import digest_auth, tls_options
from scriba.meta.zk_txn import zk_txn
from scriba.meta.zk_watch import ZkWatches

log = get_logger(__name__)

T = TypeVar("T")

LIST_LIMIT_MAX: Final = 10_000
CLOSE_TIMEOUT_S: Final = 10.0
EXPIRE_TIMEOUT_S: Final = 30.0

_Listing = list[tuple[str, Versioned[bytes]]]


def _set_once(fut: asyncio.Future[T], value: T) -> None:
    if not fut.done():
        fut.set_result(value)


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
        self._zk = ZkRequests(client, loop, hosts=self.hosts, root=self.root, op_timeout_s=op_timeout_s)
        self._session: BasicSession | None = None
        self._watches = ZkWatches(self._zk, self.uri)
        self._ids = IdRanges(self, floor=self._legacy_id_floor)
        self._writes = MultiWriter(
            loop, self._commit_one, self._commit_many, ROLLED_BACK, self._write_error
        )

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
        auth_data, acl = digest_auth(parsed)
        client = kazoo_client(
            hosts=parsed.hosts_text,
            session_timeout_s=session_timeout_s,
            connection_retry=connection_retry(),
            randomize_hosts=True,
            logger=logging.getLogger("scriba.meta.zookeeper.kazoo"),
            auth_data=auth_data,
            default_acl=acl,
            **tls_options(parsed),
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
            store._zk.closed = True
            run_in_thread(loop, lambda: stop_and_close(client), "scriba-zk-close")
            if isinstance(exc, TimeoutError):
                raise MetadataUnavailableError(
                    f"cannot connect to ZooKeeper at {parsed.hosts_text} within {connect_timeout_s:.1f}s"
                ) from None
            raise
        store._session = BasicSession(session_hex(client_id[0]))
        if not client.connected:
            store._session.set_state(SessionState.SUSPENDED)
        try:
            await store._zk.ensure_path(store.root)
            if auth_data:
                await store._zk.check_root_acl()
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
        if self._zk.closed or session is None:
            return
        if state == KazooState.CONNECTED:
            if client_id is not None and session_hex(client_id[0]) != session.session_id:
                session.renew(session_hex(client_id[0]))
            else:
                session.set_state(SessionState.CONNECTED)
            self._watches.notify_reconnect()
        elif state == KazooState.SUSPENDED:
            session.set_state(SessionState.SUSPENDED)
        elif state == KazooState.LOST:
            session.set_state(SessionState.LOST)

    def _check_open(self) -> None:
        invariant(not self._zk.closed, f"{self.uri}: store used after close()")

    # --- writes coalesced into multis (scriba.meta.zk_multi) --------------------------

    async def _write(
        self, kind: WriteKind, path: str, value: bytes, *, version: int = -1, ephemeral: bool = False
    ) -> int:
        """A create or set through the write queue: its new version, or kazoo's error as ``ZkRequests.kz``."""
        fut: asyncio.Future[int] = self._loop.create_future()
        write = ZkWrite(kind, path, value, fut, version=version, ephemeral=ephemeral)
        return await self._writes.write(write)

    async def _commit_one(self, write: ZkWrite) -> int:
        client, what = self._client, f"{write.kind.value} {self._zk.key(write.path)}"
        if write.kind is WriteKind.CREATE:
            _, stat = await self._zk.kz(
                what, client.create_async, write.path, write.value,
                ephemeral=write.ephemeral, include_data=True,
            )
        else:
            stat = await self._zk.kz(what, client.set_async, write.path, write.value, write.version)
        return int(stat.version)

    async def _commit_many(self, writes: Sequence[ZkWrite]) -> list[Any]:
        t = self._client.transaction()
        for write in writes:
            if write.kind is WriteKind.CREATE:
                t.create(write.path, write.value, ephemeral=write.ephemeral)
            else:
                t.set_data(write.path, write.value, write.version)
        return cast(list[Any], await self._zk.kz(f"multi of {len(writes)} writes", t.commit_async))

    def _write_error(self, write: ZkWrite, exc: BaseException) -> BaseException:
        return self._zk.kazoo_error(f"{write.kind.value} {self._zk.key(write.path)}", exc)

    # --- the MetadataStore operations ---------------------------------------------------

    async def get(self, key: str) -> Versioned[bytes]:
        self._check_open()
        node = await self._zk.get_node(self._zk.path(check_key(key)))
        if node is None or node[0] == CONTAINER:
            raise NoSuchKeyError(f"{key}: no such key")
        data, stat = node
        return versioned(data, stat)

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> int:
        self._check_open()
        value = check_value(check_key(key), value)
        if ephemeral and self.session.state is SessionState.LOST:
            raise SessionExpiredError(f"{key}: the session is lost; a new one is being opened")
        zk = self._zk
        path = zk.path(key)
        # Hand-written: each pass acts on what the last one found (see Retries above).
        for _ in range(WRITE_ATTEMPTS_MAX):
            try:
                return await self._write(WriteKind.CREATE, path, value, ephemeral=ephemeral)
            except kz.NoNodeError:
                await zk.ensure_parent(path)
                continue
            except kz.NodeExistsError:
                pass
            node = await zk.get_node(path)
            if node is None:
                continue  # deleted meanwhile: try again
            if node[0] != CONTAINER:
                raise KeyExistsError(f"{key}: already exists")
            if ephemeral:
                raise KeyExistsError(f"{key}: has records under it, so it cannot be ephemeral")
            try:  # a container becomes a record
                stat = await zk.kz(
                    f"create {key}", self._client.set_async, path, value, node[1].version
                )
                return int(stat.version)
            except (kz.BadVersionError, kz.NoNodeError):
                continue
        raise MetadataUnavailableError(f"create {key}: lost {WRITE_ATTEMPTS_MAX} races in a row")

    async def set(self, key: str, value: bytes, *, expected_version: int) -> int:
        self._check_open()
        value = check_value(check_key(key), value)
        path = self._zk.path(key)
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
        zk = self._zk
        path = zk.path(check_key(key))
        client = self._client
        # Hand-written: each pass acts on what the last one found (see Retries above).
        for _ in range(WRITE_ATTEMPTS_MAX):
            node = await zk.get_node(path)
            if node is None or node[0] == CONTAINER:
                raise NoSuchKeyError(f"{key}: no such key")
            stat = node[1]
            if expected_version is not None and stat.version != expected_version:
                raise BadVersionError(
                    f"{key}: version is {stat.version}, expected {expected_version}"
                )
            try:
                if stat.numChildren:  # records live under it: keep the znode as a container
                    await zk.kz(f"delete {key}", client.set_async, path, CONTAINER, stat.version)
                else:
                    await zk.kz(f"delete {key}", client.delete_async, path, stat.version)
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
        zk = self._zk
        try:
            names = await zk.read(f"list {prefix!r}", self._client.get_children_async, zk.dir(prefix))
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
            nodes = await zk.get_many([zk.path(k) for k in chunk])
            for key, node in zip(chunk, nodes, strict=True):
                if node is None or node[0] == CONTAINER:
                    continue
                out.append((key, versioned(*node)))
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

    def watch(self, key: str, *, prefix: bool = False) -> AsyncGenerator[WatchEvent, None]:
        """The current state, SYNCED, then every change (``scriba.meta.zk_watch``)."""
        return self._watches.watch(key, prefix=prefix)

    async def txn(self, checks: Sequence[Check], writes: Sequence[Put | Delete]) -> None:
        """A multi guarded by the versions just read (``scriba.meta.zk_txn``)."""
        self._check_open()
        await zk_txn(self._zk, checks, writes)

    # --- ids ----------------------------------------------------------------------------

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
        base = self._zk.path(f"ids/{name}")
        try:
            names = await self._zk.read(f"allocate_id {name}", self._client.get_children_async, base)
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
                other = kazoo_client(
                    hosts=hosts,
                    client_id=client_id,
                    session_timeout_s=timeout_s,
                    connection_retry=connection_retry(),
                )
                try:
                    other.start(timeout=EXPIRE_TIMEOUT_S)
                finally:
                    stop_and_close(other)

            await asyncio.wait_for(
                run_in_thread(self._loop, join_and_close, "scriba-zk-expire"), EXPIRE_TIMEOUT_S
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
        if self._zk.closed:
            return
        self._zk.closed = True
        self._watches.wake_all()
        client = self._client
        try:
            await asyncio.wait_for(
                run_in_thread(self._loop, lambda: stop_and_close(client), "scriba-zk-close"),
                CLOSE_TIMEOUT_S,
            )
        except TimeoutError:
            log.warning("zookeeper_close_slow", hosts=self.hosts, timeout_s=CLOSE_TIMEOUT_S)

    async def __aenter__(self) -> ZooKeeperStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

