"""Leader election on any :class:`~scriba.meta.store.MetadataStore`.

The leader is whoever holds the ephemeral record ``elections/<name>/leader``.
Its ``created`` revision (etcd create_revision, ZooKeeper czxid, memory
revision) is the fencing **token**: store-wide and strictly increasing, so every
new leader's token is larger than every earlier one's. Writers fence with it
(e.g. a leader-only record that refuses smaller tokens).

States of one campaign: CAMPAIGNING (create failed: watch the record until it is
gone, then try again; store errors are retried with backoff, ``scriba.retry``; a watch
that fails sends the campaign back to claiming, which re-reads the record) -> LEADING (the record holds our nonce) -> LOST (the
record vanished or changed, the session was LOST, or SUSPENDED for longer than
``suspended_grace_s``; ``Leadership.lost`` is set) or RESIGNED.
Inputs: the store's watch events and session states. Outputs: the
:class:`Leadership` handle and its ``lost`` event.
Invariant: ``lost`` is set before a successor can possibly be elected by the
store (LOST/vanished record), or within the grace after contact was lost.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Final

from scriba.errors import (
    BadRequestError,
    BadVersionError,
    KeyExistsError,
    MetadataUnavailableError,
    NoSuchKeyError,
    SessionExpiredError,
)
from scriba.log import get_logger
from scriba.meta.session import wait_connected
from scriba.meta.store import EventKind, MetadataStore, SessionState, Versioned
from scriba.retry import RetryPolicy, is_retriable, retry_async

log = get_logger(__name__)

SUSPENDED_GRACE_S: Final = 1.0
SESSION_WAIT_S: Final = 1.0
WITHDRAW_S: Final = 5.0
"""Bound on removing an abandoned claim after a cancelled campaign."""
CAMPAIGN_RETRY: Final = RetryPolicy(attempts_max=120, delay_s_min=0.1, delay_s_max=1.0).validate()
"""A campaign rides out about a minute and a half of store trouble, then raises."""


def _transient(error: BaseException) -> bool:
    """Worth another try: the store is unreachable, or its session is being replaced."""
    return is_retriable(error) or isinstance(error, SessionExpiredError)


def election_key(name: str) -> str:
    if not name or "/" in name:
        raise BadRequestError(f"bad election name {name!r}: one path segment")
    return f"elections/{name}/leader"


@dataclass(frozen=True, slots=True)
class _Claim:
    candidate: str
    nonce: str
    value: bytes

    def to_bytes(self) -> bytes:
        body = {"candidate": self.candidate, "nonce": self.nonce, "value": base64.b64encode(self.value).decode()}
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> _Claim:
        try:
            doc = json.loads(data)
            return cls(str(doc["candidate"]), str(doc["nonce"]), base64.b64decode(doc.get("value", "")))
        except (ValueError, KeyError, TypeError) as exc:
            raise BadRequestError(f"election record is not a claim: {exc}") from None


@dataclass(slots=True, eq=False)
class Leadership:
    """Held leadership: ``token`` fences, ``lost`` is set once it may no longer be trusted."""

    candidate: str
    token: int
    version: int
    nonce: str
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""

    def lose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.reason = reason
            self.lost.set()
            log.info("leadership_lost", candidate=self.candidate, token=self.token, reason=reason)


class Election:
    """One named election on a store: campaign / resign / leader / observe."""

    def __init__(self, store: MetadataStore, name: str, *, suspended_grace_s: float = SUSPENDED_GRACE_S) -> None:
        self.store = store
        self.name = name
        self.key = election_key(name)
        self.suspended_grace_s = suspended_grace_s
        self._leadership: Leadership | None = None
        self._monitor: asyncio.Task[None] | None = None

    @property
    def leadership(self) -> Leadership | None:
        return self._leadership

    async def campaign(self, candidate: str, value: bytes = b"") -> Leadership:
        """Wait until this candidate leads (wrap in ``asyncio.timeout`` to bound the wait).

        Raises ``MetadataUnavailableError`` / ``SessionExpiredError`` only after the store
        failed :data:`CAMPAIGN_RETRY`'s attempts in a row.
        """
        if self._leadership is not None and not self._leadership.lost.is_set():
            raise BadRequestError(f"election {self.name}: {self._leadership.candidate} already leads here")
        claim = _Claim(candidate, uuid.uuid4().hex, value)
        try:
            # Hand-written outer loop: waiting for a vacancy is not an error to back off from.
            while True:
                record = await retry_async(
                    lambda: self._claim(claim), policy=CAMPAIGN_RETRY, what=f"campaign {self.name}",
                    retry_if=_transient, on_retry=self._log_retry,
                )
                if record is not None:
                    return self._lead(claim, record)
                try:
                    await self._wait_vacant()
                except Exception as exc:
                    if not _transient(exc):
                        raise
                    # The watch gave up (the store out of reach too long): claim again, which
                    # re-reads the record, rather than end the campaign on a wait.
                    log.info("campaign_watch_failed", election=self.name, error=str(exc))
        except BaseException:
            # Cancelled or failed after our create may have landed: a claim left behind would
            # hold the election for our whole session with nobody leading. Withdraw it (shielded,
            # so a second cancellation cannot stop the clean-up half-way).
            await asyncio.shield(self._withdraw(claim))
            raise

    async def _withdraw(self, claim: _Claim) -> None:
        """Delete the leader record if it holds this (abandoned) claim; best effort, bounded."""
        try:
            async with asyncio.timeout(WITHDRAW_S):
                record = await self.store.get(self.key)
                if _Claim.from_bytes(record.value).nonce == claim.nonce:
                    await self.store.delete(self.key, expected_version=record.version)
                    log.info("campaign_withdrawn", election=self.name, candidate=claim.candidate)
        except Exception as exc:  # the record dies with our session anyway
            log.info("campaign_withdraw_failed", election=self.name, error=str(exc))

    async def _claim(self, claim: _Claim) -> Versioned[bytes] | None:
        """One try: the leader record if it is ours now, else None (someone else leads)."""
        await self._wait_connected()
        try:
            await self.store.create(self.key, claim.to_bytes(), ephemeral=True)
        except KeyExistsError:
            pass  # another leads -- or we do, if an earlier try's answer was lost
        try:
            record = await self.store.get(self.key)
        except NoSuchKeyError:
            return None  # the leader (or our session) went meanwhile: the vacancy wait sees it
        return record if _Claim.from_bytes(record.value).nonce == claim.nonce else None

    def _log_retry(self, attempt: int, error: BaseException, delay_s: float) -> None:
        log.info("campaign_retry", election=self.name, attempt=attempt, error=str(error))

    def _lead(self, claim: _Claim, record: Versioned[bytes]) -> Leadership:
        leadership = Leadership(claim.candidate, record.created, record.version, claim.nonce)
        self._leadership = leadership
        self._monitor = asyncio.create_task(self._watch_leadership(leadership), name=f"election {self.name}")
        log.info("leadership_acquired", election=self.name, candidate=claim.candidate, token=record.created)
        return leadership

    async def _wait_connected(self) -> None:
        while self.store.session.state is not SessionState.CONNECTED:  # the session may be replaced
            with contextlib.suppress(MetadataUnavailableError):
                await wait_connected(self.store.session, SESSION_WAIT_S)

    async def _wait_vacant(self) -> None:
        """Return once the leader record is absent (after the watch has synced)."""
        present, synced = False, False
        async with contextlib.aclosing(self.store.watch(self.key)) as events:
            async for event in events:
                if event.kind is EventKind.PUT:
                    present = True
                elif event.kind is EventKind.DELETE:
                    present = False
                else:
                    synced = True
                if synced and not present:
                    return

    async def _watch_leadership(self, leadership: Leadership) -> None:
        """Set ``lost`` when the record vanishes or changes, or the session says so."""
        suspended_timer: asyncio.TimerHandle | None = None
        loop = asyncio.get_running_loop()

        def on_state(state: SessionState) -> None:
            nonlocal suspended_timer
            if state is SessionState.LOST:
                leadership.lose("session lost")
            elif state is SessionState.SUSPENDED and suspended_timer is None:
                suspended_timer = loop.call_later(
                    self.suspended_grace_s, leadership.lose, f"session suspended > {self.suspended_grace_s}s"
                )
            elif state is SessionState.CONNECTED and suspended_timer is not None:
                suspended_timer.cancel()
                suspended_timer = None

        session = self.store.session
        session.add_listener(on_state)
        if session.state is not SessionState.CONNECTED:
            on_state(session.state)
        watch_task = asyncio.create_task(self._watch_record(leadership))
        try:
            await leadership.lost.wait()
        finally:
            session.remove_listener(on_state)
            if suspended_timer is not None:
                suspended_timer.cancel()
            watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watch_task

    async def _watch_record(self, leadership: Leadership) -> None:
        present, synced = False, False
        try:
            async with contextlib.aclosing(self.store.watch(self.key)) as events:
                async for event in events:
                    if event.kind is EventKind.SYNCED:
                        synced = True
                    elif event.kind is EventKind.DELETE:
                        present = False
                    else:
                        present = _Claim.from_bytes(event.value or b"{}").nonce == leadership.nonce
                    if synced and not present:
                        leadership.lose("leader record gone")
                        return
            leadership.lose("watch ended (store closed)")
        except Exception as exc:  # the watch itself failed: we cannot vouch for leadership
            leadership.lose(f"watch failed: {exc}")

    async def resign(self) -> None:
        """Give up leadership (delete our record if it is still ours)."""
        leadership = self._leadership
        if leadership is None:
            return
        self._leadership = None
        try:
            if not leadership.lost.is_set():
                # Delete only our own record: ``created`` is unique per incarnation on every
                # driver (a ZooKeeper version restarts at 0 when a znode is re-created).
                record = await self.store.get(self.key)
                if record.created == leadership.token:
                    await self.store.delete(self.key, expected_version=record.version)
        except (NoSuchKeyError, BadVersionError):
            pass
        finally:
            leadership.lose("resigned")
            if self._monitor is not None:
                await self._monitor
                self._monitor = None

    async def leader(self) -> tuple[str, int] | None:
        """The current leader's candidate name and token, or None."""
        try:
            record = await self.store.get(self.key)
        except NoSuchKeyError:
            return None
        return _Claim.from_bytes(record.value).candidate, record.created

    async def observe(self) -> AsyncIterator[tuple[str, int] | None]:
        """The leader now (after the watch synced), then every change; None while there is none."""
        last: tuple[str, int] | bool | None = False  # False: nothing yielded yet
        synced = False
        async with contextlib.aclosing(self.store.watch(self.key)) as events:
            async for event in events:
                if event.kind is EventKind.SYNCED:
                    synced = True
                elif not synced:
                    continue
                current = await self.leader()
                if current != last:
                    last = current
                    yield current
