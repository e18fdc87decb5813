"""The bookie's ephemeral registration record, kept in step with the metadata session.

States: UNREGISTERED -> REGISTERED (record created under ``bookie_key(id)``) ->
UNREGISTERED when the session is LOST (the store dropped the ephemeral) -> REGISTERED
again once the session is back (a background task re-creates the record, retrying with
a bound delay) -> CLOSED on clean shutdown (record deleted).

Outputs: ``on_change(registered)`` after each transition, so the service stops taking
adds while unregistered (READ_ONLY). Mode changes (read-only / writable) are written
through ``update_metadata``.

The record advertises what clients must know before they send: the address, the
location (placement), the mode, and ``entry_size_max`` (clients refuse a larger
payload up front instead of sending it to be refused).

A record left by an earlier incarnation of this bookie (killed before its session
expired) is replaced: the cookie check has already proven that this process owns
the bookie's data dirs.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from scriba.errors import KeyExistsError, MetadataError, NoSuchKeyError, ScribaError
from scriba.log import get_logger
from scriba.meta.records import BOOKIE_CODEC, BookieMode, BookieRegistration, bookie_key
from scriba.meta.store import MetadataStore, SessionState
from scriba.meta.update import update_metadata

log = get_logger(__name__)

REGISTER_ATTEMPTS_MAX = 1_000_000  # bounded, but effectively "until shutdown"


class Registration:
    def __init__(
        self,
        store: MetadataStore,
        record: BookieRegistration,
        *,
        on_change: Callable[[bool], None],
        retry_s: float = 0.5,
        op_timeout_s: float = 10.0,
    ) -> None:
        self._store = store
        self._record = record
        self._on_change = on_change
        self._retry_s = retry_s
        self._op_timeout_s = op_timeout_s
        self._key = bookie_key(record.bookie_id)
        self._registered = False
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()

    @property
    def registered(self) -> bool:
        return self._registered

    @property
    def record(self) -> BookieRegistration:
        return self._record

    async def start(self) -> None:
        """Register now (errors propagate), then follow the session."""
        await self._register_once()
        self._store.session.add_listener(self._on_session)

    def _set(self, registered: bool) -> None:
        if registered != self._registered:
            self._registered = registered
            self._on_change(registered)

    async def _register_once(self) -> None:
        async with self._lock:
            data = self._record.to_bytes()
            try:
                await asyncio.wait_for(self._store.create(self._key, data, ephemeral=True), self._op_timeout_s)
            except KeyExistsError:
                # An earlier incarnation's (or our previous session's) record: replace it.
                log.info("stale_registration_replaced", bookie_id=self._record.bookie_id)
                try:
                    await asyncio.wait_for(self._store.delete(self._key), self._op_timeout_s)
                except NoSuchKeyError:
                    pass
                await asyncio.wait_for(self._store.create(self._key, data, ephemeral=True), self._op_timeout_s)
            self._set(True)
            log.info("bookie_registered", bookie_id=self._record.bookie_id, address=self._record.address,
                     region=self._record.region, zone=self._record.zone, rack=self._record.rack,
                     mode=self._record.mode.value, entry_size_max=self._record.entry_size_max)

    def _on_session(self, state: SessionState) -> None:
        if self._closed:
            return
        if state is SessionState.LOST:
            log.warning("metadata_session_lost", bookie_id=self._record.bookie_id)
            self._set(False)
            self._ensure_reregister()
        elif state is SessionState.CONNECTED and not self._registered:
            self._wake.set()
            self._ensure_reregister()

    def _ensure_reregister(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._reregister())

    async def _reregister(self) -> None:
        for _ in range(REGISTER_ATTEMPTS_MAX):
            if self._closed or self._registered:
                return
            if self._store.session.state is SessionState.CONNECTED:
                try:
                    await self._register_once()
                    return
                except (ScribaError, TimeoutError, OSError) as exc:
                    log.warning("reregister_failed", bookie_id=self._record.bookie_id, error=str(exc))
            self._wake.clear()
            try:  # the next attempt comes when the session reconnects, or after retry_s
                await asyncio.wait_for(self._wake.wait(), self._retry_s)
            except TimeoutError:
                pass

    async def set_mode(self, mode: BookieMode, free_bytes: int, total_bytes: int) -> None:
        """Record a mode change (and the disk figures) in the registration."""
        self._record = dataclasses.replace(
            self._record, mode=mode, free_bytes=free_bytes, total_bytes=total_bytes
        )
        if not self._registered or self._closed:
            return  # the next registration writes the new record
        want = self._record
        try:
            await asyncio.wait_for(
                update_metadata(
                    self._store,
                    self._key,
                    BOOKIE_CODEC,
                    lambda r: r != want,
                    lambda r: want,
                ),
                self._op_timeout_s,
            )
            log.info("registration_mode_changed", bookie_id=want.bookie_id, mode=mode.value)
        except NoSuchKeyError:
            self._set(False)
            self._ensure_reregister()
        except (MetadataError, TimeoutError) as exc:
            log.warning("registration_update_failed", bookie_id=want.bookie_id, error=str(exc))

    async def close(self) -> None:
        """Deregister (the record goes at once, not at session expiry)."""
        self._closed = True
        self._store.session.remove_listener(self._on_session)
        if self._task is not None:
            self._task.cancel()
        if self._registered:
            try:
                await asyncio.wait_for(self._store.delete(self._key), self._op_timeout_s)
            except (NoSuchKeyError, MetadataError, TimeoutError) as exc:
                log.warning("deregister_failed", bookie_id=self._record.bookie_id, error=str(exc))
            self._set(False)
        log.info("bookie_deregistered", bookie_id=self._record.bookie_id)
