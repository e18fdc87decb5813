"""A read-only replica of the store in a second cluster, fed by geo-replication.

    scriba geo replicate --source etcd://A/scriba --target etcd://B/scriba --stream kv/store \\
        --source-name a --target-name b
    scriba-kv follow --metadata etcd://B/scriba --replica-id f1 --listen 127.0.0.1:23890 --origin a \\
        [--source-metadata etcd://A/scriba] [--max-staleness-s 30]
    etcdctl --endpoints 127.0.0.1:23890 get --consistency=s --prefix ''

The store's replicas in cluster A write their command stream (``kv/store``); the
replicator copies it, in order and exactly once, into the same-named stream of
cluster B, each record marked with its position in A (``scriba.geo.marks``). Each
follower process in B applies that copy through ``scriba.rsm.follower`` at the
records' *source* positions: after the record copied from A's position ``P`` its
store is A's store after ``P``: same keys, values, revisions, leases. Any number of
followers form the read-only replica set; each is on its own consistent prefix.

What clients get, as from an etcd learner (a non-voting member that serves no
writes):

- ``Range`` with ``serializable`` (``etcdctl get --consistency=s``): answered from the
  prefix applied now, ``header.revision`` its revision (the same number A's replicas
  give that state). A ``Range`` at a revision the follower has not reached gets etcd's
  ``required revision is a future revision``, so a client that wrote at revision ``R``
  in A can ask for ``R`` and learn the follower is not there yet.
- Everything else (writes, linearizable reads, leases, watches, member list, auth):
  UNAVAILABLE ``etcdserver: rpc not supported for learner``, etcd's own answer, which
  its clients take as "use another endpoint".
- ``Status``: ``isLearner``, ``raftTerm`` the source leader's term applied,
  ``raftAppliedIndex`` the commands applied (A's replicas count the same), and in
  ``errors`` a line saying how far behind it is once that exceeds ``stale_after_s``;
  with ``--metrics-listen`` the replicas' Prometheus gauges (``scriba_rsm_*``), where
  ``scriba_rsm_lag_seconds`` is the staleness bound below.
- With ``max_staleness_s`` a follower that cannot show it is that fresh refuses reads
  (UNAVAILABLE ``etcdserver: learner is too far behind``: clients move to another
  endpoint).

How stale, exactly (``scriba.rsm.follower``): with ``--source-metadata`` (read access
to cluster A) the follower samples the end of A's stream and counts itself fresh as of
a sample's time only once it has applied up to that position, so the bound covers the
replicator's lag as well, and grows while A cannot be reached or the copy is stopped.
Without it the samples come from the copy in B: the bound then covers only the
follower's own lag behind the copy (the copy's lag is ``scriba geo status``'s).

The session rules are part of the replicated state (a session expires by the replicated
clock after ``session_ttl_ms``): give the follower the store's ``--rsm-config``.

Start: with ``--source-metadata`` a follower restores the store's newest snapshot from
cluster A and reads the copy from right after the record copied from the snapshot's
position (``scriba.geo.translate``), as it does when its copy is truncated past what it
applied; otherwise (or while A cannot be reached) it replays the copy from its first
record. Limits: no TLS on its etcd port yet; watches are refused (as on an etcd
learner), not served from the copy; one hop only (the marks must name A as source).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from aetcd.rpc import rpc_pb2 as pb
from aetcd.rpc import rpc_pb2_grpc as stubs

from scriba.client import Client, ClientConfig
from scriba.errors import ConfigError, ScribaError
from scriba.examples.kvstore import commands as cmd
from scriba.examples.kvstore.commands import Op
from scriba.examples.kvstore.errors import EtcdError
from scriba.examples.kvstore.machine import KvMachine
from scriba.examples.kvstore.server import ETCD_VERSION, GRPC_OPTIONS, abort, id64
from scriba.geo import Mark, translate
from scriba.log import configure, get_logger
from scriba.rsm import RsmConfig
from scriba.rsm.follower import Bootstrap, Locate, StreamFollower, newest_snapshot
from scriba.rsm.metrics import MetricsEndpoint, RsmMetrics
from scriba.stream import Namespace, Position, Record, open_namespace

log = get_logger(__name__)

LEARNER = EtcdError("UNAVAILABLE", "etcdserver: rpc not supported for learner")
STALE_AFTER_S = 5.0
# etcd's services whose every method a learner refuses (KV and Maintenance are served below)
REFUSED_SERVICES = ("Watch", "Lease", "Cluster", "Auth")
STREAMING = frozenset({"/etcdserverpb.Watch/Watch", "/etcdserverpb.Lease/LeaseKeepAlive"})


def geo_locate(origin: str | None = None) -> Locate:
    """Each record applies at its source position (its replication mark); a record that
    was not copied (written in this cluster) or, with ``origin``, came from another
    cluster is not the group's history: the follower stops rather than diverge."""
    def locate(record: Record) -> tuple[Position, int]:
        mark = Mark.from_headers(record.headers)
        if mark is None:
            raise ConfigError("it carries no replication mark: it was written in this cluster, not copied "
                              "from the store's own")
        if origin is not None and mark.origin != origin:
            raise ConfigError(f"it was copied from cluster {mark.origin!r}, the store's is {origin!r}")
        return mark.source_position, mark.source_publish_ms
    return locate


def geo_bootstrap(source: Callable[[], Awaitable[Client]], copy: Namespace, name: str, origin: str) -> Bootstrap:
    """Start from the store's newest snapshot in its own cluster, reading the copy right
    after the record copied from the snapshot's position (``scriba.geo.translate``). A copy
    that holds later records but not that one has a gap there: no start from that snapshot."""
    async def bootstrap(applied: Position | None) -> tuple[list[bytes], Position] | None:
        found = await newest_snapshot(await source(), copy.name, name, applied)
        if found is None:
            return None
        position, chunks = found
        where = (await translate(copy, name, origin, [position]))[position]
        if where.target_position is not None:
            return chunks, where.target_position.successor()
        if not where.replicated:  # the copy is behind the snapshot: what follows it is still to come
            return chunks, where.resume_position
        log.warning("kv_follower_snapshot_unusable", position=str(position),
                    error="the copy holds later records but not the snapshot's own")
        return None
    return bootstrap


class FollowerNode:
    """The follower as the servicers see it: headers, reads, staleness."""

    def __init__(self, follower: StreamFollower, machine: KvMachine, replica_id: str, *,
                 stale_after_s: float = STALE_AFTER_S, max_staleness_s: float | None = None) -> None:
        self.follower = follower
        self.machine = machine
        self.cluster_id = id64(f"{follower.namespace.name}/{follower.stream}")  # the store's, as in A
        self.member_id = id64(replica_id)
        self.stale_after_s = stale_after_s
        self.max_staleness_s = max_staleness_s

    def header(self, revision: int | None = None) -> Any:
        return pb.ResponseHeader(cluster_id=self.cluster_id, member_id=self.member_id,
                                 revision=self.machine.revision if revision is None else revision,
                                 raft_term=self.follower.state.token)

    def behind_s(self, now_ms: int | None = None) -> float | None:
        """How stale reads are at most: seconds since the last time the follower held
        everything its reference held (the source's stream, or its copy), None: not known."""
        caught_up = self.follower.caught_up_ms
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return max(0.0, (now - caught_up) / 1000) if caught_up else None

    def staleness(self) -> str:
        """A line for ``Status.errors`` when the follower is behind ("" when it is not)."""
        if self.follower.error is not None:
            return f"etcdserver: learner stopped: {self.follower.error}"
        behind = self.behind_s()
        if behind is not None and behind <= self.stale_after_s:
            return ""
        status = self.follower.status()
        since = "not yet" if behind is None else f"{behind:.1f} s ago"
        return (f"etcdserver: learner behind: last caught up {since} (the source's last record "
                f"{status['reference_last']}); applied source position {status['applied']}, revision "
                f"{self.machine.revision}; newest source write applied {status['source_age_s']} s old")

    def check_fresh(self) -> None:
        if self.follower.error is not None:
            raise EtcdError("UNAVAILABLE", f"etcdserver: learner stopped: {self.follower.error}")
        if self.max_staleness_s is None:
            return
        behind = self.behind_s()
        if behind is None or behind > self.max_staleness_s:
            since = "never caught up" if behind is None else f"last caught up {behind:.1f} s ago"
            raise EtcdError("UNAVAILABLE", f"etcdserver: learner is too far behind ({since}; bound "
                                           f"{self.max_staleness_s} s)")


class FollowerKV(stubs.KVServicer):  # type: ignore[misc]
    def __init__(self, node: FollowerNode) -> None:
        self.node = node

    async def Range(self, request: Any, context: Any) -> Any:
        if not request.serializable:
            await abort(context, LEARNER)
        node = self.node
        try:
            node.check_fresh()
            response = cmd.parse_result(node.follower.query(cmd.encode(Op.RANGE, request)), pb.RangeResponse)
        except EtcdError as exc:
            await abort(context, exc)
        except ScribaError as exc:
            await abort(context, EtcdError("UNAVAILABLE", f"etcdserver: {type(exc).__name__}: {exc}"))
        response.header.CopyFrom(node.header(response.header.revision or None))
        return response


class FollowerMaintenance(stubs.MaintenanceServicer):  # type: ignore[misc]
    def __init__(self, node: FollowerNode) -> None:
        self.node = node

    async def Status(self, request: Any, context: Any) -> Any:
        node = self.node
        stale = node.staleness()
        applied = node.follower.state.commands_applied
        return pb.StatusResponse(
            header=node.header(), version=ETCD_VERSION, dbSize=0, dbSizeInUse=0, leader=0,
            raftIndex=applied, raftTerm=node.follower.state.token, raftAppliedIndex=applied,
            errors=[stale] if stale else [], isLearner=True,
        )


async def _refuse(self: Any, request: Any, context: Any) -> Any:
    await abort(context, LEARNER)


for _name in ("Put", "DeleteRange", "Txn", "Compact"):
    setattr(FollowerKV, _name, _refuse)
for _name in ("Alarm", "Defragment", "Hash", "HashKV", "MoveLeader", "Downgrade"):
    setattr(FollowerMaintenance, _name, _refuse)


class RefuseLearner(grpc.GenericRpcHandler):
    """Every method of etcd's Watch, Lease, Cluster and Auth services: refused, as a learner does."""

    def service(self, handler_call_details: Any) -> Any:
        method = handler_call_details.method
        service = method.removeprefix("/etcdserverpb.").partition("/")[0]
        if service not in REFUSED_SERVICES:
            return None
        if method in STREAMING:
            async def refuse_stream(request_iterator: Any, context: Any) -> Any:
                await abort(context, LEARNER)
                yield  # pragma: no cover - abort raises
            return grpc.stream_stream_rpc_method_handler(refuse_stream)

        async def refuse(request: Any, context: Any) -> Any:
            await abort(context, LEARNER)
        return grpc.unary_unary_rpc_method_handler(refuse)


class FollowerServer:
    """etcd's gRPC API over one follower: serializable reads and Status, nothing else."""

    def __init__(self, node: FollowerNode, listen: str) -> None:
        self.node = node
        self.listen = listen
        self._server = grpc.aio.server(options=GRPC_OPTIONS)

    async def start(self) -> None:
        stubs.add_KVServicer_to_server(FollowerKV(self.node), self._server)
        stubs.add_MaintenanceServicer_to_server(FollowerMaintenance(self.node), self._server)
        self._server.add_generic_rpc_handlers((RefuseLearner(),))
        if self._server.add_insecure_port(self.listen) == 0:
            raise OSError(f"cannot listen on {self.listen}")
        await self._server.start()

    async def stop(self) -> None:
        await self._server.stop(grace=1.0)


def add_follow_arguments(follow: argparse.ArgumentParser) -> None:
    """The follower's own options (beside the store's common ones, ``__main__``)."""
    follow.add_argument("--origin", help="the store's own cluster name (records copied from elsewhere stop it)")
    follow.add_argument("--source-metadata", help="metadata URI of the store's own cluster: staleness is then "
                                                  "measured against its stream (else against the copy)")
    follow.add_argument("--stale-after-s", type=float, default=STALE_AFTER_S,
                        help="Status reports the lag in its errors once the follower is this far behind")
    follow.add_argument("--max-staleness-s", type=float,
                        help="refuse reads once the follower has not been caught up for this long")
    follow.add_argument("--session-timeout-s", type=float, default=5.0)
    follow.add_argument("--metrics-listen", help="host:port for Prometheus /metrics (scriba_rsm_*; "
                                                 "scriba_rsm_lag_seconds is the staleness bound)")


def check_follow_args(args: argparse.Namespace) -> RsmConfig:
    """The follower's RSM config (the session rules are part of the replicated state: the
    store's own); ``ConfigError`` for options that cannot work, before anything starts."""
    try:
        config = RsmConfig(**json.loads(args.rsm_config)).validate()
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"--rsm-config {args.rsm_config!r}: {exc}") from None
    if args.max_staleness_s is not None and args.max_staleness_s <= 0:
        raise ConfigError(f"--max-staleness-s must be > 0, got {args.max_staleness_s}")
    if args.stale_after_s <= 0:
        raise ConfigError(f"--stale-after-s must be > 0, got {args.stale_after_s}")
    if args.source_metadata is not None and args.origin is None:
        raise ConfigError("--source-metadata needs --origin (the source cluster's name in the replication marks)")
    return config


async def follow(args: argparse.Namespace) -> int:
    """``scriba-kv follow``: one follower; ``READY`` on stdout once serving; SIGTERM stops it."""
    configure(stream=sys.stderr)
    config = check_follow_args(args)
    client = await Client.connect(args.metadata, config=ClientConfig(
        add_timeout_s=5.0, bookie_wait_s=20.0, metadata_session_timeout_s=args.session_timeout_s))
    namespace = await open_namespace(client, args.namespace, create=True)
    machine = KvMachine()
    source: list[Client] = []

    async def source_client() -> Client:  # connected when first reachable: the source may be down
        if not source:
            source.append(await Client.connect(args.source_metadata, config=ClientConfig(
                metadata_session_timeout_s=args.session_timeout_s)))
        return source[0]

    async def reference() -> Namespace:
        return await open_namespace(await source_client(), args.namespace)

    known = args.source_metadata is not None
    follower = await StreamFollower(
        namespace, args.name, machine, config=config, locate=geo_locate(args.origin),
        reference=reference if known else None,
        bootstrap=geo_bootstrap(source_client, namespace, args.name, args.origin) if known else None,
    ).start()
    node = FollowerNode(follower, machine, args.replica_id, stale_after_s=args.stale_after_s,
                        max_staleness_s=args.max_staleness_s)
    server = FollowerServer(node, args.listen)
    await server.start()
    metrics = RsmMetrics()

    async def refresh() -> None:
        metrics.update(follower.metrics_status())
    endpoint = MetricsEndpoint(args.metrics_listen, metrics, refresh) if args.metrics_listen else None
    if endpoint is not None:
        await endpoint.start()
    log.info("kv_follower_serving", replica=args.replica_id, listen=args.listen)
    print("READY", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(TimeoutError):
        await stop.wait()
    if endpoint is not None:
        await endpoint.close()
    await server.stop()
    await follower.stop()
    for c in source:
        await c.close()
    await client.close()
    return 0
