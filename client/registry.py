"""The client's view of the bookies: a watch on ``bookies/available/``.

``BookieRegistry`` keeps the current registrations (address, binary data path address, region/zone/rack,
mode, entry size limit), every address ever seen (so a transport can still dial a
bookie whose ephemeral record lapsed and report it UNAVAILABLE itself), and, rebuilt
when the set changes, a placement ``Topology`` and ``entry_size_max``: the smallest
limit any registered bookie advertises (any of them may be chosen to replace a bookie
and then receives the entries still in flight), which writers check each payload
against before sending it. The watch re-opens after an error with a
bounded, doubling backoff until ``close()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from scriba.entry import ENTRY_SIZE_MAX_DEFAULT
from scriba.errors import (
    BadRequestError,
    NotEnoughBookiesError,
    ScribaError,
    UnavailableError,
)
from scriba.ids import BookieId
from scriba.log import get_logger
from scriba.meta.records import BOOKIES_PREFIX, BookieRegistration
from scriba.meta.store import EventKind, MetadataStore

log = get_logger(__name__)

WATCH_BACKOFF_MIN_S: Final = 0.05
WATCH_BACKOFF_MAX_S: Final = 2.0


class BookieRegistry:
    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._registrations: dict[BookieId, BookieRegistration] = {}
        self._addresses: dict[BookieId, str] = {}
        self._binary_addresses: dict[BookieId, str] = {}
        self._topology: Any = None
        # The largest packed entry every registered bookie accepts (the default while
        # none is registered). A plain attribute, refreshed on every change: writers
        # read it once per append.
        self.entry_size_max: int = ENTRY_SIZE_MAX_DEFAULT
        self._changed = asyncio.Condition()
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self, timeout_s: float = 10.0) -> BookieRegistry:
        """Start watching; returns once the current set has been loaded."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch_loop())
        try:
            async with asyncio.timeout(timeout_s):
                await self._synced.wait()
        except TimeoutError:
            raise UnavailableError(
                f"bookie registry: no answer from {self._store.uri} within {timeout_s} s"
            ) from None
        return self

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, ScribaError):
                pass
            self._task = None

    # --- views -------------------------------------------------------------------------
    @property
    def registrations(self) -> Mapping[BookieId, BookieRegistration]:
        return MappingProxyType(self._registrations)

    def address(self, bookie_id: BookieId) -> str:
        """``host:port`` of a bookie (also for one whose registration lapsed)."""
        address = self._addresses.get(bookie_id)
        if address is None:
            raise UnavailableError(f"bookie {bookie_id} is not registered")
        return address

    def binary_address(self, bookie_id: BookieId) -> str:
        """``host:port`` of a bookie's binary data path; "" when it offers none (or is
        unknown): the transport then uses gRPC for it."""
        return self._binary_addresses.get(bookie_id, "")

    def writable_bookies(self) -> list[BookieId]:
        return sorted(b for b, r in self._registrations.items() if r.writable)

    def topology(self) -> Any:
        """The placement ``Topology`` of the registered bookies (cached until a change)."""
        if self._topology is None:
            from scriba.placement import BookieNode, Topology

            self._topology = Topology.from_nodes(
                BookieNode(
                    bookie_id=r.bookie_id,
                    region=r.region,
                    zone=r.zone,
                    rack=r.rack,
                    writable=r.writable,
                    free_bytes=r.free_bytes,
                )
                for r in self._registrations.values()
            )
        return self._topology

    async def wait_for_bookies(
        self, n: int, timeout_s: float = 30.0, *, writable: bool = True
    ) -> list[BookieId]:
        """Wait until at least ``n`` (writable) bookies are registered; returns their ids."""

        def ready() -> bool:
            count = len(self.writable_bookies()) if writable else len(self._registrations)
            return count >= n

        try:
            async with asyncio.timeout(timeout_s):
                async with self._changed:
                    await self._changed.wait_for(ready)
        except TimeoutError:
            have = len(self.writable_bookies()) if writable else len(self._registrations)
            raise NotEnoughBookiesError(
                f"waited {timeout_s} s for {n} {'writable ' if writable else ''}bookies; "
                f"{have} registered"
            ) from None
        return self.writable_bookies() if writable else sorted(self._registrations)

    # --- watch -------------------------------------------------------------------------
    async def _watch_loop(self) -> None:
        backoff = WATCH_BACKOFF_MIN_S
        while not self._closed:
            try:
                watch = self._store.watch(BOOKIES_PREFIX, prefix=True)
                seen: set[BookieId] = set()
                syncing = True
                try:
                    async for event in watch:
                        if event.kind is EventKind.SYNCED:
                            if syncing:
                                # Bookies gone while we were not watching.
                                for gone in set(self._registrations) - seen:
                                    self._registrations.pop(gone, None)
                                syncing = False
                                await self._notify()
                                self._synced.set()
                            continue
                        bookie_id = self._apply(event.kind, event.key, event.value)
                        if syncing and bookie_id is not None:
                            seen.add(bookie_id)
                        if not syncing:
                            await self._notify()
                        backoff = WATCH_BACKOFF_MIN_S
                finally:
                    aclose = getattr(watch, "aclose", None)
                    if aclose is not None:
                        await aclose()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a driver bug must not end the watch for good
                log.warning(
                    "bookie_watch_failed", error=f"{type(exc).__name__}: {exc}", backoff_s=backoff
                )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, WATCH_BACKOFF_MAX_S)

    def _apply(self, kind: EventKind, key: str, value: bytes | None) -> BookieId | None:
        bookie_id = BookieId(key.rsplit("/", 1)[-1])
        if kind is EventKind.DELETE:
            if self._registrations.pop(bookie_id, None) is not None:
                self._changed_set()
                log.info("bookie_gone", bookie_id=bookie_id)
            return None
        if value is None:
            return None
        try:
            registration = BookieRegistration.from_bytes(value)
        except BadRequestError as exc:
            log.warning("bookie_registration_unreadable", key=key, error=str(exc))
            return None
        bookie_id = registration.bookie_id
        self._registrations[bookie_id] = registration
        self._addresses[bookie_id] = registration.address
        self._binary_addresses[bookie_id] = registration.binary_address
        self._changed_set()
        return bookie_id

    def _changed_set(self) -> None:
        self._topology = None
        limits = [r.entry_size_max for r in self._registrations.values()]
        self.entry_size_max = min(limits, default=ENTRY_SIZE_MAX_DEFAULT)

    async def _notify(self) -> None:
        self._changed_set()
        async with self._changed:
            self._changed.notify_all()
