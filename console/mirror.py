"""A read-only copy of the metadata the console shows, kept current by watching the store.

A prefix watch sees the records *directly* under its prefix (``MetadataStore.watch``),
so the mirror watches a tree: the roots (bookies, cookies, ledgers, stream namespaces,
under-replicated ledgers, decommissions) and, as records appear, what hangs below them
(:func:`children`): a namespace's streams, a stream's cursors, and — an RSM group being
a stream — the group's member registrations and its leader election. When a record
goes, the watches below it stop and their records go too. Each watch delivers the
current records, then ``SYNCED``, then every change; the mirror applies them to a dict
per section (:data:`PREFIXES`), so a page view reads memory and never the store. At
each (re)``SYNCED`` a watch drops the keys it had that the store no longer has: a
record deleted while the store was away does not linger. Whoever keeps something per
key (the views' decode cache) registers with :meth:`Mirror.on_forget` and is told of
every key the mirror drops, whichever of these ways it goes.

If the store goes away (a watch raises, or connecting fails) the mirror keeps the last
copy, says so in :attr:`Mirror.error` (the pages show it), and reconnects with a capped
backoff; the console keeps serving meanwhile. A driver may also ride out an outage
itself, its watches silent until the server is back (etcd re-syncs them): then the
store's session says SUSPENDED (or LOST), and the mirror reports that the same way until
the session is CONNECTED again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from scriba.autorecovery.records import DECOMMISSION_PREFIX, UNDERREPLICATED_PREFIX
from scriba.errors import ScribaError
from scriba.log import get_logger
from scriba.meta.records import BOOKIES_PREFIX, COOKIES_PREFIX, LEDGERS_PREFIX
from scriba.meta.store import EventKind, MetadataStore, SessionState
from scriba.stream.segments import STREAMS_PREFIX

log = get_logger(__name__)

RSM_PREFIX: Final = "rsm/"
ELECTIONS_PREFIX: Final = "elections/"
PREFIXES: Final = (BOOKIES_PREFIX, COOKIES_PREFIX, LEDGERS_PREFIX, STREAMS_PREFIX, RSM_PREFIX,
                   ELECTIONS_PREFIX, UNDERREPLICATED_PREFIX, DECOMMISSION_PREFIX)
RETRY_MIN_S: Final = 0.2
RETRY_MAX_S: Final = 5.0

Connect = Callable[[str], Awaitable[MetadataStore]]


WatchSpec = tuple[str, bool]  # (key, prefix?)

ROOTS: Final[tuple[WatchSpec, ...]] = tuple((p, True) for p in (
    BOOKIES_PREFIX, COOKIES_PREFIX, LEDGERS_PREFIX, STREAMS_PREFIX, UNDERREPLICATED_PREFIX, DECOMMISSION_PREFIX))


def children(key: str) -> list[WatchSpec]:
    """What to watch below a record that appeared under a watched prefix."""
    if not key.startswith(STREAMS_PREFIX):
        return []
    parts = key[len(STREAMS_PREFIX):].split("/")
    if len(parts) == 1:  # a namespace: its streams
        return [(f"{key}/", True)]
    if len(parts) == 2:  # a stream: its cursors; as an RSM group, its members and leader
        group = f"{parts[0]}~{parts[1]}"
        return [(f"{key}/cursors/", True), (f"{RSM_PREFIX}{group}/members/", True),
                (f"{ELECTIONS_PREFIX}rsm~{group}/leader", False)]
    return []


def section_of(key: str) -> str:
    return max((p for p in PREFIXES if key.startswith(p)), key=len)


class Mirror:
    """The watched records, as ``{section prefix: {key: (version, value)}}``."""

    def __init__(self, uri: str, connect: Connect) -> None:
        self.uri = uri
        self._connect = connect
        self._records: dict[str, dict[str, tuple[int, bytes]]] = {p: {} for p in PREFIXES}
        self._owned: dict[WatchSpec, set[str]] = {}  # watch -> the keys it delivered
        self._tasks: dict[WatchSpec, asyncio.Task[None]] = {}
        self._synced: set[WatchSpec] = set()
        self._group: asyncio.TaskGroup | None = None
        self.error: str | None = None
        self.changes = 0  # bumped on every applied event (views cache on it)
        self._task: asyncio.Task[None] | None = None
        self._forget_listeners: list[Callable[[str], None]] = []
        self._session_error: str | None = None  # set while the store's session is not CONNECTED

    def on_forget(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(key)`` whenever a key leaves the mirror."""
        self._forget_listeners.append(listener)

    # --- reading ---------------------------------------------------------------
    def records(self, prefix: str) -> Mapping[str, tuple[int, bytes]]:
        return self._records[prefix]

    @property
    def synced(self) -> bool:
        """Every running watch has delivered its current state, and the store's session is up."""
        return bool(self._tasks) and self._synced.issuperset(self._tasks) and self._session_error is None

    def status(self) -> dict[str, object]:
        return {"uri": self.uri, "synced": self.synced, "error": self.error, "watches": len(self._tasks)}

    async def wait_synced(self, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while not self.synced:
                await asyncio.sleep(0.05)

    # --- running ---------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="console-mirror")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        backoff = RETRY_MIN_S
        while True:
            started = time.monotonic()
            try:
                store = await self._connect(self.uri)
            except (ScribaError, OSError) as exc:
                self._failed(exc)
            else:
                store.session.add_listener(self._on_session)
                try:
                    async with asyncio.TaskGroup() as group:
                        self._group = group
                        for spec in ROOTS:
                            self._start_watch(store, spec)
                except* (ScribaError, OSError) as excs:
                    self._failed(excs.exceptions[0])
                finally:
                    store.session.remove_listener(self._on_session)
                    self._session_error = None
                    self._group = None
                    self._tasks.clear()
                    self._synced.clear()
                    with contextlib.suppress(ScribaError, OSError):
                        await store.close()
            if time.monotonic() - started > 10 * RETRY_MAX_S:
                backoff = RETRY_MIN_S  # it ran a good while: a fresh failure
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, RETRY_MAX_S)

    def _on_session(self, state: SessionState) -> None:
        if state is SessionState.CONNECTED:
            if self._session_error is not None and self.error == self._session_error:
                self.error = None
            self._session_error = None
            return
        self._session_error = self.error = (f"metadata store {self.uri}: session {state.value} "
                                            "(the store does not answer)")
        log.warning("console_store_unavailable", error=self.error)

    def _failed(self, exc: BaseException) -> None:
        self.error = f"metadata store {self.uri}: {type(exc).__name__}: {exc}"
        log.warning("console_store_unavailable", error=self.error)

    def _start_watch(self, store: MetadataStore, spec: WatchSpec) -> None:
        if spec in self._tasks or self._group is None:
            return
        self._tasks[spec] = self._group.create_task(self._watch(store, spec), name=f"console-watch {spec[0]}")

    def _stop_watch(self, spec: WatchSpec) -> None:
        task = self._tasks.pop(spec, None)
        if task is not None:
            task.cancel()
        self._synced.discard(spec)
        for key in self._owned.pop(spec, set()):
            self._forget(key)

    def _put(self, store: MetadataStore, owner: set[str], key: str, version: int, value: bytes) -> None:
        owner.add(key)
        self._records[section_of(key)][key] = (version, value)
        for child in children(key):
            self._start_watch(store, child)

    def _forget(self, key: str) -> None:
        if self._records[section_of(key)].pop(key, None) is not None:
            for listener in self._forget_listeners:
                listener(key)
        for child in children(key):
            self._stop_watch(child)

    async def _watch(self, store: MetadataStore, spec: WatchSpec) -> None:
        owner = self._owned.setdefault(spec, set())
        seen: set[str] | None = set()  # keys of the current (re)sync, until SYNCED
        key, prefix = spec
        async with contextlib.aclosing(store.watch(key, prefix=prefix)) as events:
            async for event in events:
                if event.kind is EventKind.SYNCED:
                    for gone in owner - (seen or set()):
                        owner.discard(gone)
                        self._forget(gone)
                    seen = None
                    self._synced.add(spec)
                    if self.synced:
                        self.error = None
                elif event.kind is EventKind.PUT and event.value is not None:
                    if seen is not None:
                        seen.add(event.key)
                    self._put(store, owner, event.key, event.version, event.value)
                elif event.kind is EventKind.DELETE:
                    owner.discard(event.key)
                    self._forget(event.key)
                self.changes += 1
