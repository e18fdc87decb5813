"""``memory://NAME``: the in-process metadata store, with the real drivers' semantics.

Every :class:`MemoryStore` opened with the same NAME in one process shares one
:class:`_Space` (the "server"): records (id counters among them), a store-wide
revision and watchers. Each store is one client with its own session, so ephemerals of one
store vanish when that store closes or its session is expired
(:meth:`MemoryStore.expire_session_for_test`) while the others keep theirs.

Like etcd: a write (or a whole transaction) takes the next store-wide revision;
a record's ``version`` is the revision that last wrote it and ``created`` the
revision that created it, so both strictly increase. Watchers get the current
state, SYNCED, then every change in revision order. A watcher whose bounded queue
overflows re-syncs (it delivers the difference to the current state), as an etcd
watcher does after a compaction: per key, the last value delivered is current.

Invariant: every mutation runs without an ``await`` in between its check and its
write, so each one is atomic on the event loop.
"""

from __future__ import annotations

import asyncio
import bisect
import builtins
import itertools
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Final

from scriba.errors import (
    BadRequestError,
    BadVersionError,
    KeyExistsError,
    NoSuchKeyError,
    SessionExpiredError,
)
from scriba.invariant import invariant
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
    is_direct_child,
)
from scriba.meta.uri import MetadataUri, parse_uri

WATCH_QUEUE_MAX: Final = 10_000
LIST_LIMIT_MAX: Final = 10_000
TXN_OPS_MAX: Final = 128


@dataclass(slots=True)
class _Record:
    value: bytes
    version: int
    created: int
    owner: str | None  # session id of an ephemeral record

    def versioned(self) -> Versioned[bytes]:
        return Versioned(self.value, self.version, self.created, self.owner or "")


class _Watcher:
    """One watch's bounded event queue; overflow turns into a re-sync."""

    def __init__(self, key: str, prefix: bool) -> None:
        self.key = key
        self.prefix = prefix
        self.queue: deque[WatchEvent] = deque()
        self.overflowed = False
        self.closed = False
        self.wakeup = asyncio.Event()

    def matches(self, key: str) -> bool:
        return is_direct_child(self.key, key) if self.prefix else key == self.key

    def offer(self, event: WatchEvent) -> None:
        if len(self.queue) >= WATCH_QUEUE_MAX:
            self.queue.clear()
            self.overflowed = True
        elif not self.overflowed:
            self.queue.append(event)
        self.wakeup.set()

    def close(self) -> None:
        self.closed = True
        self.wakeup.set()


class _Space:
    """The data shared by every store opened with one NAME."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.revision = 0
        self.records: dict[str, _Record] = {}
        self.keys: list[str] = []  # sorted
        self.watchers: set[_Watcher] = set()
        self.session_seq = itertools.count(1)

    def apply(self, writes: Sequence[tuple[str, bytes | None, str | None]]) -> int:
        """Apply (key, value or None to delete, owner) at one new revision; tell watchers."""
        self.revision += 1
        rev = self.revision
        events: list[WatchEvent] = []
        for key, value, owner in writes:
            old = self.records.get(key)
            if value is None:
                if old is None:
                    continue
                del self.records[key]
                self.keys.pop(bisect.bisect_left(self.keys, key))
                events.append(WatchEvent(EventKind.DELETE, key, None, rev))
                continue
            if old is None:
                self.records[key] = _Record(value, rev, rev, owner)
                bisect.insort(self.keys, key)
            else:
                self.records[key] = _Record(value, rev, old.created, old.owner if owner is None else owner)
            events.append(WatchEvent(EventKind.PUT, key, value, rev))
        for watcher in list(self.watchers):
            for event in events:
                if watcher.matches(event.key):
                    watcher.offer(event)
        return rev

    def children(self, prefix: str, start_after: str | None) -> list[str]:
        """Keys directly under ``prefix`` after ``start_after``, sorted."""
        start = bisect.bisect_right(self.keys, start_after) if start_after else bisect.bisect_left(self.keys, prefix)
        out: list[str] = []
        for key in itertools.islice(self.keys, start, None):
            if not key.startswith(prefix):
                break
            if is_direct_child(prefix, key):
                out.append(key)
        return out

    def drop_ephemerals(self, owner: str) -> None:
        mine = [(k, None, None) for k, r in self.records.items() if r.owner == owner]
        if mine:
            self.apply(mine)


_SPACES: dict[str, _Space] = {}


def drop_memory_space(name: str) -> None:
    """Forget every record of ``memory://name`` (tests and simulations that reuse names)."""
    _SPACES.pop(name, None)


class MemoryStore:
    """A client of one in-process space; implements ``scriba.meta.store.MetadataStore``."""

    def __init__(self, parsed: MetadataUri, *, session_timeout_s: float = 10.0) -> None:
        self.uri = parsed.text
        self.session_timeout_s = session_timeout_s
        self._space = _SPACES.setdefault(parsed.path, _Space(parsed.path))
        self._session = BasicSession(self._new_session_id())
        self._watchers: set[_Watcher] = set()
        self._ids = IdRanges(self)
        self._closed = False

    @classmethod
    async def open(cls, parsed: MetadataUri | str, *, session_timeout_s: float = 10.0) -> MemoryStore:
        if isinstance(parsed, str):
            parsed = parse_uri(parsed)
        invariant(parsed.scheme == "memory", f"MemoryStore cannot open {parsed.text!r}")
        return cls(parsed, session_timeout_s=session_timeout_s)

    def _new_session_id(self) -> str:
        return f"{self._space.name}-{next(self._space.session_seq)}"

    @property
    def session(self) -> BasicSession:
        return self._session

    def _check_open(self) -> None:
        invariant(not self._closed, f"{self.uri}: store used after close()")

    async def get(self, key: str) -> Versioned[bytes]:
        self._check_open()
        record = self._space.records.get(check_key(key))
        if record is None:
            raise NoSuchKeyError(f"{key}: no such key")
        return record.versioned()

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> int:
        self._check_open()
        value = check_value(check_key(key), value)
        if ephemeral and self._session.state is not SessionState.CONNECTED:
            raise SessionExpiredError(f"{key}: session is {self._session.state.value}")
        if key in self._space.records:
            raise KeyExistsError(f"{key}: already exists")
        owner = self._session.session_id if ephemeral else None
        return self._space.apply([(key, value, owner)])

    async def set(self, key: str, value: bytes, *, expected_version: int) -> int:
        self._check_open()
        value = check_value(check_key(key), value)
        record = self._space.records.get(key)
        if record is None:
            raise NoSuchKeyError(f"{key}: no such key")
        if record.version != expected_version:
            raise BadVersionError(f"{key}: version is {record.version}, expected {expected_version}")
        return self._space.apply([(key, value, None)])

    async def delete(self, key: str, *, expected_version: int | None = None) -> None:
        self._check_open()
        record = self._space.records.get(check_key(key))
        if record is None:
            raise NoSuchKeyError(f"{key}: no such key")
        if expected_version is not None and record.version != expected_version:
            raise BadVersionError(f"{key}: version is {record.version}, expected {expected_version}")
        self._space.apply([(key, None, None)])

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> list[tuple[str, Versioned[bytes]]]:
        self._check_open()
        check_prefix(prefix)
        if limit is not None and not 0 < limit <= LIST_LIMIT_MAX:
            raise BadRequestError(f"list limit must be in 1..{LIST_LIMIT_MAX}, got {limit}")
        if start_after is not None and not start_after.startswith(prefix):
            start_after = prefix + start_after
        keys = self._space.children(prefix, start_after)
        if limit is not None:
            keys = keys[:limit]
        records = self._space.records
        return [(k, records[k].versioned()) for k in keys]

    async def scan(self, prefix: str, *, page_size: int = 500) -> AsyncIterator[tuple[str, Versioned[bytes]]]:
        after: str | None = None
        while True:
            page = await self.list(prefix, start_after=after, limit=page_size)
            for item in page:
                yield item
            if len(page) < page_size:
                return
            after = page[-1][0]

    async def watch(self, key: str, *, prefix: bool = False) -> AsyncGenerator[WatchEvent, None]:
        self._check_open()
        if prefix:
            check_prefix(key)
        else:
            check_key(key)
        watcher = _Watcher(key, prefix)
        # Snapshot and registration happen with no await in between: nothing is missed.
        initial = self._snapshot(watcher)
        known = {k: r.version for k, r in initial.items()}
        self._space.watchers.add(watcher)
        self._watchers.add(watcher)
        try:
            for k in sorted(initial):
                yield WatchEvent(EventKind.PUT, k, initial[k].value, initial[k].version)
            del initial  # held for the watch's life, it would keep every record deleted later
            yield WatchEvent(EventKind.SYNCED)
            while not watcher.closed:
                if watcher.overflowed:
                    watcher.overflowed = False
                    for event in self._resync(watcher, known):
                        yield event
                    continue
                if not watcher.queue:
                    watcher.wakeup.clear()
                    await watcher.wakeup.wait()
                    continue
                event = watcher.queue.popleft()
                if event.kind is EventKind.DELETE:
                    known.pop(event.key, None)
                else:
                    known[event.key] = event.version
                yield event
        finally:
            self._space.watchers.discard(watcher)
            self._watchers.discard(watcher)

    def _snapshot(self, watcher: _Watcher) -> dict[str, _Record]:
        records = self._space.records
        if watcher.prefix:
            return {k: records[k] for k in self._space.children(watcher.key, None)}
        record = records.get(watcher.key)
        return {watcher.key: record} if record is not None else {}

    def _resync(self, watcher: _Watcher, known: dict[str, int]) -> builtins.list[WatchEvent]:
        """Events that take a watcher from ``known`` to the current state (after an overflow)."""
        current = self._snapshot(watcher)
        gone = sorted(known.keys() - current.keys())
        events = [WatchEvent(EventKind.DELETE, k, None, self._space.revision) for k in gone]
        for k in sorted(current):
            if known.get(k) != current[k].version:
                events.append(WatchEvent(EventKind.PUT, k, current[k].value, current[k].version))
        known.clear()
        known.update({k: r.version for k, r in current.items()})
        return events

    async def txn(self, checks: Sequence[Check], writes: Sequence[Put | Delete]) -> None:
        self._check_open()
        if len(checks) + len(writes) > TXN_OPS_MAX:
            raise BadRequestError(f"a transaction holds at most {TXN_OPS_MAX} checks and writes")
        planned: list[tuple[str, bytes | None, str | None]] = []
        for write in writes:
            if isinstance(write, Put):
                planned.append((check_key(write.key), check_value(write.key, write.value), None))
            else:
                planned.append((check_key(write.key), None, None))
        for check in checks:
            record = self._space.records.get(check_key(check.key))
            actual = record.version if record is not None else None
            if actual != check.version:
                raise BadVersionError(f"txn check failed: {check.key} is at {actual}, expected {check.version}")
        self._space.apply(planned)

    async def allocate_id(self, name: str) -> int:
        """From a range this store reserved, as on the real drivers (``scriba.meta.id_ranges``)."""
        self._check_open()
        return await self._ids.allocate(name)

    async def expire_session_for_test(self) -> None:
        """Expire the session as a server would: ephemerals go, then LOST, then CONNECTED anew."""
        self._check_open()
        self._space.drop_ephemerals(self._session.session_id)
        self._session.renew(self._new_session_id())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._space.drop_ephemerals(self._session.session_id)
        for watcher in list(self._watchers):
            watcher.close()

    async def __aenter__(self) -> MemoryStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
