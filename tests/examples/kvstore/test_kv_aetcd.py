"""The ``aetcd`` client library (unmodified) against the store's replica processes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aetcd
import grpc
import pytest
from aetcd.rpc import rpc_pb2 as pb
from aetcd.rpc import rpc_pb2_grpc as stubs

from scriba.embedded.kvstore import KvCluster

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("collect_on_the_loop"), pytest.mark.timeout(300)]



def client_for(kv: KvCluster, index: int) -> aetcd.Client:
    host, port = kv.replicas[index].endpoint.rsplit(":", 1)
    return aetcd.Client(host, int(port), timeout=20)


async def test_put_get_delete_txn_on_every_replica(kv_cluster: KvCluster) -> None:
    p = f"a{uuid.uuid4().hex[:6]}/".encode()
    async with client_for(kv_cluster, 0) as c0, client_for(kv_cluster, 2) as c2:
        put = await c0.put(p + b"k", b"1", prev_kv=True)
        assert put.prev_kv is None or not put.prev_kv.key
        got = await c2.get(p + b"k")  # another replica: linearizable read sees the write
        assert got is not None and got.value == b"1" and got.version == 1
        assert (await c2.put(p + b"k", b"2", prev_kv=True)).prev_kv.value == b"1"
        await c0.put(p + b"j", b"3")
        assert [kv.key for kv in await c0.get_prefix(p)] == [p + b"j", p + b"k"]
        tx = c0.transactions
        ok, responses = await c0.transaction(compare=[tx.value(p + b"k") == b"2", tx.version(p + b"j") > 0],
                                             success=[tx.put(p + b"k", b"won"), tx.get(p + b"j")],
                                             failure=[tx.put(p + b"k", b"lost")])
        assert ok and responses[1][0][0] == b"3"
        ok, _ = await c2.transaction(compare=[tx.value(p + b"k") == b"2"], success=[], failure=[tx.delete(p + b"j")])
        assert not ok and await c0.get(p + b"j") is None
        assert (await c2.get(p + b"k")).value == b"won"
        deleted = await c2.delete(p + b"k", prev_kv=True)
        assert deleted is not None and deleted.prev_kv.value == b"won"
        assert await c0.get(p + b"k") is None


async def test_leases_and_watch(kv_cluster: KvCluster) -> None:
    p = f"w{uuid.uuid4().hex[:6]}/".encode()
    async with client_for(kv_cluster, 1) as c:
        lease = await c.lease(30)
        await c.put(p + b"leased", b"v", lease=lease)
        assert await lease.granted_ttl() == 30 and 0 < await lease.remaining_ttl() <= 30
        assert await lease.keys() == [p + b"leased"]
        await lease.refresh()
        start = (await c.put(p + b"a", b"1")).header.revision
        await lease.revoke()  # deletes p/leased
        await c.delete(p + b"a")
        watch = await c.watch_prefix(p, start_revision=start, prev_kv=True)
        seen = []
        async with asyncio.timeout(20):
            async for event in watch:
                seen.append((event.kind, event.kv.key, event.prev_kv.value if event.prev_kv else None))
                if len(seen) == 3:
                    await c.put(p + b"live", b"x")  # now a live event
                if len(seen) == 4:
                    break
        await watch.cancel()
        assert seen == [("PUT", p + b"a", b""), ("DELETE", p + b"leased", b"v"), ("DELETE", p + b"a", b"1"),
                        ("PUT", p + b"live", b"")]  # aetcd: an absent prev_kv reads as empty
        with pytest.raises(aetcd.ClientError):
            await c.revoke_lease(lease.id)


async def test_errors_as_etcd_codes_with_the_raw_stubs(kv_cluster: KvCluster) -> None:
    """count_only and the status codes, through etcd's own generated stubs (as aetcd ships them)."""
    async with grpc.aio.insecure_channel(kv_cluster.replicas[0].endpoint) as channel:
        kv = stubs.KVStub(channel)
        p = f"c{uuid.uuid4().hex[:6]}/".encode()
        for i in range(3):
            await kv.Put(pb.PutRequest(key=p + b"%d" % i, value=b"v"))
        r = await kv.Range(pb.RangeRequest(key=p, range_end=p[:-1] + b"0", count_only=True))
        assert r.count == 3 and list(r.kvs) == []
        r = await kv.Range(pb.RangeRequest(key=p + b"2", range_end=p + b"0"))  # range_end before key: empty
        assert r.count == 0
        cases = [
            (kv.Put(pb.PutRequest(key=b"", value=b"v")), grpc.StatusCode.INVALID_ARGUMENT, "key is not provided"),
            (kv.Range(pb.RangeRequest(key=p, revision=10**9)), grpc.StatusCode.OUT_OF_RANGE, "future revision"),
            (kv.Put(pb.PutRequest(key=p, lease=999)), grpc.StatusCode.NOT_FOUND, "requested lease not found"),
            (kv.Put(pb.PutRequest(key=p + b"absent", ignore_value=True)), grpc.StatusCode.INVALID_ARGUMENT,
             "key not found"),
        ]
        for call, code, message in cases:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() == code and message in (info.value.details() or "")
        after = await kv.Range(pb.RangeRequest(key=p, range_end=p[:-1] + b"0", count_only=True))
        assert after.count == 3 and after.header.revision == r.header.revision  # nothing written


async def _watch_responses(channel: grpc.aio.Channel, create: pb.WatchCreateRequest, events: int) -> list[Any]:
    """The responses of one watch until ``events`` events arrived (etcd's raw Watch stream)."""
    requests: asyncio.Queue[Any] = asyncio.Queue()
    await requests.put(pb.WatchRequest(create_request=create))

    async def feed() -> AsyncIterator[Any]:
        while True:
            yield await requests.get()

    call = stubs.WatchStub(channel).Watch(feed())
    responses, seen = [], 0
    async with asyncio.timeout(60):
        async for response in call:
            if response.created:
                continue
            responses.append(response)
            seen += len(response.events)
            if seen >= events:
                break
    call.cancel()
    return responses


async def test_watch_fragments_large_batches_only_when_asked(kv_cluster: KvCluster) -> None:
    """Five ~400 KB puts replayed from history: one response without ``fragment``; with it,
    pieces under etcd's 1.5 MiB request limit, each flagged but the last."""
    async with grpc.aio.insecure_channel(kv_cluster.replicas[1].endpoint,
                                         options=[("grpc.max_receive_message_length", 16 << 20)]) as channel:
        kv = stubs.KVStub(channel)
        p = f"frag{uuid.uuid4().hex[:6]}/".encode()
        first = 0
        for i in range(5):
            rev = (await kv.Put(pb.PutRequest(key=p + b"%d" % i, value=b"x" * 400_000))).header.revision
            first = first or rev
        await kv.Range(pb.RangeRequest(key=p))  # a linearizable read: this replica has applied the puts
        create = pb.WatchCreateRequest(key=p, range_end=p[:-1] + b"0", start_revision=first)
        whole = await _watch_responses(channel, create, 5)
        assert [len(r.events) for r in whole] == [5] and not whole[0].fragment
        create.fragment = True
        pieces = await _watch_responses(channel, create, 5)
        assert len(pieces) >= 2 and sum(len(r.events) for r in pieces) == 5
        assert [r.fragment for r in pieces] == [True] * (len(pieces) - 1) + [False]
        assert all(r.ByteSize() <= 1536 * 1024 + 1024 for r in pieces)
