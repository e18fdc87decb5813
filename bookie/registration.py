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

Creating the record (:meth:`Registration.register`, one attempt; start-up retries it
within a bound, ``meta/startup.py``). A create that finds the key present reads the
record's owner (the session an ephemeral belongs to) and decides
(:func:`existing_registration`):

- owned by this store's current session: ours. An earlier attempt's create was applied
  but its answer was lost (a dropped connection, a deadline): it is kept, not created
  twice (nor deleted and created again, which watchers would see as the bookie leaving).
- owned by another session (or by none): an earlier incarnation of this bookie, killed
  before its session expired. It is replaced (deleted at the version read, then created):
  the cookie check has already proven that this process owns the bookie's data dirs, and
  their ``LOCK`` that no other process serves them.

A pass that finds the record changed under it looks again, at most
``REGISTER_PASSES_MAX`` times. A registration is only taken as done if the session that
created it is still the store's session; otherwise the next pass looks again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from collections.abc import Awaitable, Callable
from typing import TypeVar

from scriba.errors import (
    BadVersionError,
    KeyExistsError,
    MetadataError,
    MetadataUnavailableError,
    NoSuchKeyError,
    ScribaError,
)
from scriba.log import get_logger
from scriba.meta.records import BOOKIE_CODEC, BookieMode, BookieRegistration, bookie_key
from scriba.meta.store import MetadataStore, SessionState
from scriba.meta.update import update_metadata

log = get_logger(__name__)

T = TypeVar("T")

REGISTER_ATTEMPTS_MAX = 1_000_000  # bounded, but effectively "until shutdown"
REGISTER_PASSES_MAX = 8  # looks at a record that keeps changing, within one attempt


class Existing(enum.Enum):
    OURS = "ours"  # created by this session: keep it
    STALE = "stale"  # another session's (an earlier incarnation): replace it


def existing_registration(owner: str, session_id: str) -> Existing:
    """What to do with a registration record found in place (see the module docstring)."""
    return Existing.OURS if owner and owner == session_id else Existing.STALE


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
        self._session_id = ""  # the session that created the record
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

    def follow_session(self) -> None:
        """After the first registration: re-register whenever the session is lost."""
        session = self._store.session
        session.add_listener(self._on_session)
        if session.session_id != self._session_id or session.state is SessionState.LOST:
            self._on_session(SessionState.LOST)  # lost between the registration and now

    def _set(self, registered: bool) -> None:
        if registered != self._registered:
            self._registered = registered
            self._on_change(registered)

    async def _op(self, call: Awaitable[T]) -> T:
        return await asyncio.wait_for(call, self._op_timeout_s)

    async def register(self) -> None:
        """One attempt to create the record (errors propagate: the caller retries)."""
        async with self._lock:
            data = self._record.to_bytes()
            for _ in range(REGISTER_PASSES_MAX):
                session_id = self._store.session.session_id
                if await self._create_or_keep(data, session_id) and self._store.session.session_id == session_id:
                    self._session_id = session_id
                    self._set(True)
                    log.info("bookie_registered", bookie_id=self._record.bookie_id, address=self._record.address,
                             region=self._record.region, zone=self._record.zone, rack=self._record.rack,
                             mode=self._record.mode.value, entry_size_max=self._record.entry_size_max)
                    return
            raise MetadataUnavailableError(
                f"register {self._key}: the record kept changing ({REGISTER_PASSES_MAX} passes)"
            )

    async def _create_or_keep(self, data: bytes, session_id: str) -> bool:
        """One pass: True once the key holds our record, False to look again."""
        try:
            await self._op(self._store.create(self._key, data, ephemeral=True))
            return True
        except KeyExistsError:
            pass
        try:
            found = await self._op(self._store.get(self._key))
        except NoSuchKeyError:
            return False  # gone meanwhile: create it
        try:
            if existing_registration(found.owner, session_id) is Existing.OURS:
                log.info("registration_found_own", bookie_id=self._record.bookie_id, session_id=session_id)
                if found.value != data:
                    await self._op(self._store.set(self._key, data, expected_version=found.version))
                return True
            log.info("stale_registration_replaced", bookie_id=self._record.bookie_id, owner=found.owner)
            await self._op(self._store.delete(self._key, expected_version=found.version))
        except (NoSuchKeyError, BadVersionError):
            pass  # changed under us: look again
        return False

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
                    await self.register()
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
