"""``KvServer``: etcd v3's gRPC services on one RSM replica.

Every replica accepts every call. Writes (Put, DeleteRange, Txn, Compact, lease
grant/revoke/keep-alive) are proposed through the RSM under the exactly-once session
of the client's connection (``sessions``; forwarded to the leader by the RSM; a
retry after a fail-over applies once). Range is a linearizable RSM read unless ``serializable`` (then answered from
this replica's applied state). Lease expiry: the leader's server asks its own state
which lease deadlines passed on its clock and proposes ``LEASE_EXPIRE`` for each.

Headers: ``cluster_id`` from the RSM group, ``member_id`` from the replica id,
``raft_term`` the RSM leader term (the election token). Each replica records its
client URL under ``kv/<group>/clients/<replica id>`` (ephemeral) for MemberList.
Errors are etcd's codes and messages (``errors``); an RSM that cannot reach a leader
answers etcd's "no leader" / "request timed out" (UNAVAILABLE: clients retry or
switch endpoints).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from aetcd.rpc import rpc_pb2 as pb
from aetcd.rpc import rpc_pb2_grpc as stubs

from scriba.errors import (
    CommandOutcomeUnknownError,
    DeadlineExceededError,
    KeyExistsError,
    NoSuchKeyError,
    RsmNotLeaderError,
    ScribaError,
    UnavailableError,
)
from scriba.examples.kvstore import commands as cmd
from scriba.examples.kvstore import errors
from scriba.examples.kvstore.commands import Op
from scriba.examples.kvstore.errors import EtcdError
from scriba.examples.kvstore.machine import KvMachine
from scriba.examples.kvstore.sessions import IDLE_S, ConnectionSessions
from scriba.examples.kvstore.watch import PROGRESS_NOTIFY_S, Watch
from scriba.grpc_auth import IdentityInterceptor, bind, identity_check
from scriba.log import get_logger
from scriba.rsm import ReplicatedStateMachine, while_leaderless
from scriba.tls import LoadedTls, Role

log = get_logger(__name__)

ETCD_VERSION = "3.5.0"  # what Status reports: the API level the clients expect
EXPIRY_POLL_S = 0.5
REGISTRATION_CHECK_S = 1.0
LEASE_EXPIRY_PEER = "scriba-kv:lease-expiry"  # the session of the leader's own expiry proposals
GRPC_OPTIONS = [  # keep idle watch / keep-alive streams of etcdctl open (ENVIRONMENT.md)
    ("grpc.http2.min_ping_interval_without_data_ms", 5000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 2 * 1024 * 1024),
    ("grpc.so_reuseport", 0),  # a port another process holds is an error, not a share of its connections
]


def id64(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1  # positive int64


def clients_prefix(namespace: str, name: str) -> str:
    return f"kv/{namespace.replace('/', '.')}~{name}/clients/"


def now_ms() -> int:
    return int(time.time() * 1000)


class Node:
    """The RSM replica as the servicers see it: propose, read, headers, errors."""

    def __init__(self, rsm: ReplicatedStateMachine, machine: KvMachine, client_url: str) -> None:
        self.rsm = rsm
        self.machine = machine
        self.client_url = client_url
        self.cluster_id = id64(f"{rsm.namespace}/{rsm.name}")
        self.member_id = id64(rsm.replica_id)
        self.leader_term = 0  # the leader's election token as a follower last learned it (Status)
        # dropped here well before the RSM expires it (no command for session_ttl_ms on its clock)
        self.sessions = ConnectionSessions(lambda: while_leaderless(rsm.open_session, rsm.config.propose_timeout_s),
                                           idle_s=min(IDLE_S, rsm.config.session_ttl_ms / 2000))

    def header(self, revision: int | None = None) -> Any:
        return pb.ResponseHeader(cluster_id=self.cluster_id, member_id=self.member_id,
                                 revision=self.machine.revision if revision is None else revision,
                                 raft_term=self.term)

    @property
    def term(self) -> int:
        """etcd's raft term: the RSM leader's election token (a follower's last known one)."""
        return self.rsm.role.token if self.rsm.is_leader else max(self.rsm.role.token, self.leader_term)

    async def learn_term(self) -> None:
        """A follower reads the leader's token from the group's membership records."""
        if self.rsm.is_leader:
            return
        try:
            members = await self.rsm.members()
        except ScribaError:
            return
        tokens = [m.token for m in members if m.role == "leader"]
        if tokens:
            self.leader_term = max(self.leader_term, *tokens)

    def fill(self, response: Any) -> Any:
        response.header.CopyFrom(self.header(response.header.revision or None))
        return response

    async def propose(self, data: bytes, response_type: Any, context: Any) -> Any:
        if len(data) + 64 > self.rsm.config.command_bytes_max:
            await abort(context, errors.REQUEST_TOO_LARGE)
        try:
            result = await self.rsm.propose(data, session=await self.sessions.get(context.peer()))
            return self.fill(cmd.parse_result(result, response_type))
        except EtcdError as exc:
            await abort(context, exc)
        except ScribaError as exc:
            await abort(context, rsm_error(exc))

    async def read(self, data: bytes, response_type: Any, context: Any, serializable: bool) -> Any:
        try:
            consistency = "sequential" if serializable else "linearizable"
            result = await while_leaderless(lambda: self.rsm.read(data, consistency), self.rsm.config.read_timeout_s)
            return self.fill(cmd.parse_result(result, response_type))
        except EtcdError as exc:
            await abort(context, exc)
        except ScribaError as exc:
            await abort(context, rsm_error(exc))

    async def expire_leases(self) -> None:
        """On the leader: propose the expiry of every lease whose deadline passed here."""
        while True:
            await asyncio.sleep(EXPIRY_POLL_S)
            if not self.rsm.is_leader:
                continue
            try:
                due = json.loads(await self.rsm.read(cmd.encode(Op.LEASES_EXPIRED, None, now_ms()), "sequential"))
                for lease_id, deadline_ms in due:
                    await self.rsm.propose(cmd.encode_expire(lease_id, deadline_ms),
                                           session=await self.sessions.get(LEASE_EXPIRY_PEER))
            except ScribaError as exc:
                log.info("kv_lease_expiry_failed", error=str(exc))


def rsm_error(exc: ScribaError) -> EtcdError:
    if isinstance(exc, RsmNotLeaderError | UnavailableError):
        return errors.NO_LEADER
    if isinstance(exc, CommandOutcomeUnknownError | DeadlineExceededError):
        return errors.TIMEOUT
    return EtcdError("UNAVAILABLE", f"etcdserver: {type(exc).__name__}: {exc}")


async def abort(context: Any, error: EtcdError) -> None:
    await context.abort(getattr(grpc.StatusCode, error.code), error.message)


class KV(stubs.KVServicer):  # type: ignore[misc]
    def __init__(self, node: Node) -> None:
        self.node = node

    async def Range(self, request: Any, context: Any) -> Any:
        return await self.node.read(cmd.encode(Op.RANGE, request), pb.RangeResponse, context, request.serializable)

    async def Put(self, request: Any, context: Any) -> Any:
        return await self.node.propose(cmd.encode(Op.PUT, request), pb.PutResponse, context)

    async def DeleteRange(self, request: Any, context: Any) -> Any:
        return await self.node.propose(cmd.encode(Op.DELETE_RANGE, request), pb.DeleteRangeResponse, context)

    async def Txn(self, request: Any, context: Any) -> Any:
        return await self.node.propose(cmd.encode(Op.TXN, request), pb.TxnResponse, context)

    async def Compact(self, request: Any, context: Any) -> Any:
        return await self.node.propose(cmd.encode(Op.COMPACT, request), pb.CompactionResponse, context)


class Lease(stubs.LeaseServicer):  # type: ignore[misc]
    def __init__(self, node: Node) -> None:
        self.node = node

    async def LeaseGrant(self, request: Any, context: Any) -> Any:
        return await self.node.propose(cmd.encode(Op.LEASE_GRANT, request, now_ms()), pb.LeaseGrantResponse, context)

    async def LeaseRevoke(self, request: Any, context: Any) -> Any:
        return await self.node.propose(cmd.encode(Op.LEASE_REVOKE, request), pb.LeaseRevokeResponse, context)

    async def LeaseKeepAlive(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        async for request in request_iterator:
            yield await self.node.propose(cmd.encode(Op.LEASE_KEEPALIVE, request, now_ms()),
                                          pb.LeaseKeepAliveResponse, context)

    async def LeaseTimeToLive(self, request: Any, context: Any) -> Any:
        return await self.node.read(cmd.encode(Op.LEASE_TTL, request, now_ms()), pb.LeaseTimeToLiveResponse,
                                    context, serializable=False)

    async def LeaseLeases(self, request: Any, context: Any) -> Any:
        return await self.node.read(cmd.encode(Op.LEASE_LIST, request), pb.LeaseLeasesResponse, context,
                                    serializable=False)


class Maintenance(stubs.MaintenanceServicer):  # type: ignore[misc]
    def __init__(self, node: Node) -> None:
        self.node = node

    async def Status(self, request: Any, context: Any) -> Any:
        rsm = self.node.rsm
        await self.node.learn_term()
        leader = rsm.leader
        status = rsm.status()
        return pb.StatusResponse(
            header=self.node.header(), version=ETCD_VERSION, dbSize=0, dbSizeInUse=0,
            leader=id64(leader[0]) if leader else 0, raftIndex=status["commands_applied"],
            raftTerm=self.node.term, raftAppliedIndex=status["commands_applied"],
            errors=[] if leader else [errors.NO_LEADER.message],
        )

    async def Alarm(self, request: Any, context: Any) -> Any:
        return pb.AlarmResponse(header=self.node.header())  # no alarms: nothing here runs out of space


class Cluster(stubs.ClusterServicer):  # type: ignore[misc]
    def __init__(self, node: Node) -> None:
        self.node = node

    async def MemberList(self, request: Any, context: Any) -> Any:
        rsm = self.node.rsm
        try:
            records = await rsm.client.store.list(clients_prefix(rsm.namespace, rsm.name))
        except ScribaError as exc:
            await abort(context, rsm_error(exc))
        members = []
        for _key, record in records:
            doc = json.loads(record.value)
            members.append(pb.Member(ID=id64(doc["replica_id"]), name=doc["replica_id"],
                                     peerURLs=[f"scriba://{doc['rsm_address']}"], clientURLs=[doc["client_url"]]))
        return pb.MemberListResponse(header=self.node.header(), members=members)


class Auth(stubs.AuthServicer):  # type: ignore[misc]
    """Authentication is not enabled: AuthStatus says so, everything else is refused as etcd does."""

    def __init__(self, node: Node) -> None:
        self.node = node

    async def AuthStatus(self, request: Any, context: Any) -> Any:
        return pb.AuthStatusResponse(header=self.node.header(), enabled=False)


async def _auth_not_enabled(self: Auth, request: Any, context: Any) -> Any:
    await abort(context, errors.AUTH_NOT_ENABLED)


for _name in ("AuthEnable", "AuthDisable", "Authenticate", "UserAdd", "UserGet", "UserList", "UserDelete",
              "UserChangePassword", "UserGrantRole", "UserRevokeRole", "RoleAdd", "RoleGet", "RoleList",
              "RoleDelete", "RoleGrantPermission", "RoleRevokePermission"):
    setattr(Auth, _name, _auth_not_enabled)


class KvServer:
    """The gRPC server and the lease-expiry task of one replica."""

    def __init__(self, rsm: ReplicatedStateMachine, machine: KvMachine, listen: str,
                 tls: LoadedTls | None = None, *, watch_progress_notify_s: float = PROGRESS_NOTIFY_S) -> None:
        """``tls``: serve TLS only (mutual TLS: every call checked against the allow-lists)."""
        self.node = Node(rsm, machine, f"{'https' if tls is not None else 'http'}://{listen}")
        self.watch_progress_notify_s = watch_progress_notify_s
        self.listen = listen
        self._tls = tls
        interceptors = ([IdentityInterceptor(identity_check(tls, tuple(Role)))]
                        if tls is not None and tls.config.require_client_cert else [])
        self._server = grpc.aio.server(options=GRPC_OPTIONS, interceptors=interceptors)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        node = self.node
        stubs.add_KVServicer_to_server(KV(node), self._server)
        stubs.add_LeaseServicer_to_server(Lease(node), self._server)
        stubs.add_MaintenanceServicer_to_server(Maintenance(node), self._server)
        stubs.add_ClusterServicer_to_server(Cluster(node), self._server)
        stubs.add_AuthServicer_to_server(Auth(node), self._server)
        stubs.add_WatchServicer_to_server(Watch(node, self.watch_progress_notify_s), self._server)
        if bind(self._server, self.listen, self._tls) == 0:
            raise OSError(f"cannot listen on {self.listen}")
        await self._server.start()
        rsm = node.rsm
        doc = {"replica_id": rsm.replica_id, "client_url": node.client_url, "rsm_address": rsm.address}
        key = clients_prefix(rsm.namespace, rsm.name) + rsm.replica_id
        with contextlib.suppress(NoSuchKeyError):  # a killed incarnation's record, not yet expired
            await rsm.client.store.delete(key)
        await rsm.client.store.create(key, json.dumps(doc).encode(), ephemeral=True)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(node.expire_leases()))
        self._tasks.append(loop.create_task(self._keep_registered(key, json.dumps(doc).encode())))

    async def _keep_registered(self, key: str, value: bytes) -> None:
        """Re-create the client-URL record if a lost metadata session took the ephemeral away."""
        store = self.node.rsm.client.store
        while True:
            await asyncio.sleep(REGISTRATION_CHECK_S)
            try:
                await store.get(key)
            except NoSuchKeyError:
                with contextlib.suppress(KeyExistsError):
                    await store.create(key, value, ephemeral=True)
            except ScribaError as exc:
                log.info("kv_registration_check_failed", error=str(exc))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._server.stop(grace=1.0)
