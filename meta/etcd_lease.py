"""The etcd store's session: one lease, kept alive by a background task.

One lease (TTL = the session timeout, whole seconds) kept alive by a background task
over a LeaseKeepAlive stream every TTL/3. Ephemerals are put with that lease, so the
server deletes them when it expires or is revoked.

States: keep-alive answered -> CONNECTED; keep-alive failing -> SUSPENDED; the server
says the lease is gone (TTL <= 0) -> LOST, then a new lease is granted and the session
reports CONNECTED with a new ``session_id`` (the lease id in hex). A write that meets a
lease etcd no longer knows wakes the task (:meth:`EtcdLease.wake`) so the loss is
noticed at once rather than at the next keep-alive.

The task's loop is hand-written, not ``scriba.retry``: it must outlive any outage
(reporting SUSPENDED / LOST meanwhile), so it has no attempt bound; its back-off
doubles up to twice ``RETRY_DELAY_S_MAX`` and a wake cuts it short.
Closing revokes the lease (the ephemerals go at once), within ``CLOSE_REVOKE_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import math
from typing import Final

import grpc
import grpc.aio
from aetcd import rpc  # type: ignore[import-untyped]

from scriba.errors import MetadataUnavailableError, ScribaError
from scriba.invariant import invariant
from scriba.log import get_logger
from scriba.meta.etcd_rpc import RETRY_DELAY_S_MAX, RETRY_DELAY_S_MIN, EtcdRpc
from scriba.meta.session import BasicSession
from scriba.meta.store import SessionState

log = get_logger(__name__)

CLOSE_REVOKE_TIMEOUT_S: Final = 1.0


class EtcdLease:
    """The lease behind one store's session, and the task that keeps it alive."""

    def __init__(self, conn: EtcdRpc, *, session_timeout_s: float) -> None:
        self._conn = conn
        self._ttl_s = max(1, math.ceil(session_timeout_s))
        self.lease_id: int | None = None
        self.session = BasicSession("-")
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    async def grant(self, timeout_s: float | None = None) -> int:
        conn = self._conn
        resp = await conn.call(
            "grant lease", conn.lease.LeaseGrant, rpc.LeaseGrantRequest(TTL=self._ttl_s),
            idempotent=True, timeout_s=timeout_s,
        )
        if resp.error:
            raise MetadataUnavailableError(f"grant lease: etcd at {conn.hosts_text}: {resp.error}")
        return int(resp.ID)

    def start(self, lease_id: int) -> None:
        """The session begins on ``lease_id`` (granted at open); keep it alive from now on."""
        self.lease_id = lease_id
        self.session = BasicSession(f"{lease_id:x}")
        self._task = asyncio.create_task(self._session_loop(), name=f"etcd-session {self._conn.uri}")

    def wake(self) -> None:
        """Cut the task's current wait short (close, test hook, a lost lease met by a write)."""
        self._wake.set()

    async def close(self) -> None:
        """Stop the task and revoke the lease (its ephemerals go at once)."""
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self.lease_id is not None:
            try:
                await self._conn.lease.LeaseRevoke(
                    rpc.LeaseRevokeRequest(ID=self.lease_id), timeout=CLOSE_REVOKE_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as exc:
                log.warning("etcd_lease_revoke_failed", error=exc.details(), hosts=self._conn.hosts_text)
            self.lease_id = None

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake early when ``_wake`` is set (close, test hook, lost lease)."""
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            pass
        self._wake.clear()

    async def _session_loop(self) -> None:
        """Keep the lease alive; on loss grant a new one. Runs until close()."""
        # Hand-written, not scriba.retry: this loop must outlive any outage (it reports
        # SUSPENDED / LOST meanwhile), so it has no attempt bound.
        conn = self._conn
        delay_s = RETRY_DELAY_S_MIN
        while not conn.closed:
            if self.lease_id is None:
                try:
                    lease_id = await self.grant(self._ttl_s)
                except (ScribaError, asyncio.InvalidStateError) as exc:
                    log.warning("etcd_lease_grant_failed", error=str(exc))
                    await self._pause(delay_s)
                    delay_s = min(delay_s * 2, RETRY_DELAY_S_MAX * 2)
                    continue
                self.lease_id = lease_id
                self.session.renew(f"{lease_id:x}")
            try:
                await self._keep_alive(self.lease_id)
                delay_s = RETRY_DELAY_S_MIN
            except Exception as exc:  # whatever broke the stream, this task must live on
                if conn.closed:
                    return
                if self.lease_id is not None:
                    self.session.set_state(SessionState.SUSPENDED)
                if isinstance(exc, grpc.aio.AioRpcError | TimeoutError | ConnectionError | asyncio.InvalidStateError):
                    why = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else type(exc).__name__
                    log.info("etcd_keepalive_failed", error=why, hosts=conn.hosts_text)
                else:
                    log.exception("etcd_keepalive_bug", hosts=conn.hosts_text)
                await self._pause(delay_s)
                delay_s = min(delay_s * 2, RETRY_DELAY_S_MAX * 2)

    async def _keep_alive(self, lease_id: int) -> None:
        """One keep-alive stream; returns when the lease is gone, raises when the stream fails."""
        conn = self._conn
        interval_s = self._ttl_s / 3
        call = conn.lease.LeaseKeepAlive()
        conn.calls.add(call)
        try:
            while not conn.closed and self.lease_id == lease_id:
                await call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
                resp = await asyncio.wait_for(call.read(), interval_s)
                if resp is grpc.aio.EOF:
                    raise ConnectionError("keep-alive stream ended")
                if resp.TTL <= 0:
                    log.warning("etcd_lease_lost", lease=f"{lease_id:x}", hosts=conn.hosts_text)
                    self.lease_id = None
                    self.session.set_state(SessionState.LOST)
                    return
                self.session.set_state(SessionState.CONNECTED)
                await self._pause(interval_s)
        finally:
            call.cancel()
            conn.calls.discard(call)

    async def revoke_for_test(self) -> None:
        """Revoke the lease behind the session's back, as an expiry the client has not yet
        noticed (a loop starved past the TTL): the next ephemeral write meets a lost lease."""
        await self._revoke("revoke_lease_for_test")

    async def expire_for_test(self) -> None:
        """Revoke the lease as an expiry would: ephemerals go, then LOST, then CONNECTED anew."""
        old = self.session.session_id
        await self._revoke("expire_session_for_test")
        self._wake.set()
        loop = asyncio.get_running_loop()
        timeout_s = self._conn.request_timeout_s
        deadline = loop.time() + timeout_s
        while self.session.session_id == old or self.session.state is not SessionState.CONNECTED:
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                raise MetadataUnavailableError(f"expire_session_for_test: no new session within {timeout_s}s")
            await self.session.wait_change(remaining_s)

    async def _revoke(self, what: str) -> None:
        lease_id = self.lease_id
        invariant(lease_id is not None, f"{what}: no live lease")
        conn = self._conn
        await conn.call("revoke lease", conn.lease.LeaseRevoke, rpc.LeaseRevokeRequest(ID=lease_id), idempotent=True)
