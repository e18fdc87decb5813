"""ZooKeeper write coalescing (``scriba.meta.zk_multi``): batches, per-write outcomes, real multis.

The pure parts (cutting batches, mapping a multi's results back) are tested on their
own; then concurrent writes on a real ZooKeeper, where a lost race or a duplicate of
one write in a multi must fail that write alone and every other write must land.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import AsyncIterator

import pytest
from kazoo import exceptions as kz
from kazoo.protocol.states import ZnodeStat

from scriba.embedded.zookeeper import ZooKeeperEnsemble
from scriba.errors import BadVersionError, KeyExistsError, NoSuchKeyError
from scriba.invariant import InvariantViolation
from scriba.meta.zk_multi import (
    BATCH_BYTES_MAX,
    OP_OVERHEAD_BYTES,
    WriteKind,
    ZkWrite,
    sort_results,
    take_batch,
)
from scriba.meta.zk_requests import ROLLED_BACK
from scriba.meta.zookeeper import ZooKeeperStore

_seq = iter(range(1_000_000))


def _write(kind: WriteKind, path: str, value: bytes = b"v", version: int = -1) -> ZkWrite:
    loop = asyncio.new_event_loop()
    try:
        fut: asyncio.Future[int] = loop.create_future()
    finally:
        loop.close()
    return ZkWrite(kind, path, value, fut, version=version)


def _stat(version: int) -> ZnodeStat:
    return ZnodeStat(1, 1, 0, 0, version, 0, 0, 0, 1, 0, 1)


def test_take_batch_keeps_order_and_both_limits() -> None:
    pending = deque(_write(WriteKind.CREATE, f"/a/{i}") for i in range(10))
    first = take_batch(pending, ops_max=4)
    assert [w.path for w in first] == ["/a/0", "/a/1", "/a/2", "/a/3"]
    assert len(pending) == 6
    big = BATCH_BYTES_MAX // 2  # two fit, a third does not
    pending = deque(_write(WriteKind.SET, f"/b/{i}", b"x" * (big - 100 - OP_OVERHEAD_BYTES)) for i in range(3))
    assert len(take_batch(pending)) == 2
    assert len(take_batch(pending)) == 1
    assert not pending


def test_take_batch_sends_an_oversized_write_alone() -> None:
    huge = _write(WriteKind.SET, "/h", b"x" * BATCH_BYTES_MAX)
    pending = deque([huge, _write(WriteKind.SET, "/s")])
    assert take_batch(pending) == [huge]
    assert len(take_batch(pending)) == 1
    with pytest.raises(InvariantViolation):
        take_batch(pending)


def test_sort_results_success_gives_each_write_its_version() -> None:
    batch = [_write(WriteKind.CREATE, "/c"), _write(WriteKind.SET, "/s", version=4)]
    fates = sort_results(batch, ["/c", _stat(5)], ROLLED_BACK)
    assert fates.values == [(batch[0], 0), (batch[1], 5)]
    assert not fates.errors and not fates.again


def test_sort_results_failure_blames_one_write_and_sends_the_rest_again() -> None:
    batch = [_write(WriteKind.CREATE, f"/{i}") for i in range(4)]
    lost = kz.NodeExistsError()
    results = [kz.RolledBackError(), kz.RolledBackError(), lost, kz.RuntimeInconsistency()]
    fates = sort_results(batch, results, ROLLED_BACK)
    assert fates.errors == [(batch[2], lost)]
    assert fates.again == [batch[0], batch[1], batch[3]]
    assert not fates.values


def test_sort_results_refuses_answers_that_would_loop_or_do_not_match() -> None:
    batch = [_write(WriteKind.CREATE, "/a"), _write(WriteKind.CREATE, "/b")]
    with pytest.raises(InvariantViolation):  # a failure that blames nobody would retry forever
        sort_results(batch, [kz.RolledBackError(), kz.RuntimeInconsistency()], ROLLED_BACK)
    with pytest.raises(InvariantViolation):
        sort_results(batch, ["/a"], ROLLED_BACK)


@pytest.fixture
async def zk(zk1_server: ZooKeeperEnsemble) -> AsyncIterator[ZooKeeperStore]:
    store = await ZooKeeperStore.open(zk1_server.uri(f"multi{os.getpid()}-{next(_seq)}"))
    try:
        yield store
    finally:
        await store.close()


async def test_concurrent_writes_share_multis_and_each_gets_its_own_outcome(zk: ZooKeeperStore) -> None:
    await zk.create("l/dup", b"first")
    v = await zk.create("l/cas", b"0")
    # one tick: 40 fresh creates, a duplicate, a CAS at a stale version, a set of a missing key
    fresh = [zk.create(f"l/{i:03}", f"{i}".encode()) for i in range(40)]
    results = await asyncio.gather(
        *fresh[:20],
        zk.create("l/dup", b"second"),
        zk.set("l/cas", b"stale", expected_version=v + 7),
        zk.set("l/nope", b"x", expected_version=0),
        zk.set("l/cas", b"1", expected_version=v),
        *fresh[20:],
        return_exceptions=True,
    )
    created = results[:20] + results[24:]
    assert created == [0] * 40
    assert isinstance(results[20], KeyExistsError)
    assert isinstance(results[21], BadVersionError)
    assert isinstance(results[22], NoSuchKeyError)
    assert results[23] == v + 1
    assert (await zk.get("l/dup")).value == b"first"
    assert (await zk.get("l/cas")).value == b"1"
    for i in range(40):
        assert (await zk.get(f"l/{i:03}")).value == f"{i}".encode()
    writes = zk._writes
    assert writes.multis >= 1 and writes.multi_writes > writes.multis  # they did share
    assert writes.requeued >= 1  # the failed writes' neighbours went again


async def test_racing_cas_writers_in_one_tick_commit_exactly_one_each_round(zk: ZooKeeperStore) -> None:
    keys = [f"r/{i}" for i in range(8)]
    versions = {k: await zk.create(k, b"0") for k in keys}
    for _ in range(5):  # 4 writers per key, all at the version they read: one wins per key
        attempts = [(k, w) for k in keys for w in range(4)]
        results = await asyncio.gather(
            *(zk.set(k, f"{w}".encode(), expected_version=versions[k]) for k, w in attempts),
            return_exceptions=True,
        )
        for k in keys:
            mine = [r for (key, _), r in zip(attempts, results, strict=True) if key == k]
            won = [r for r in mine if isinstance(r, int)]
            assert len(won) == 1, mine
            assert all(isinstance(r, BadVersionError) for r in mine if not isinstance(r, int))
            assert won[0] == versions[k] + 1
            versions[k] = won[0]
    assert [(await zk.get(k)).version for k in keys] == [versions[k] for k in keys]


async def test_baseline_without_coalescing_sends_no_multi(zk: ZooKeeperStore) -> None:
    zk._writes.ops_max = 1  # negative control for the counters the tests above rely on
    await asyncio.gather(*(zk.create(f"p/{i}", b"x") for i in range(10)))
    assert zk._writes.multis == 0
    assert len(await zk.list("p/")) == 10
