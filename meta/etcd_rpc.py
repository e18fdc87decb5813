"""Calls to etcd v3 over one channel: deadlines, retries, log-in, what gRPC errors become.

Speaks etcd's gRPC API through the protobuf stubs of ``aetcd`` (``aetcd.rpc``). aetcd's
own ``Client`` is not used: it has no paginated range, no lease keep-alive stream and
one shared watch stream without resume.

Keys: key = ``PREFIX/`` + key (:meth:`EtcdRpc.k`, :meth:`EtcdRpc.unk`); a record's
``version`` = mod_revision, ``created`` = create_revision (both store-wide revisions,
strictly increasing), ``owner`` = the key's lease in hex (:func:`versioned`).

Retries (``scriba.retry``, bounded, jittered; :meth:`EtcdRpc.call`): reads retry
UNAVAILABLE within the request deadline; writes retry only errors that prove nothing
was applied ("no leader", etcd clientv3's rule), otherwise raise
``MetadataUnavailableError`` (outcome unknown). The watch and the lease keep-alive are
long-lived streams that resume by hand, not calls to retry; they register their calls
here (``calls``) so that closing cancels them.

Authentication: ``user=`` with ``password_file=``/``password_env=`` logs in once at
open (:meth:`EtcdRpc.authenticate`) and the channel sends the token with every call
(``scriba.meta.etcd_channel``); a token etcd forgot (a restart) is renewed once and
the call retried. A wrong password is an ``UnauthorizedError`` at open.

Errors (:meth:`EtcdRpc.error`): PERMISSION_DENIED / UNAUTHENTICATED -> ``UnauthorizedError``
naming the user (etcd RBAC, e.g. keys outside Scriba's prefix); UNAVAILABLE,
DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, and CANCELLED after close ->
``MetadataUnavailableError``; "too large" -> ``ValueTooLargeError``; a lease etcd no
longer knows -> ``SessionExpiredError``; anything else ``InternalError``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import grpc
import grpc.aio
from aetcd import rpc  # type: ignore[import-untyped]

from scriba.clock import SystemClock
from scriba.errors import (
    InternalError,
    MetadataUnavailableError,
    ScribaError,
    SessionExpiredError,
    UnauthorizedError,
    ValueTooLargeError,
)
from scriba.invariant import invariant
from scriba.meta.etcd_channel import TokenAuth
from scriba.meta.store import Versioned
from scriba.retry import RetryPolicy, retry_async

R = TypeVar("R")

REQUEST_TIMEOUT_S: Final = 10.0
RPC_ATTEMPTS_MAX: Final = 20
RETRY_DELAY_S_MIN: Final = 0.05
RETRY_DELAY_S_MAX: Final = 0.5
RPC_RETRY: Final = RetryPolicy(RPC_ATTEMPTS_MAX, RETRY_DELAY_S_MIN, RETRY_DELAY_S_MAX).validate()
LIST_PAGE_MAX: Final = 500


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix``."""
    s = bytearray(prefix)
    for i in reversed(range(len(s))):
        if s[i] < 0xFF:
            s[i] += 1
            return bytes(s[: i + 1])
    return b"\x00"


def versioned(kv: Any) -> Versioned[bytes]:
    return Versioned(bytes(kv.value), kv.mod_revision, kv.create_revision, f"{kv.lease:x}" if kv.lease else "")


def _safe_to_retry_write(exc: grpc.aio.AioRpcError) -> bool:
    """True if the failed write certainly was not applied (etcd clientv3's rule)."""
    details = (exc.details() or "").lower()
    return exc.code() == grpc.StatusCode.UNAVAILABLE and (
        "no leader" in details or "failed to connect" in details or "no address" in details
    )


class EtcdRpc:
    """One channel's stubs and calls, under the key prefix ``root``."""

    def __init__(
        self,
        uri: str,
        hosts_text: str,
        root: str,
        channel: grpc.aio.Channel,
        *,
        auth: TokenAuth | None = None,
        credentials: tuple[str, str] = ("", ""),
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.uri = uri
        self.hosts_text = hosts_text
        self.request_timeout_s = request_timeout_s
        self.channel = channel
        self.kv = rpc.KVStub(channel)
        self.lease = rpc.LeaseStub(channel)
        self.calls: set[grpc.aio.Call] = set()  # open streams, cancelled by close()
        self.closed = False
        self._root = root
        self._auth = auth
        self._credentials = credentials  # etcd user and password (never logged)
        self._clock = SystemClock()

    def check_open(self) -> None:
        invariant(not self.closed, f"{self.uri}: store used after close()")

    def k(self, key: str) -> bytes:
        return (self._root + key).encode()

    def unk(self, raw: bytes) -> str:
        return raw.decode()[len(self._root) :]

    async def close(self) -> None:
        """Cancel the open streams and close the channel."""
        self.closed = True
        for call in list(self.calls):
            call.cancel()
        await self.channel.close()

    async def authenticate(self, timeout_s: float) -> None:
        """Log in as the URI's user (no-op without one); UnauthorizedError if refused."""
        if self._auth is None:
            return
        user, password = self._credentials
        self._auth.token = ""
        try:
            resp = await rpc.AuthStub(self.channel).Authenticate(
                rpc.AuthenticateRequest(name=user, password=password), timeout=timeout_s, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED,
                              grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION):
                raise UnauthorizedError(
                    f"etcd at {self.hosts_text}: user {user!r} refused: {exc.details()}") from None
            raise self.error("authenticate", exc) from None
        self._auth.token = resp.token
        self._auth.stale = False

    def error(self, what: str, exc: grpc.aio.AioRpcError) -> ScribaError:
        code, details = exc.code(), exc.details() or ""
        where = f"{what}: etcd at {self.hosts_text}"
        if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
            user = self._credentials[0] or "(certificate or anonymous)"
            return UnauthorizedError(f"{where}: user {user}: {details}")
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED):
            return MetadataUnavailableError(f"{where}: {code.name.lower()}: {details}")
        if code is grpc.StatusCode.CANCELLED and self.closed:
            return MetadataUnavailableError(f"{where}: store closed")
        if code is grpc.StatusCode.INVALID_ARGUMENT and "too large" in details:
            return ValueTooLargeError(f"{where}: {details}")
        if code is grpc.StatusCode.NOT_FOUND and "lease" in details:
            return SessionExpiredError(f"{where}: {details}")
        return InternalError(f"{where}: {code.name}: {details}")

    def _token_expired(self, exc: BaseException) -> bool:
        """True (and the token marked stale) when etcd no longer knows this client's token."""
        if (self._auth is None or not isinstance(exc, grpc.aio.AioRpcError)
                or exc.code() is not grpc.StatusCode.UNAUTHENTICATED or "invalid auth token" not in (exc.details() or "")):
            return False
        self._auth.stale = True
        return True

    async def call(
        self,
        what: str,
        method: Callable[..., Awaitable[R]],
        request: Any,
        *,
        idempotent: bool,
        timeout_s: float | None = None,
    ) -> R:
        """One unary call with a deadline; retries what is safe to retry within it."""
        self.check_open()
        budget_s = timeout_s if timeout_s is not None else self.request_timeout_s
        deadline = self._clock.monotonic() + budget_s

        async def attempt() -> R:
            remaining_s = deadline - self._clock.monotonic()
            if remaining_s <= 0:
                raise MetadataUnavailableError(f"{what}: etcd at {self.hosts_text}: no answer within {budget_s:.1f}s")
            if self._auth is not None and self._auth.stale:
                await self.authenticate(remaining_s)
            return await method(request, timeout=remaining_s, wait_for_ready=True)

        def worth_retrying(exc: BaseException) -> bool:
            if self._token_expired(exc):
                return True  # etcd refused the token before doing anything: log in again
            # Narrower than the error tree's flag: an UNAVAILABLE write may have been applied.
            return (
                isinstance(exc, grpc.aio.AioRpcError)
                and exc.code() == grpc.StatusCode.UNAVAILABLE
                and (idempotent or _safe_to_retry_write(exc))
            )

        try:
            return await retry_async(
                attempt, policy=RPC_RETRY, what=what, deadline=deadline, retry_if=worth_retrying, clock=self._clock
            )
        except grpc.aio.AioRpcError as exc:
            raise self.error(what, exc) from None
