"""``etcd://HOST:PORT[,HOST:PORT...]/PREFIX``: the metadata store on etcd v3.

Speaks etcd's gRPC API through the protobuf stubs of ``aetcd`` on one ``grpc.aio``
channel over every endpoint. The parts, each in its own module:

- ``scriba.meta.etcd_channel``: the channel the URI asks for (endpoints, TLS, token
  call credentials);
- ``scriba.meta.etcd_rpc``: calls with a deadline, what is safe to retry, log-in and
  token renewal, what gRPC errors become, key encoding;
- ``scriba.meta.etcd_lease``: the session, one lease kept alive by a background task;
- ``scriba.meta.etcd_watch``: watches that resume from their revision.

This module holds the store: opening and closing, the record operations as etcd
transactions, and ids.

Mapping: key = ``PREFIX/`` + key; ``version`` = mod_revision, ``created`` =
create_revision (both store-wide revisions, strictly increasing), ``owner`` = the
key's lease in hex (the session id of the lease's session); create, CAS set and
conditional delete are etcd transactions (compare create_revision = 0, or version > 0
and mod_revision = the expected version; on failure read the key, keys only, to tell
"no such key" from "another version"); ephemerals are put with the session's lease;
``txn`` checks become compares and its writes one transaction's puts and deletes;
ids come from ranges reserved by CAS on a counter at ``ids/<name>``
(``scriba.meta.id_ranges``).

Security: a wrong password is an ``UnauthorizedError`` at open; a call outside the
user's role (etcd RBAC) an ``UnauthorizedError`` naming the user; an unreachable
cluster ``MetadataUnavailableError`` naming the address and the connect timeout.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any, Final

from aetcd import rpc  # type: ignore[import-untyped]

from scriba.errors import (
    BadRequestError,
    BadVersionError,
    ConfigError,
    KeyExistsError,
    MetadataUnavailableError,
    NoSuchKeyError,
    ScribaError,
    SessionExpiredError,
    UnauthorizedError,
)
from scriba.invariant import invariant
from scriba.meta.credentials import secret
from scriba.meta.etcd_channel import grpc_target, open_channel
from scriba.meta.etcd_lease import EtcdLease
from scriba.meta.etcd_rpc import LIST_PAGE_MAX, EtcdRpc, prefix_end, versioned
from scriba.meta.etcd_watch import EtcdWatcher
from scriba.meta.id_ranges import IdRanges
from scriba.meta.session import BasicSession
from scriba.meta.store import (
    Check,
    Delete,
    Put,
    Versioned,
    WatchEvent,
    check_key,
    check_prefix,
    check_value,
    is_direct_child,
)
from scriba.meta.uri import MetadataUri, parse_uri

LIST_LIMIT_MAX: Final = 10_000
TXN_OPS_MAX: Final = 128


class EtcdStore:
    """Implements ``scriba.meta.store.MetadataStore`` on etcd v3."""

    def __init__(
        self,
        parsed: MetadataUri,
        conn: EtcdRpc,
        *,
        session_timeout_s: float,
    ) -> None:
        self.uri = parsed.text
        self.hosts_text = parsed.hosts_text
        self.session_timeout_s = session_timeout_s
        self._conn = conn
        self._lease = EtcdLease(self._conn, session_timeout_s=session_timeout_s)
        self._watcher = EtcdWatcher(self._conn)
        self._ids = IdRanges(self)

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
        channel, auth = open_channel(parsed, await grpc_target(parsed.hosts))
        conn = EtcdRpc(
            parsed.text, parsed.hosts_text, parsed.path + "/", channel,
            auth=auth, credentials=(parsed.option("user") or "", password or ""),
        )
        store = cls(parsed, conn, session_timeout_s=session_timeout_s)
        try:
            await asyncio.wait_for(channel.channel_ready(), connect_timeout_s)
            await conn.authenticate(connect_timeout_s)
            lease_id = await store._lease.grant(connect_timeout_s)
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
        store._lease.start(lease_id)
        return store

    async def close(self) -> None:
        """Revoke the lease (ephemerals go at once), end watches and the channel."""
        if self._conn.closed:
            return
        self._conn.closed = True
        await self._lease.close()
        await self._conn.close()

    async def __aenter__(self) -> EtcdStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def session(self) -> BasicSession:
        return self._lease.session

    @staticmethod
    def _cmp(key: bytes, target: int, result: int, **value: int) -> Any:
        return rpc.Compare(key=key, target=target, result=result, **value)

    async def serving_member(self) -> tuple[str, bool]:
        """The client URL of the member this connection talks to, and whether it leads (diagnostics)."""
        conn = self._conn
        status = await conn.call(
            "status", rpc.MaintenanceStub(conn.channel).Status, rpc.StatusRequest(), idempotent=True
        )
        members = await conn.call(
            "member list", rpc.ClusterStub(conn.channel).MemberList, rpc.MemberListRequest(), idempotent=True
        )
        me = status.header.member_id
        urls = [m.clientURLs[0] for m in members.members if m.ID == me and m.clientURLs]
        return (urls[0] if urls else f"member {me:x}"), status.leader == me

    # --- records --------------------------------------------------------------

    async def get(self, key: str) -> Versioned[bytes]:
        kb = self._conn.k(check_key(key))
        resp = await self._conn.call(f"get {key}", self._conn.kv.Range, rpc.RangeRequest(key=kb), idempotent=True)
        if not resp.kvs:
            raise NoSuchKeyError(f"{key}: no such key")
        return versioned(resp.kvs[0])

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> int:
        kb = self._conn.k(check_key(key))
        value = check_value(key, value)
        lease = 0
        if ephemeral:
            if self._lease.lease_id is None:
                raise SessionExpiredError(f"{key}: the session is {self._lease.session.state.value}; no lease")
            lease = self._lease.lease_id
        request = rpc.TxnRequest(
            compare=[self._cmp(kb, rpc.Compare.CREATE, rpc.Compare.EQUAL, create_revision=0)],
            success=[rpc.RequestOp(request_put=rpc.PutRequest(key=kb, value=value, lease=lease))],
        )
        try:
            resp = await self._conn.call(f"create {key}", self._conn.kv.Txn, request, idempotent=False)
        except SessionExpiredError:
            self._lease.wake()  # let the session loop notice the lost lease now
            raise
        if not resp.succeeded:
            raise KeyExistsError(f"{key}: already exists")
        return int(resp.header.revision)

    async def set(self, key: str, value: bytes, *, expected_version: int) -> int:
        kb = self._conn.k(check_key(key))
        value = check_value(key, value)
        request = rpc.TxnRequest(
            compare=[
                self._cmp(kb, rpc.Compare.VERSION, rpc.Compare.GREATER, version=0),
                self._cmp(kb, rpc.Compare.MOD, rpc.Compare.EQUAL, mod_revision=expected_version),
            ],
            success=[rpc.RequestOp(request_put=rpc.PutRequest(key=kb, value=value, ignore_lease=True))],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=kb, keys_only=True))],
        )
        resp = await self._conn.call(f"set {key}", self._conn.kv.Txn, request, idempotent=False)
        if not resp.succeeded:
            self._raise_conflict(key, resp, expected_version)
        return int(resp.header.revision)

    def _raise_conflict(self, key: str, resp: Any, expected_version: int | None) -> None:
        kvs = resp.responses[0].response_range.kvs
        if not kvs:
            raise NoSuchKeyError(f"{key}: no such key")
        raise BadVersionError(f"{key}: version is {kvs[0].mod_revision}, expected {expected_version}")

    async def delete(self, key: str, *, expected_version: int | None = None) -> None:
        kb = self._conn.k(check_key(key))
        compare = [self._cmp(kb, rpc.Compare.VERSION, rpc.Compare.GREATER, version=0)]
        if expected_version is not None:
            compare.append(self._cmp(kb, rpc.Compare.MOD, rpc.Compare.EQUAL, mod_revision=expected_version))
        request = rpc.TxnRequest(
            compare=compare,
            success=[rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=kb))],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=kb, keys_only=True))],
        )
        resp = await self._conn.call(f"delete {key}", self._conn.kv.Txn, request, idempotent=False)
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
        pb = self._conn.k(prefix)
        end = prefix_end(pb)
        start = pb if start_after is None else self._conn.k(start_after) + b"\x00"
        wanted = limit if limit is not None else sys.maxsize  # None: every record (scan() pages)
        out: list[tuple[str, Versioned[bytes]]] = []
        revision = 0  # every page read at the first page's revision: one consistent listing
        while len(out) < wanted:
            request = rpc.RangeRequest(
                key=start, range_end=end, limit=min(LIST_PAGE_MAX, wanted - len(out)), revision=revision
            )
            resp = await self._conn.call(f"list {prefix}", self._conn.kv.Range, request, idempotent=True)
            revision = revision or int(resp.header.revision)
            for kv in resp.kvs:
                key = self._conn.unk(kv.key)
                if is_direct_child(prefix, key):
                    out.append((key, versioned(kv)))
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
            kb = self._conn.k(check_key(check.key))
            if check.version is None:
                compare.append(self._cmp(kb, rpc.Compare.CREATE, rpc.Compare.EQUAL, create_revision=0))
            else:
                if check.version <= 0:
                    raise BadRequestError(f"txn check {check.key}: version must be > 0 or None")
                compare.append(self._cmp(kb, rpc.Compare.MOD, rpc.Compare.EQUAL, mod_revision=check.version))
        ops = []
        for write in writes:
            kb = self._conn.k(check_key(write.key))
            if isinstance(write, Put):
                ops.append(rpc.RequestOp(request_put=rpc.PutRequest(key=kb, value=check_value(write.key, write.value))))
            else:
                ops.append(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=kb)))
        failure = [rpc.RequestOp(request_range=rpc.RangeRequest(key=self._conn.k(c.key), keys_only=True)) for c in checks]
        request = rpc.TxnRequest(compare=compare, success=ops, failure=failure)
        resp = await self._conn.call("txn", self._conn.kv.Txn, request, idempotent=False)
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
        self._conn.check_open()
        return await self._ids.allocate(name)

    # --- watch and the session's test hooks -------------------------------------

    def watch(self, key: str, *, prefix: bool = False) -> AsyncGenerator[WatchEvent, None]:
        """The current state, SYNCED, then every change (``scriba.meta.etcd_watch``)."""
        return self._watcher.watch(key, prefix=prefix)

    async def revoke_lease_for_test(self) -> None:
        """Revoke the lease behind the session's back (``EtcdLease.revoke_for_test``)."""
        await self._lease.revoke_for_test()

    async def expire_session_for_test(self) -> None:
        """Revoke the lease as an expiry would: ephemerals go, then LOST, then CONNECTED anew."""
        await self._lease.expire_for_test()
