"""Requests to ZooKeeper from the event loop: kazoo's threads bridged, deadlines, errors, containers.

Threads: kazoo runs its connection and its callbacks on its own threads. Every
result comes back to the event loop through ``loop.call_soon_threadsafe``; no call
here blocks the loop (kazoo's ``*_async`` calls only queue a request). Every wait
has a deadline (``op_timeout_s``). Blocking housekeeping (stopping a client, a second
client joining a session) runs on a daemon thread (:func:`run_in_thread`) whose result
comes back the same way.

Errors (:meth:`ZkRequests.kazoo_error`): kazoo's NoNode / NodeExists / BadVersion /
NotEmpty come back unchanged, for the caller to map (only it knows what they mean for
its operation); connection loss, session trouble and the deadline become
``MetadataUnavailableError`` (outcome unknown); a request the ACLs refuse is an
``UnauthorizedError``; a parent that is an ephemeral ``BadRequestError``; any other
kazoo error ``InternalError``.

Retries: reads retry connection drops within ``op_timeout_s`` through ``scriba.retry``.
The parent-creating loop (:meth:`ZkRequests.ensure_path`) stays hand-written: the store
did answer, and each pass takes the step that answer calls for (create the parent,
start over when a cached parent vanished), so there is no error to back off from; it
is bounded by ``WRITE_ATTEMPTS_MAX``, as are the store's own create / delete loops.

Layout: key ``a/b`` is the znode ``/CHROOT/a/b``. Parent znodes that hold no record
are persistent *containers* whose data is :data:`CONTAINER`; the ones known to exist
are remembered (at most ``CONTAINER_CACHE_MAX``; the cache is dropped whenever one of
them turns out gone).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from kazoo import exceptions as kz
from kazoo.client import KazooClient
from kazoo.protocol.states import WatchedEvent, ZnodeStat
from kazoo.retry import KazooRetry

from scriba.errors import (
    BadRequestError,
    InternalError,
    MetadataUnavailableError,
    UnauthorizedError,
)
from scriba.log import get_logger
from scriba.meta.store import Versioned
from scriba.retry import RetryPolicy, retry_async

log = get_logger(__name__)

T = TypeVar("T")

CONTAINER: Final = b"\x00scriba-container\x00"
"""Data of a znode that only exists to hold records under it (treated as absent)."""

READS_INFLIGHT_MAX: Final = 64
WRITE_ATTEMPTS_MAX: Final = 8
CONTAINER_CACHE_MAX: Final = 10_000
RETRY_DELAY_S_MAX: Final = 0.5
READ_RETRY: Final = RetryPolicy(attempts_max=64, delay_s_min=0.02, delay_s_max=RETRY_DELAY_S_MAX).validate()

CONNECTIVITY_ERRORS: Final = (
    kz.ConnectionLoss,
    kz.ConnectionClosedError,
    kz.SessionExpiredError,
    kz.SessionMovedError,
    kz.OperationTimeoutError,
    kz.ConnectionDropped,
    kz.ZookeeperStoppedError,
    kz.RequestTimeoutError,
)
ROLLED_BACK: Final = (kz.RolledBackError, kz.RuntimeInconsistency)
"""A multi's results for the operations it did not apply because another one failed."""

Node = tuple[bytes, ZnodeStat]
Watcher = Callable[[WatchedEvent], None]


def session_hex(session_id: int) -> str:
    return f"{session_id & 0xFFFFFFFFFFFFFFFF:016x}"


def versioned(data: bytes, stat: ZnodeStat) -> Versioned[bytes]:
    owner = session_hex(stat.ephemeralOwner) if stat.ephemeralOwner else ""
    return Versioned(data, stat.version, stat.czxid, owner)


def connection_retry() -> KazooRetry:
    """Reconnect forever, quickly: the store reports SUSPENDED/LOST meanwhile."""
    return KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_jitter=0.05, max_delay=1.0)


def run_in_thread(
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


def stop_and_close(client: KazooClient) -> None:
    try:
        client.stop()
    finally:
        client.close()


def unauthorized(what: str, hosts: str, exc: BaseException) -> UnauthorizedError:
    return UnauthorizedError(
        f"{what}: ZooKeeper at {hosts} refused ({type(exc).__name__}): this session's digest "
        "credentials are not on the znode's ACL (missing or wrong digest_file=/digest_env=?)"
    )


class ZkRequests:
    """One kazoo client's requests, awaited on the loop, under the chroot ``root``."""

    def __init__(
        self,
        client: KazooClient,
        loop: asyncio.AbstractEventLoop,
        *,
        hosts: str,
        root: str,
        op_timeout_s: float,
    ) -> None:
        self.client = client
        self.loop = loop
        self.hosts = hosts
        self.root = root
        self.op_timeout_s = op_timeout_s
        self.closed = False  # set by the store's close(): reads stop retrying
        self._containers: set[str] = set()  # container znodes known to exist

    # --- paths ----------------------------------------------------------------------

    def path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def dir(self, prefix: str) -> str:
        """The znode whose children a prefix (``""`` or ``"a/b/"``) lists."""
        return self.root if prefix == "" else self.path(prefix[:-1])

    def key(self, path: str) -> str:
        return path[len(self.root) + 1 :]

    # --- bridging kazoo results onto the loop -----------------------------------------

    def _bridge(self, result: Any) -> asyncio.Future[Any]:
        loop = self.loop
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

    async def kz(
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
            raise self.kazoo_error(what, exc) from None

    def kazoo_error(self, what: str, exc: BaseException) -> BaseException:
        """The error a caller sees for kazoo's ``exc``: NoNode / NodeExists / BadVersion /
        NotEmpty unchanged (callers map them), connectivity as ``MetadataUnavailableError``."""
        if isinstance(exc, kz.NoNodeError | kz.NodeExistsError | kz.BadVersionError | kz.NotEmptyError):
            return exc
        if isinstance(exc, CONNECTIVITY_ERRORS):
            return MetadataUnavailableError(
                f"{what}: ZooKeeper at {self.hosts} unavailable ({type(exc).__name__}; outcome unknown)"
            )
        if isinstance(exc, kz.NoChildrenForEphemeralsError):
            return BadRequestError(f"{what}: a parent is an ephemeral record")
        if isinstance(exc, kz.NoAuthError | kz.AuthFailedError):
            return unauthorized(what, self.hosts, exc)
        if isinstance(exc, kz.KazooException):
            return InternalError(f"{what}: ZooKeeper error {type(exc).__name__}: {exc}")
        return exc

    # --- reads ------------------------------------------------------------------------

    async def read(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A read, retried across connection drops until ``op_timeout_s`` has passed."""
        deadline = time.monotonic() + self.op_timeout_s

        async def attempt() -> Any:
            remaining = deadline - time.monotonic()
            return await self.kz(what, fn, *args, timeout_s=max(0.05, remaining), **kwargs)

        def worth_retrying(exc: BaseException) -> bool:  # back off while kazoo reconnects
            return isinstance(exc, MetadataUnavailableError) and not self.closed

        return await retry_async(attempt, policy=READ_RETRY, what=what, deadline=deadline, retry_if=worth_retrying)

    async def get_node(self, path: str, *, watcher: Watcher | None = None) -> Node | None:
        """``path``'s data and stat (a data watch armed with ``watcher``), or None if absent."""
        try:
            data, stat = await self.read(f"get {path}", self.client.get_async, path, watch=watcher)
        except kz.NoNodeError:
            return None
        return data, stat

    async def get_many(self, paths: Sequence[str], *, watcher: Watcher | None = None) -> list[Node | None]:
        """``get_node`` for each path, at most READS_INFLIGHT_MAX at a time, in order."""
        out: list[Node | None] = []
        for i in range(0, len(paths), READS_INFLIGHT_MAX):
            chunk = paths[i : i + READS_INFLIGHT_MAX]
            results = await asyncio.gather(
                *(self.get_node(p, watcher=watcher) for p in chunk), return_exceptions=True
            )
            for r in results:
                if isinstance(r, BaseException):
                    raise r
                out.append(r)
        return out

    # --- containers ---------------------------------------------------------------------

    async def ensure_path(self, path: str) -> None:
        """Create ``path`` and its ancestors as containers where missing."""
        parts = path.strip("/").split("/")
        client = self.client
        # Hand-written: each pass acts on what the last one found (see Retries above).
        for _ in range(WRITE_ATTEMPTS_MAX):
            try:
                for i in range(1, len(parts) + 1):
                    node = "/" + "/".join(parts[:i])
                    if node in self._containers:
                        continue
                    try:
                        await self.kz(f"create {node}", client.create_async, node, CONTAINER)
                    except kz.NodeExistsError:
                        pass
                    if len(self._containers) >= CONTAINER_CACHE_MAX:
                        self._containers.clear()
                    self._containers.add(node)
                return
            except kz.NoNodeError:  # a cached ancestor was deleted: forget the cache, start over
                self._containers.clear()
        raise MetadataUnavailableError(f"create {path}: its parents keep disappearing")

    async def ensure_parent(self, path: str) -> None:
        """A create found ``path``'s parent missing: create the parents (the cache was stale)."""
        self._containers.clear()
        await self.ensure_path(path.rpartition("/")[0])

    async def check_root_acl(self) -> None:
        """Log a chroot someone else created world-open: its ACL is not ours to change."""
        acls, _ = await self.kz("acl of the chroot", self.client.get_acls_async, self.root)
        if any(acl.id.scheme == "world" for acl in acls):
            log.warning("zookeeper_chroot_world_open", chroot=self.root, hosts=self.hosts)
