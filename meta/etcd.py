"""``etcd://HOST:PORT[,HOST:PORT...]/PREFIX``: the metadata store on etcd v3.

Speaks etcd's gRPC API through the protobuf stubs of ``aetcd`` (``aetcd.rpc``) on
one ``grpc.aio`` channel over every endpoint (pick-first: a dead member's calls
move to the next). aetcd's own ``Client`` is not used: it has no paginated range,
no lease keep-alive stream and one shared watch stream without resume.

Mapping: key = ``PREFIX/`` + key; ``version`` = mod_revision, ``created`` =
create_revision (both store-wide revisions, strictly increasing), ``owner`` = the
key's lease in hex (the session id of the lease's session); create, CAS
set and conditional delete are etcd transactions; ids come from ranges reserved
by CAS on a counter at ``ids/<name>`` (``scriba.meta.id_ranges``).

Session: one lease (TTL = the session timeout) kept alive by a background task
over a LeaseKeepAlive stream every TTL/3. Ephemerals are put with that lease.
States: keep-alive answered -> CONNECTED; keep-alive failing -> SUSPENDED; the
server says the lease is gone (TTL <= 0) -> LOST, then a new lease is granted and
the session reports CONNECTED with a new ``session_id`` (the lease id in hex).

Watch: read the current state at revision R (paged, every page at R), deliver it,
SYNCED, then watch from R+1; after a broken stream resume from the last revision
delivered + 1; if that revision was compacted, re-read and deliver the difference.
A stream silent for ``WATCH_IDLE_S`` is asked for a progress report; one that does not
answer is taken for dead (its connection's pings may still pass) and resumed likewise.

Security (URI options, ``scriba.meta.uri``): ``etcd+tls://`` dials TLS and verifies the
server's certificate and name (``ca=``; ``cert=``/``key=`` for etcd's client-certificate
authentication, where etcd takes the certificate's CN as the user). ``user=`` with
``password_file=``/``password_env=`` authenticates once at open and sends the token
with every call (gRPC call credentials, so only over TLS); a token etcd forgot (a
restart) is renewed once and the call retried. A wrong password is an
``UnauthorizedError`` at open; a call outside the user's role (etcd RBAC, e.g. keys
outside Scriba's prefix) an ``UnauthorizedError`` naming the user. Never a fallback to
plaintext or to no authentication.

Retries (``scriba.retry``, bounded, jittered): reads retry UNAVAILABLE within the
request deadline; writes retry only errors that prove nothing was applied ("no
leader"), otherwise raise ``MetadataUnavailableError`` (outcome unknown). The watch
and the lease keep-alive are long-lived streams that resume by hand (their own
outage bound, or the store's life), not calls to retry.
"""

from __future__ import annotations

import asyncio
import builtins
import ipaddress
import math
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

import grpc
import grpc.aio
from aetcd import rpc  # type: ignore[import-untyped]

from scriba.clock import SystemClock
from scriba.errors import (
    BadRequestError,
    BadVersionError,
    ConfigError,
    InternalError,
    KeyExistsError,
    MetadataUnavailableError,
    NoSuchKeyError,
    ScribaError,
    SessionExpiredError,
    UnauthorizedError,
    ValueTooLargeError,
)
from scriba.invariant import invariant
from scriba.log import get_logger
from scriba.meta.credentials import secret
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
from scriba.retry import RetryPolicy, retry_async
from scriba.tls import TlsConfig

log = get_logger(__name__)

R = TypeVar("R")

REQUEST_TIMEOUT_S: Final = 10.0
RPC_ATTEMPTS_MAX: Final = 20
RETRY_DELAY_S_MIN: Final = 0.05
RETRY_DELAY_S_MAX: Final = 0.5
RPC_RETRY: Final = RetryPolicy(RPC_ATTEMPTS_MAX, RETRY_DELAY_S_MIN, RETRY_DELAY_S_MAX).validate()
LIST_PAGE_MAX: Final = 500
LIST_LIMIT_MAX: Final = 10_000
TXN_OPS_MAX: Final = 128
WATCH_OUTAGE_S_MAX: Final = 60.0
WATCH_IDLE_S: Final = 5.0
"""Silence on a watch stream after which the watch asks etcd for a progress report."""
WATCH_PROGRESS_TIMEOUT_S: Final = 10.0
"""No answer this long after asking: the stream is dead, though its connection may look alive."""
CLOSE_REVOKE_TIMEOUT_S: Final = 1.0
MESSAGE_BYTES_MAX: Final = 512 * 1024 * 1024

_CHANNEL_OPTIONS: Final = [
    ("grpc.lb_policy_name", "pick_first"),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 3_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
    ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
]
_WATCH_METADATA: Final = (("hasleader", "true"),)  # the server cancels the watch if its member loses the leader


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix``."""
    s = bytearray(prefix)
    for i in reversed(range(len(s))):
        if s[i] < 0xFF:
            s[i] += 1
            return bytes(s[: i + 1])
    return b"\x00"


def _safe_to_retry_write(exc: grpc.aio.AioRpcError) -> bool:
    """True if the failed write certainly was not applied (etcd clientv3's rule)."""
    details = (exc.details() or "").lower()
    return exc.code() == grpc.StatusCode.UNAVAILABLE and (
        "no leader" in details or "failed to connect" in details or "no address" in details
    )


async def _target(hosts: Sequence[tuple[str, int]]) -> str:
    """A gRPC target naming every endpoint (``ipv4:a:p,b:p`` / ``ipv6:[a]:p,...``)."""
    loop = asyncio.get_running_loop()
    v4: list[str] = []
    v6: list[str] = []
    for host, port in hosts:
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            try:
                infos = await loop.getaddrinfo(host, port, type=1)  # SOCK_STREAM
            except OSError as exc:
                raise MetadataUnavailableError(f"etcd at {host}:{port}: cannot resolve {host!r}: {exc}") from None
            addr = ipaddress.ip_address(infos[0][4][0])
        if addr.version == 4:
            v4.append(f"{addr}:{port}")
        else:
            v6.append(f"[{addr}]:{port}")
    if v4 and v6:
        raise BadRequestError("etcd endpoints mix IPv4 and IPv6 addresses; use one family")
    return "ipv4:" + ",".join(v4) if v4 else "ipv6:" + ",".join(v6)


class _TokenAuth(grpc.AuthMetadataPlugin):
    """Call credentials: etcd's auth token on every call (empty until authenticated)."""

    def __init__(self) -> None:
        self.token = ""
        self.stale = False

    def __call__(self, context: Any, callback: Any) -> None:
        callback((("token", self.token),) if self.token else (), None)


def _open_channel(parsed: MetadataUri, target: str) -> tuple[grpc.aio.Channel, _TokenAuth | None]:
    """The channel the URI asks for: plaintext, or TLS (+ token call credentials)."""
    if not parsed.tls:
        return grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS), None
    def path(name: str) -> Any:
        value = parsed.option(name)
        return None if value is None else Path(value)

    loaded = TlsConfig(cert=path("cert"), key=path("key"), ca=path("ca")).load()
    creds = loaded.grpc_channel_credentials()
    auth = _TokenAuth() if parsed.option("user") is not None else None
    if auth is not None:
        creds = grpc.composite_channel_credentials(creds, grpc.metadata_call_credentials(auth))
    host = parsed.hosts[0][0]  # the name checked in every member's certificate
    options = [*_CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", host), ("grpc.default_authority", host)]
    return grpc.aio.secure_channel(target, creds, options=options), auth


class EtcdStore:
    """Implements ``scriba.meta.store.MetadataStore`` on etcd v3."""

    def __init__(
        self,
        parsed: MetadataUri,
        channel: grpc.aio.Channel,
        *,
        session_timeout_s: float,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.uri = parsed.text
        self.hosts_text = parsed.hosts_text
        self.session_timeout_s = session_timeout_s
        self.request_timeout_s = request_timeout_s
        self._root = parsed.path + "/"
        self._channel = channel
        self._kv = rpc.KVStub(channel)
        self._lease = rpc.LeaseStub(channel)
        self._watch = rpc.WatchStub(channel)
        self._ttl_s = max(1, math.ceil(session_timeout_s))
        self._lease_id: int | None = None
        self._session = BasicSession("-")
        self._session_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._calls: set[grpc.aio.Call] = set()
        self._ids = IdRanges(self)
        self._clock = SystemClock()
        self._closed = False
        self._auth: _TokenAuth | None = None
        self._credentials = ("", "")  # etcd user and password (never logged)

    # --- opening, closing ---------------------------------------------------

    @classmethod
    async def open(
        cls,
        parsed: MetadataUri | str,
        *,
        connect_timeout_s: float = 5.0,
        session_timeout_s: float = 10.0,
    ) -> EtcdStore:
        """Connect within ``connect_timeout_s`` (else MetadataUnavailableError naming the address)."""
        if isinstance(parsed, str):
            parsed = parse_uri(parsed)
        invariant(parsed.scheme == "etcd", f"EtcdStore cannot open {parsed.text!r}")
        password = secret(parsed, "password_file", "password_env")
        channel, auth = _open_channel(parsed, await _target(parsed.hosts))
        store = cls(parsed, channel, session_timeout_s=session_timeout_s)
        store._auth = auth
        store._credentials = (parsed.option("user") or "", password or "")
        try:
            await asyncio.wait_for(channel.channel_ready(), connect_timeout_s)
            await store._authenticate(connect_timeout_s)
            lease_id = await store._grant_lease(connect_timeout_s)
        except (UnauthorizedError, ConfigError):
            await channel.close()
            raise
        except (TimeoutError, ScribaError) as exc:
            await channel.close()
            why = "not reachable" if isinstance(exc, TimeoutError) else str(exc)
            raise MetadataUnavailableError(
                f"etcd at {parsed.hosts_text}: {why} (connect timeout {connect_timeout_s:.1f}s)"
            ) from None
        except BaseException:
            await channel.close()
            raise
        store._lease_id = lease_id
        store._session = BasicSession(f"{lease_id:x}")
        store._session_task = asyncio.create_task(store._session_loop(), name=f"etcd-session {parsed.text}")
        return store

    async def close(self) -> None:
        """Revoke the lease (ephemerals go at once), end watches and the channel."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        if self._session_task is not None:
            self._session_task.cancel()
            try:
                await self._session_task
            except asyncio.CancelledError:
                pass
        if self._lease_id is not None:
            try:
                await self._lease.LeaseRevoke(
                    rpc.LeaseRevokeRequest(ID=self._lease_id), timeout=CLOSE_REVOKE_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as exc:
                log.warning("etcd_lease_revoke_failed", error=exc.details(), hosts=self.hosts_text)
            self._lease_id = None
        for call in list(self._calls):
            call.cancel()
        await self._channel.close()

    async def __aenter__(self) -> EtcdStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def session(self) -> BasicSession:
        return self._session

    # --- RPC plumbing -------------------------------------------------------

    def _check_open(self) -> None:
        invariant(not self._closed, f"{self.uri}: store used after close()")

    def _k(self, key: str) -> bytes:
        return (self._root + key).encode()

    def _unk(self, raw: bytes) -> str:
        return raw.decode()[len(self._root) :]

    async def _authenticate(self, timeout_s: float) -> None:
        """Log in as the URI's user (no-op without one); UnauthorizedError if refused."""
        if self._auth is None:
            return
        user, password = self._credentials
        self._auth.token = ""
        try:
            resp = await rpc.AuthStub(self._channel).Authenticate(
                rpc.AuthenticateRequest(name=user, password=password), timeout=timeout_s, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED,
                              grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION):
                raise UnauthorizedError(
                    f"etcd at {self.hosts_text}: user {user!r} refused: {exc.details()}") from None
            raise self._error("authenticate", exc) from None
        self._auth.token = resp.token
        self._auth.stale = False

    def _error(self, what: str, exc: grpc.aio.AioRpcError) -> ScribaError:
        code, details = exc.code(), exc.details() or ""
        where = f"{what}: etcd at {self.hosts_text}"
        if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
            user = self._credentials[0] or "(certificate or anonymous)"
            return UnauthorizedError(f"{where}: user {user}: {details}")
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED):
            return MetadataUnavailableError(f"{where}: {code.name.lower()}: {details}")
        if code is grpc.StatusCode.CANCELLED and self._closed:
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

    async def _rpc(
        self,
        what: str,
        method: Callable[..., Awaitable[R]],
        request: Any,
        *,
        idempotent: bool,
        timeout_s: float | None = None,
    ) -> R:
        """One unary call with a deadline; retries what is safe to retry within it."""
        self._check_open()
        budget_s = timeout_s if timeout_s is not None else self.request_timeout_s
        deadline = self._clock.monotonic() + budget_s

        async def attempt() -> R:
            remaining_s = deadline - self._clock.monotonic()
            if remaining_s <= 0:
                raise MetadataUnavailableError(f"{what}: etcd at {self.hosts_text}: no answer within {budget_s:.1f}s")
            if self._auth is not None and self._auth.stale:
                await self._authenticate(remaining_s)
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
            raise self._error(what, exc) from None

    def _versioned(self, kv: Any) -> Versioned[bytes]:
        return Versioned(bytes(kv.value), kv.mod_revision, kv.create_revision, f"{kv.lease:x}" if kv.lease else "")

    @staticmethod
    def _cmp(key: bytes, target: int, result: int, **value: int) -> Any:
        return rpc.Compare(key=key, target=target, result=result, **value)

    async def serving_member(self) -> tuple[str, bool]:
        """The client URL of the member this connection talks to, and whether it leads (diagnostics)."""
        status = await self._rpc(
            "status", rpc.MaintenanceStub(self._channel).Status, rpc.StatusRequest(), idempotent=True
        )
        members = await self._rpc(
            "member list", rpc.ClusterStub(self._channel).MemberList, rpc.MemberListRequest(), idempotent=True
        )
        me = status.header.member_id
        urls = [m.clientURLs[0] for m in members.members if m.ID == me and m.clientURLs]
        return (urls[0] if urls else f"member {me:x}"), status.leader == me

    # --- records --------------------------------------------------------------

    async def get(self, key: str) -> Versioned[bytes]:
        kb = self._k(check_key(key))
        resp = await self._rpc(f"get {key}", self._kv.Range, rpc.RangeRequest(key=kb), idempotent=True)
        if not resp.kvs:
            raise NoSuchKeyError(f"{key}: no such key")
        return self._versioned(resp.kvs[0])

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> int:
        kb = self._k(check_key(key))
        value = check_value(key, value)
        lease = 0
        if ephemeral:
            if self._lease_id is None:
                raise SessionExpiredError(f"{key}: the session is {self._session.state.value}; no lease")
            lease = self._lease_id
        request = rpc.TxnRequest(
            compare=[self._cmp(kb, rpc.Compare.CREATE, rpc.Compare.EQUAL, create_revision=0)],
            success=[rpc.RequestOp(request_put=rpc.PutRequest(key=kb, value=value, lease=lease))],
        )
        try:
            resp = await self._rpc(f"create {key}", self._kv.Txn, request, idempotent=False)
        except SessionExpiredError:
            self._wake.set()  # let the session loop notice the lost lease now
            raise
        if not resp.succeeded:
            raise KeyExistsError(f"{key}: already exists")
        return int(resp.header.revision)

    async def set(self, key: str, value: bytes, *, expected_version: int) -> int:
        kb = self._k(check_key(key))
        value = check_value(key, value)
        request = rpc.TxnRequest(
            compare=[
                self._cmp(kb, rpc.Compare.VERSION, rpc.Compare.GREATER, version=0),
                self._cmp(kb, rpc.Compare.MOD, rpc.Compare.EQUAL, mod_revision=expected_version),
            ],
            success=[rpc.RequestOp(request_put=rpc.PutRequest(key=kb, value=value, ignore_lease=True))],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=kb, keys_only=True))],
        )
        resp = await self._rpc(f"set {key}", self._kv.Txn, request, idempotent=False)
        if not resp.succeeded:
            self._raise_conflict(key, resp, expected_version)
        return int(resp.header.revision)

    def _raise_conflict(self, key: str, resp: Any, expected_version: int | None) -> None:
        kvs = resp.responses[0].response_range.kvs
        if not kvs:
            raise NoSuchKeyError(f"{key}: no such key")
        raise BadVersionError(f"{key}: version is {kvs[0].mod_revision}, expected {expected_version}")

    async def delete(self, key: str, *, expected_version: int | None = None) -> None:
        kb = self._k(check_key(key))
        compare = [self._cmp(kb, rpc.Compare.VERSION, rpc.Compare.GREATER, version=0)]
        if expected_version is not None:
            compare.append(self._cmp(kb, rpc.Compare.MOD, rpc.Compare.EQUAL, mod_revision=expected_version))
        request = rpc.TxnRequest(
            compare=compare,
            success=[rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=kb))],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=kb, keys_only=True))],
        )
        resp = await self._rpc(f"delete {key}", self._kv.Txn, request, idempotent=False)
        if not resp.succeeded:
            self._raise_conflict(key, resp, expected_version)

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> list[tuple[str, Versioned[bytes]]]:
        check_prefix(prefix)
        if limit is not None and not 0 < limit <= LIST_LIMIT_MAX:
            raise BadRequestError(f"list limit must be in 1..{LIST_LIMIT_MAX}, got {limit}")
        if start_after is not None and not start_after.startswith(prefix):
            start_after = prefix + start_after
        pb = self._k(prefix)
        end = _prefix_end(pb)
        start = pb if start_after is None else self._k(start_after) + b"\x00"
        wanted = limit if limit is not None else sys.maxsize  # None: every record (scan() pages)
        out: list[tuple[str, Versioned[bytes]]] = []
        revision = 0  # every page read at the first page's revision: one consistent listing
        while len(out) < wanted:
            request = rpc.RangeRequest(
                key=start, range_end=end, limit=min(LIST_PAGE_MAX, wanted - len(out)), revision=revision
            )
            resp = await self._rpc(f"list {prefix}", self._kv.Range, request, idempotent=True)
            revision = revision or int(resp.header.revision)
            for kv in resp.kvs:
                key = self._unk(kv.key)
                if is_direct_child(prefix, key):
                    out.append((key, self._versioned(kv)))
            if not resp.more or not resp.kvs:
                break
            start = bytes(resp.kvs[-1].key) + b"\x00"
        return out

    async def scan(self, prefix: str, *, page_size: int = 500) -> AsyncIterator[tuple[str, Versioned[bytes]]]:
        after: str | None = None
        while True:
            page = await self.list(prefix, start_after=after, limit=page_size)
            for item in page:
                yield item
            if len(page) < page_size:
                return
            after = page[-1][0]

    async def txn(self, checks: Sequence[Check], writes: Sequence[Put | Delete]) -> None:
        if len(checks) + len(writes) > TXN_OPS_MAX:
            raise BadRequestError(f"a transaction holds at most {TXN_OPS_MAX} checks and writes")
        compare = []
        for check in checks:
            kb = self._k(check_key(check.key))
            if check.version is None:
                compare.append(self._cmp(kb, rpc.Compare.CREATE, rpc.Compare.EQUAL, create_revision=0))
            else:
                if check.version <= 0:
                    raise BadRequestError(f"txn check {check.key}: version must be > 0 or None")
                compare.append(self._cmp(kb, rpc.Compare.MOD, rpc.Compare.EQUAL, mod_revision=check.version))
        ops = []
        for write in writes:
            kb = self._k(check_key(write.key))
            if isinstance(write, Put):
                ops.append(rpc.RequestOp(request_put=rpc.PutRequest(key=kb, value=check_value(write.key, write.value))))
            else:
                ops.append(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=kb)))
        failure = [rpc.RequestOp(request_range=rpc.RangeRequest(key=self._k(c.key), keys_only=True)) for c in checks]
        request = rpc.TxnRequest(compare=compare, success=ops, failure=failure)
        resp = await self._rpc("txn", self._kv.Txn, request, idempotent=False)
        if not resp.succeeded:
            found = []
            for check, op in zip(checks, resp.responses, strict=True):
                kvs = op.response_range.kvs
                actual = kvs[0].mod_revision if kvs else None
                if actual != check.version:
                    found.append(f"{check.key} is at {actual}, expected {check.version}")
            raise BadVersionError("txn check failed: " + "; ".join(found or ["a checked key changed"]))

    async def allocate_id(self, name: str) -> int:
        """From a range this client reserved (``scriba.meta.id_ranges``)."""
        self._check_open()
        return await self._ids.allocate(name)

    # --- watch ----------------------------------------------------------------

    async def _read_state(self, key: str, prefix: bool) -> tuple[dict[str, Versioned[bytes]], int]:
        """The watched key(s) at one revision R, and R."""
        kb = self._k(key)
        end = _prefix_end(kb) if prefix else b""
        state: dict[str, Versioned[bytes]] = {}
        revision = 0
        start = kb
        for _ in range(1_000_000):
            request = rpc.RangeRequest(key=start, range_end=end, limit=LIST_PAGE_MAX, revision=revision)
            resp = await self._rpc(f"watch {key}", self._kv.Range, request, idempotent=True)
            revision = revision or int(resp.header.revision)
            for kv in resp.kvs:
                k = self._unk(kv.key)
                if k == key or (prefix and is_direct_child(key, k)):
                    state[k] = self._versioned(kv)
            if not prefix or not resp.more or not resp.kvs:
                break
            start = bytes(resp.kvs[-1].key) + b"\x00"
        return state, revision

    async def watch(self, key: str, *, prefix: bool = False) -> AsyncGenerator[WatchEvent, None]:
        self._check_open()
        if prefix:
            check_prefix(key)
        else:
            check_key(key)
        state, revision = await self._read_state(key, prefix)
        known = {k: v.version for k, v in state.items()}
        for k in sorted(state):
            yield WatchEvent(EventKind.PUT, k, state[k].value, state[k].version)
        # This generator lives as long as its reader: it must hold no record it delivered
        # (``known`` keeps versions only), or every record deleted later stays in memory.
        del state
        yield WatchEvent(EventKind.SYNCED)
        loop = asyncio.get_running_loop()
        next_revision = revision + 1
        outage_since: float | None = None
        delay_s = RETRY_DELAY_S_MIN
        # Hand-written, not scriba.retry: a stream that resumes from its revision for as long as
        # its reader wants it, bounded by the outage time rather than by attempts.
        while not self._closed:
            call = self._watch.Watch(metadata=_WATCH_METADATA, wait_for_ready=True)
            self._calls.add(call)
            compacted = False
            try:
                kb = self._k(key)
                create = rpc.WatchCreateRequest(
                    key=kb, range_end=_prefix_end(kb) if prefix else b"", start_revision=next_revision
                )
                await call.write(rpc.WatchRequest(create_request=create))
                while True:
                    resp = await self._next_watch_response(call)
                    if resp is None:
                        log.warning("etcd_watch_stalled", key=key, revision=next_revision, hosts=self.hosts_text)
                        break
                    if resp is grpc.aio.EOF:
                        break
                    outage_since, delay_s = None, RETRY_DELAY_S_MIN
                    if resp.compact_revision:
                        compacted = True
                        break
                    if resp.canceled:
                        break
                    for ev in resp.events:
                        next_revision = ev.kv.mod_revision + 1
                        k = self._unk(ev.kv.key)
                        if prefix and not is_direct_child(key, k):
                            continue
                        if ev.type == rpc.Event.DELETE:
                            known.pop(k, None)
                            yield WatchEvent(EventKind.DELETE, k, None, ev.kv.mod_revision)
                        else:
                            known[k] = ev.kv.mod_revision
                            yield WatchEvent(EventKind.PUT, k, bytes(ev.kv.value), ev.kv.mod_revision)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:  # the stream broke
                if self._closed:
                    return
                why = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else "stream finished"
                log.info("etcd_watch_broken", key=key, error=why, hosts=self.hosts_text)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self._closed and task is not None and not task.cancelling():
                    return  # close() cancelled our call, not our caller
                raise
            finally:
                call.cancel()
                self._calls.discard(call)
            if self._closed:
                return
            if compacted:
                events, next_revision = await self._resync(key, prefix, known)
                events.reverse()
                while events:  # popped as delivered: nothing of them stays held after
                    yield events.pop()
                continue
            now = loop.time()
            outage_since = outage_since if outage_since is not None else now
            if now - outage_since > WATCH_OUTAGE_S_MAX:
                raise MetadataUnavailableError(
                    f"watch {key}: etcd at {self.hosts_text} unreachable for {WATCH_OUTAGE_S_MAX:.0f}s"
                )
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, RETRY_DELAY_S_MAX * 2)

    async def _next_watch_response(self, call: Any) -> Any:
        """The stream's next response (or EOF); None if the stream went silent for good.

        A watch on a quiet key is silent by design, so silence alone proves nothing: after
        :data:`WATCH_IDLE_S` the watch asks for a progress report, which etcd answers at once
        on a live stream. No answer within :data:`WATCH_PROGRESS_TIMEOUT_S` means the server no
        longer serves this stream (lost frames, a half-dead connection, a watch etcd dropped)
        even if the connection's keep-alive pings pass; the caller then resumes on a new stream.
        """
        read = asyncio.ensure_future(call.read())
        try:
            done, _ = await asyncio.wait({read}, timeout=WATCH_IDLE_S)
            if not done:
                probe = rpc.WatchRequest(progress_request=rpc.WatchProgressRequest())
                await asyncio.wait_for(call.write(probe), WATCH_PROGRESS_TIMEOUT_S)
                done, _ = await asyncio.wait({read}, timeout=WATCH_PROGRESS_TIMEOUT_S)
                if not done:
                    return None
            return read.result()
        except TimeoutError:
            return None
        finally:
            if not read.done():
                read.cancel()

    async def _resync(
        self, key: str, prefix: bool, known: dict[str, int]
    ) -> tuple[builtins.list[WatchEvent], int]:
        """After a compaction: the events from ``known`` to now, and the revision to watch from."""
        state, revision = await self._read_state(key, prefix)
        events = [WatchEvent(EventKind.DELETE, k, None, revision) for k in sorted(known.keys() - state.keys())]
        for k in sorted(state):
            if known.get(k) != state[k].version:
                events.append(WatchEvent(EventKind.PUT, k, state[k].value, state[k].version))
        known.clear()
        known.update({k: v.version for k, v in state.items()})
        log.info("etcd_watch_resynced", key=key, revision=revision)
        return events, revision + 1

    # --- session --------------------------------------------------------------

    async def _grant_lease(self, timeout_s: float | None = None) -> int:
        resp = await self._rpc(
            "grant lease", self._lease.LeaseGrant, rpc.LeaseGrantRequest(TTL=self._ttl_s),
            idempotent=True, timeout_s=timeout_s,
        )
        if resp.error:
            raise MetadataUnavailableError(f"grant lease: etcd at {self.hosts_text}: {resp.error}")
        return int(resp.ID)

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
        delay_s = RETRY_DELAY_S_MIN
        while not self._closed:
            if self._lease_id is None:
                try:
                    lease_id = await self._grant_lease(self._ttl_s)
                except (ScribaError, asyncio.InvalidStateError) as exc:
                    log.warning("etcd_lease_grant_failed", error=str(exc))
                    await self._pause(delay_s)
                    delay_s = min(delay_s * 2, RETRY_DELAY_S_MAX * 2)
                    continue
                self._lease_id = lease_id
                self._session.renew(f"{lease_id:x}")
            try:
                await self._keep_alive(self._lease_id)
                delay_s = RETRY_DELAY_S_MIN
            except Exception as exc:  # whatever broke the stream, this task must live on
                if self._closed:
                    return
                if self._lease_id is not None:
                    self._session.set_state(SessionState.SUSPENDED)
                if isinstance(exc, grpc.aio.AioRpcError | TimeoutError | ConnectionError | asyncio.InvalidStateError):
                    why = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else type(exc).__name__
                    log.info("etcd_keepalive_failed", error=why, hosts=self.hosts_text)
                else:
                    log.exception("etcd_keepalive_bug", hosts=self.hosts_text)
                await self._pause(delay_s)
                delay_s = min(delay_s * 2, RETRY_DELAY_S_MAX * 2)

    async def _keep_alive(self, lease_id: int) -> None:
        """One keep-alive stream; returns when the lease is gone, raises when the stream fails."""
        interval_s = self._ttl_s / 3
        call = self._lease.LeaseKeepAlive()
        self._calls.add(call)
        try:
            while not self._closed and self._lease_id == lease_id:
                await call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
                resp = await asyncio.wait_for(call.read(), interval_s)
                if resp is grpc.aio.EOF:
                    raise ConnectionError("keep-alive stream ended")
                if resp.TTL <= 0:
                    log.warning("etcd_lease_lost", lease=f"{lease_id:x}", hosts=self.hosts_text)
                    self._lease_id = None
                    self._session.set_state(SessionState.LOST)
                    return
                self._session.set_state(SessionState.CONNECTED)
                await self._pause(interval_s)
        finally:
            call.cancel()
            self._calls.discard(call)

    async def revoke_lease_for_test(self) -> None:
        """Revoke the lease behind the session's back, as an expiry the client has not yet
        noticed (a loop starved past the TTL): the next ephemeral write meets a lost lease."""
        lease_id = self._lease_id
        invariant(lease_id is not None, "revoke_lease_for_test: no live lease")
        await self._rpc("revoke lease", self._lease.LeaseRevoke, rpc.LeaseRevokeRequest(ID=lease_id), idempotent=True)

    async def expire_session_for_test(self) -> None:
        """Revoke the lease as an expiry would: ephemerals go, then LOST, then CONNECTED anew."""
        lease_id = self._lease_id
        invariant(lease_id is not None, "expire_session_for_test: no live lease")
        old = self._session.session_id
        await self._rpc("revoke lease", self._lease.LeaseRevoke, rpc.LeaseRevokeRequest(ID=lease_id), idempotent=True)
        self._wake.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout_s
        while self._session.session_id == old or self._session.state is not SessionState.CONNECTED:
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                raise MetadataUnavailableError(f"expire_session_for_test: no new session within {self.request_timeout_s}s")
            await self._session.wait_change(remaining_s)
