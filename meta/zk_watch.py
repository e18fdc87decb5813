"""Watches on ZooKeeper: one-shot znode watches turned into a lasting stream of PUT / DELETE.

ZooKeeper watches fire once and carry no data. A watch here re-reads what fired
(re-arming the watch in the same read), compares with what it has delivered
(version and czxid per key, :meth:`ZkWatch.diff`) and emits PUT / DELETE. After every
reconnect it re-reads everything it covers and diffs, so no change is missed;
intermediate versions may be coalesced, but per key the order and the last value are
right. A key watch arms a data watch on its znode (an exists watch while it is absent);
a prefix watch a child watch on the prefix's parent znode plus a data watch on each
child.

Threads: kazoo calls :meth:`ZkWatches.on_zk_event` on its callback thread; the fired
path is handed to the loop, where every open watch covering it notes it as dirty and
wakes. A read that finds ZooKeeper out of reach marks the watch for a full re-read and
backs off (at most ``RETRY_DELAY_S_MAX``, woken early by a reconnect); the watch lives
as long as its reader or the store. The arming loops are hand-written and bounded by
``WRITE_ATTEMPTS_MAX``: each pass acts on what the last one found (a znode created or
deleted between a read and its exists check).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Final

from kazoo import exceptions as kz
from kazoo.protocol.states import WatchedEvent

from scriba.errors import BadRequestError, MetadataUnavailableError
from scriba.invariant import invariant
from scriba.meta.store import EventKind, WatchEvent, check_key, check_prefix
from scriba.meta.zk_requests import (
    CONTAINER,
    RETRY_DELAY_S_MAX,
    WRITE_ATTEMPTS_MAX,
    Node,
    ZkRequests,
)

WATCHES_MAX: Final = 4096

_Keys = set[str]
_Events = list[WatchEvent]


class ZkWatch:
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

    def diff(self, key: str, node: Node | None) -> list[WatchEvent]:
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


class ZkWatches:
    """The open watches of one store, and the kazoo watcher that wakes them."""

    def __init__(self, zk: ZkRequests, uri: str) -> None:
        self._zk = zk
        self._uri = uri
        self._open: set[ZkWatch] = set()

    def on_zk_event(self, event: WatchedEvent) -> None:
        """kazoo's callback thread: a one-shot watch fired on ``event.path``."""
        if event.path is None:  # connection loss; the session transition re-syncs every watch
            return
        try:
            self._zk.loop.call_soon_threadsafe(self._dispatch, event.path)
        except RuntimeError:
            pass

    def _dispatch(self, path: str) -> None:
        for watch in self._open:
            watch.notify(path)

    def notify_reconnect(self) -> None:
        """The session is CONNECTED again: every watch re-reads what it covers."""
        for watch in self._open:
            watch.notify_reconnect()

    def wake_all(self) -> None:
        """The store closed: every watch wakes and ends."""
        for watch in self._open:
            watch.wake.set()

    async def watch(self, key: str, *, prefix: bool = False) -> AsyncGenerator[WatchEvent, None]:
        """``MetadataStore.watch``: the current state, SYNCED, then every change."""
        zk = self._zk
        invariant(not zk.closed, f"{self._uri}: store used after close()")
        if prefix:
            check_prefix(key)
        else:
            check_key(key)
        if len(self._open) >= WATCHES_MAX:
            raise BadRequestError(f"more than {WATCHES_MAX} watches open on {self._uri}")
        watch = ZkWatch(key, prefix, zk.dir(key) if prefix else zk.path(key))
        self._open.add(watch)
        synced = False
        delay_s = 0.02
        try:
            # Hand-written: a watch lives as long as its reader, re-syncing after every outage.
            while not zk.closed:
                try:
                    if watch.resync:
                        watch.resync = False
                        watch.dirty.clear()
                        events = await self._read_all(watch)
                    else:
                        paths, watch.dirty = watch.dirty, set()
                        events = await self._read_paths(watch, paths)
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
                if not watch.dirty and not watch.resync and not zk.closed:
                    watch.wake.clear()
                    await watch.wake.wait()
        finally:
            self._open.discard(watch)

    async def _children(self, watch: ZkWatch) -> _Keys:
        """Keys under the watched prefix now, with a child watch (or an exists watch) armed."""
        zk, parent, watcher = self._zk, watch.path, self.on_zk_event
        # Hand-written: each pass acts on what the last one found (see the module docstring).
        for _ in range(WRITE_ATTEMPTS_MAX):
            try:
                names = await zk.read(
                    f"watch {watch.key!r}", zk.client.get_children_async, parent, watch=watcher
                )
                return {watch.key + name for name in names}
            except kz.NoNodeError:
                stat = await zk.read(
                    f"watch {watch.key!r}", zk.client.exists_async, parent, watch=watcher
                )
                if stat is None:
                    return set()
        raise MetadataUnavailableError(f"watch {watch.key!r}: {parent} keeps changing")

    async def _key_node(self, watch: ZkWatch) -> Node | None:
        """The watched key's znode, with a data watch (or an exists watch if absent) armed."""
        zk, path, watcher = self._zk, watch.path, self.on_zk_event
        # Hand-written: each pass acts on what the last one found (see the module docstring).
        for _ in range(WRITE_ATTEMPTS_MAX):
            node = await zk.get_node(path, watcher=watcher)
            if node is not None:
                return node
            stat = await zk.read(f"watch {watch.key}", zk.client.exists_async, path, watch=watcher)
            if stat is None:
                return None
        raise MetadataUnavailableError(f"watch {watch.key}: {path} keeps changing")

    async def _read_all(self, watch: ZkWatch) -> _Events:
        if not watch.prefix:
            return watch.diff(watch.key, await self._key_node(watch))
        keys = await self._children(watch)
        events: _Events = []
        for gone in sorted(watch.delivered.keys() - keys):
            events.extend(watch.diff(gone, None))
        return events + await self._read_keys(watch, keys)

    async def _read_paths(self, watch: ZkWatch, paths: _Keys) -> _Events:
        if not watch.prefix:
            return watch.diff(watch.key, await self._key_node(watch))
        zk = self._zk
        events: _Events = []
        to_read = {zk.key(p) for p in paths if p != watch.path}
        if watch.path in paths:
            keys = await self._children(watch)
            for gone in sorted(watch.delivered.keys() - keys):
                events.extend(watch.diff(gone, None))
                to_read.discard(gone)
            to_read |= keys - watch.delivered.keys()
        return events + await self._read_keys(watch, to_read)

    async def _read_keys(self, watch: ZkWatch, keys: _Keys) -> _Events:
        """Read ``keys`` in order (re-arming their data watches) and diff each."""
        ordered = sorted(keys)
        nodes = await self._zk.get_many([self._zk.path(k) for k in ordered], watcher=self.on_zk_event)
        events: _Events = []
        for key, node in zip(ordered, nodes, strict=True):
            events.extend(watch.diff(key, node))
        return events
