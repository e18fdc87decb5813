"""The kv state machine alone: etcd's data model, revisions, errors, leases, snapshots."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aetcd.rpc import rpc_pb2 as pb

from scriba.examples.kvstore import commands as cmd
from scriba.examples.kvstore import errors
from scriba.examples.kvstore.commands import Op
from scriba.examples.kvstore.errors import EtcdError
from scriba.examples.kvstore.machine import KvMachine
from scriba.rsm import SnapshotReader, SnapshotWriter
from scriba.stream import Position

POS = Position(0, 0, 0)


def apply(m: KvMachine, op: Op, msg: Any, response: Any, now_ms: int = 0) -> Any:
    return cmd.parse_result(m.apply(cmd.encode(op, msg, now_ms), POS), response)


def put(m: KvMachine, key: bytes, value: bytes = b"v", **kw: Any) -> Any:
    return apply(m, Op.PUT, pb.PutRequest(key=key, value=value, **kw), pb.PutResponse)


def get(m: KvMachine, key: bytes, range_end: bytes = b"", **kw: Any) -> Any:
    return cmd.parse_result(m.query(cmd.encode(Op.RANGE, pb.RangeRequest(key=key, range_end=range_end, **kw))),
                            pb.RangeResponse)


def delete(m: KvMachine, key: bytes, range_end: bytes = b"", **kw: Any) -> Any:
    return apply(m, Op.DELETE_RANGE, pb.DeleteRangeRequest(key=key, range_end=range_end, **kw), pb.DeleteRangeResponse)


def fails_with(expected: EtcdError, call: Any, *args: Any, **kw: Any) -> None:
    with pytest.raises(EtcdError) as info:
        call(*args, **kw)
    assert info.value == expected


def test_revisions_versions_and_prev_kv() -> None:
    m = KvMachine()
    assert get(m, b"a").header.revision == 1  # an empty etcd is at revision 1
    r = put(m, b"a", b"1")
    assert r.header.revision == 2 and not r.HasField("prev_kv")
    r = put(m, b"a", b"2", prev_kv=True)
    assert r.header.revision == 3 and r.prev_kv.value == b"1" and r.prev_kv.version == 1
    kv = get(m, b"a").kvs[0]
    assert (kv.create_revision, kv.mod_revision, kv.version, kv.value) == (2, 3, 2, b"2")
    d = delete(m, b"a", prev_kv=True)
    assert d.deleted == 1 and d.prev_kvs[0].value == b"2" and d.header.revision == 4
    assert delete(m, b"a").deleted == 0 and m.revision == 4  # deleting nothing is no write
    put(m, b"a", b"3")
    kv = get(m, b"a").kvs[0]
    assert (kv.create_revision, kv.version) == (5, 1)  # re-created: a new life
    assert get(m, b"a", revision=3).kvs[0].value == b"2"  # reads of the past
    assert get(m, b"a", revision=4).kvs == []


def test_range_conventions_limit_sort_and_filters() -> None:
    m = KvMachine()
    for k in (b"a", b"b1", b"b2", b"b3", b"c"):
        put(m, k, k.upper())
    assert [kv.key for kv in get(m, b"\x00", b"\x00").kvs] == [b"a", b"b1", b"b2", b"b3", b"c"]
    assert [kv.key for kv in get(m, b"b", b"c").kvs] == [b"b1", b"b2", b"b3"]  # etcdctl --prefix b
    assert [kv.key for kv in get(m, b"b2", b"\x00").kvs] == [b"b2", b"b3", b"c"]  # --from-key
    r = get(m, b"b", b"c", limit=2)
    assert [kv.key for kv in r.kvs] == [b"b1", b"b2"] and r.more and r.count == 3
    r = get(m, b"b", b"c", keys_only=True)
    assert all(kv.value == b"" for kv in r.kvs) and len(r.kvs) == 3
    r = get(m, b"b", b"c", count_only=True)
    assert r.count == 3 and list(r.kvs) == []
    r = get(m, b"\x00", b"\x00", sort_order=pb.RangeRequest.DESCEND, sort_target=pb.RangeRequest.KEY, limit=1)
    assert [kv.key for kv in r.kvs] == [b"c"] and r.more
    r = get(m, b"\x00", b"\x00", sort_target=pb.RangeRequest.MOD, sort_order=pb.RangeRequest.DESCEND)
    assert r.kvs[0].key == b"c"
    assert [kv.key for kv in get(m, b"\x00", b"\x00", min_mod_revision=5).kvs] == [b"b3", b"c"]
    # range_end at or before key: etcd answers an empty range (no error), and deletes nothing
    assert get(m, b"c", b"a").kvs == [] and delete(m, b"c", b"a").deleted == 0


def test_bad_input_gets_etcds_errors_and_writes_nothing() -> None:
    m = KvMachine()
    put(m, b"k")
    before = m.revision
    fails_with(errors.EMPTY_KEY, put, m, b"")
    fails_with(errors.EMPTY_KEY, get, m, b"")
    fails_with(errors.EMPTY_KEY, delete, m, b"")
    fails_with(errors.FUTURE_REV, get, m, b"k", revision=99)
    fails_with(errors.LEASE_NOT_FOUND, put, m, b"k", lease=12345)
    fails_with(errors.KEY_NOT_FOUND, put, m, b"absent", b"", ignore_value=True)
    fails_with(errors.VALUE_PROVIDED, put, m, b"k", b"x", ignore_value=True)
    fails_with(errors.LEASE_PROVIDED, put, m, b"k", lease=1, ignore_lease=True)
    fails_with(errors.INVALID_SORT, get, m, b"k", sort_order=7)
    assert m.revision == before and get(m, b"k").kvs[0].version == 1
    with pytest.raises(EtcdError, match="bad request"):
        cmd.parse_result(m.apply(b"\xff", POS), pb.PutResponse)


def test_ignore_value_and_ignore_lease_keep_the_current_ones() -> None:
    m = KvMachine()
    lease = apply(m, Op.LEASE_GRANT, pb.LeaseGrantRequest(TTL=60), pb.LeaseGrantResponse, now_ms=0).ID
    put(m, b"k", b"v1", lease=lease)
    put(m, b"k", b"v2", ignore_lease=True)
    kv = get(m, b"k").kvs[0]
    assert (kv.value, kv.lease) == (b"v2", lease)
    put(m, b"k", b"", ignore_value=True)
    kv = get(m, b"k").kvs[0]
    assert (kv.value, kv.lease, kv.version) == (b"v2", 0, 3)


def compare(key: bytes, target: str, result: str, **value: Any) -> Any:
    return pb.Compare(key=key, target=getattr(pb.Compare, target), result=getattr(pb.Compare, result), **value)


def txn(m: KvMachine, compares: list[Any], success: list[Any], failure: list[Any]) -> Any:
    return apply(m, Op.TXN, pb.TxnRequest(compare=compares, success=success, failure=failure), pb.TxnResponse)


def test_txn_branches_one_revision_and_own_writes_visible() -> None:
    m = KvMachine()
    put(m, b"x", b"1")
    ops = [pb.RequestOp(request_put=pb.PutRequest(key=b"a", value=b"A")),
           pb.RequestOp(request_put=pb.PutRequest(key=b"b", value=b"B")),
           pb.RequestOp(request_range=pb.RangeRequest(key=b"a"))]
    r = txn(m, [compare(b"x", "VALUE", "EQUAL", value=b"1")], ops, [])
    assert r.succeeded and r.header.revision == 3  # two puts, one revision
    assert r.responses[2].response_range.kvs[0].value == b"A"  # the txn sees its own write
    assert get(m, b"a").kvs[0].mod_revision == get(m, b"b").kvs[0].mod_revision == 3
    fail = [pb.RequestOp(request_range=pb.RangeRequest(key=b"x"))]
    r = txn(m, [compare(b"x", "VERSION", "GREATER", version=1)], ops, fail)
    assert not r.succeeded and r.responses[0].response_range.kvs[0].value == b"1" and m.revision == 3
    # missing keys: version/create/mod compare as 0; a value compare always fails
    assert txn(m, [compare(b"nope", "CREATE", "EQUAL", create_revision=0)], [], []).succeeded
    assert not txn(m, [compare(b"nope", "VALUE", "NOT_EQUAL", value=b"z")], [], []).succeeded
    assert txn(m, [compare(b"a", "MOD", "LESS", mod_revision=4, range_end=b"c")], [], []).succeeded
    nested = pb.RequestOp(request_txn=pb.TxnRequest(
        compare=[compare(b"a", "VALUE", "EQUAL", value=b"A")],
        success=[pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"a"))]))
    r = txn(m, [], [nested], [])
    assert r.responses[0].response_txn.succeeded and get(m, b"a").kvs == [] and m.revision == 4


def test_txn_errors_leave_the_store_as_it_was() -> None:
    m = KvMachine()
    dup = [pb.RequestOp(request_put=pb.PutRequest(key=b"a")), pb.RequestOp(request_put=pb.PutRequest(key=b"a"))]
    fails_with(errors.DUPLICATE_KEY, txn, m, [], dup, [])
    overlap = [pb.RequestOp(request_put=pb.PutRequest(key=b"b1")),
               pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"b", range_end=b"c"))]
    fails_with(errors.DUPLICATE_KEY, txn, m, [], overlap, [])
    bad_lease = [pb.RequestOp(request_put=pb.PutRequest(key=b"z")),
                 pb.RequestOp(request_put=pb.PutRequest(key=b"y", lease=99))]
    fails_with(errors.LEASE_NOT_FOUND, txn, m, [], bad_lease, [])
    too_many = [pb.RequestOp(request_put=pb.PutRequest(key=b"k%d" % i)) for i in range(129)]
    fails_with(errors.TOO_MANY_OPS, txn, m, [], too_many, [])
    fails_with(errors.EMPTY_KEY, txn, m, [compare(b"", "VERSION", "EQUAL")], [], [])
    assert m.revision == 1 and get(m, b"\x00", b"\x00").count == 0


def test_compaction() -> None:
    m = KvMachine()
    for i in range(5):
        put(m, b"k", b"%d" % i)  # revisions 2..6
    delete(m, b"k")  # 7
    put(m, b"j")  # 8
    r = apply(m, Op.COMPACT, pb.CompactionRequest(revision=5), pb.CompactionResponse)
    assert r.header.revision == 8
    fails_with(errors.COMPACTED, get, m, b"k", revision=4)
    assert get(m, b"k", revision=5).kvs[0].value == b"3"  # the compacted revision itself is readable
    assert get(m, b"k", revision=6).kvs[0].value == b"4"
    fails_with(errors.COMPACTED, apply, m, Op.COMPACT, pb.CompactionRequest(revision=5), pb.CompactionResponse)
    fails_with(errors.FUTURE_REV, apply, m, Op.COMPACT, pb.CompactionRequest(revision=9), pb.CompactionResponse)
    apply(m, Op.COMPACT, pb.CompactionRequest(revision=8), pb.CompactionResponse)
    assert b"k" not in m.space.history  # deleted before the compaction point: gone
    assert [kv.key for kv in get(m, b"\x00", b"\x00").kvs] == [b"j"]


def test_leases_grant_keepalive_ttl_revoke_and_replicated_expiry() -> None:
    m = KvMachine()
    g = apply(m, Op.LEASE_GRANT, pb.LeaseGrantRequest(TTL=10), pb.LeaseGrantResponse, now_ms=1_000)
    assert g.TTL == 10 and g.ID != 0
    assert apply(m, Op.LEASE_GRANT, pb.LeaseGrantRequest(TTL=1), pb.LeaseGrantResponse).TTL == errors.LEASE_TTL_MIN_S
    fails_with(errors.LEASE_EXISTS, apply, m, Op.LEASE_GRANT, pb.LeaseGrantRequest(ID=g.ID, TTL=5),
               pb.LeaseGrantResponse)
    fails_with(errors.LEASE_TTL_TOO_LARGE, apply, m, Op.LEASE_GRANT, pb.LeaseGrantRequest(TTL=10**10),
               pb.LeaseGrantResponse)
    put(m, b"l1", lease=g.ID)
    put(m, b"l2", lease=g.ID)
    ttl = cmd.parse_result(m.query(cmd.encode(Op.LEASE_TTL, pb.LeaseTimeToLiveRequest(ID=g.ID, keys=True), 5_000)),
                           pb.LeaseTimeToLiveResponse)
    assert (ttl.TTL, ttl.grantedTTL, list(ttl.keys)) == (6, 10, [b"l1", b"l2"])
    k = apply(m, Op.LEASE_KEEPALIVE, pb.LeaseKeepAliveRequest(ID=g.ID), pb.LeaseKeepAliveResponse, now_ms=8_000)
    assert k.TTL == 10
    assert apply(m, Op.LEASE_KEEPALIVE, pb.LeaseKeepAliveRequest(ID=424242), pb.LeaseKeepAliveResponse).TTL == 0
    # expiry: an EXPIRE naming an old deadline (a keep-alive came in between) changes nothing
    rev = m.revision
    m.apply(cmd.encode_expire(g.ID, 11_000), POS)
    assert m.revision == rev and g.ID in m.leases.leases
    expired = json.loads(m.query(cmd.encode(Op.LEASES_EXPIRED, None, 18_000)))
    assert [g.ID, 18_000] in expired
    m.apply(cmd.encode_expire(g.ID, 18_000), POS)
    assert m.revision == rev + 1 and get(m, b"l1", b"l3").kvs == [] and g.ID not in m.leases.leases
    ttl = cmd.parse_result(m.query(cmd.encode(Op.LEASE_TTL, pb.LeaseTimeToLiveRequest(ID=g.ID), 0)),
                           pb.LeaseTimeToLiveResponse)
    assert ttl.TTL == -1  # etcd's answer for an unknown lease
    fails_with(errors.LEASE_NOT_FOUND, apply, m, Op.LEASE_REVOKE, pb.LeaseRevokeRequest(ID=g.ID),
               pb.LeaseRevokeResponse)


def test_revoke_deletes_the_keys_in_one_revision_and_deleted_keys_leave_the_lease() -> None:
    m = KvMachine()
    lease = apply(m, Op.LEASE_GRANT, pb.LeaseGrantRequest(TTL=60), pb.LeaseGrantResponse).ID
    put(m, b"a", lease=lease)
    put(m, b"b", lease=lease)
    put(m, b"c", lease=lease)
    delete(m, b"c")
    put(m, b"b", b"no lease now")
    assert m.leases.leases[lease].keys == {b"a"}
    rev = m.revision
    apply(m, Op.LEASE_REVOKE, pb.LeaseRevokeRequest(ID=lease), pb.LeaseRevokeResponse)
    assert m.revision == rev + 1 and [kv.key for kv in get(m, b"\x00", b"\x00").kvs] == [b"b"]


def snapshot_of(m: KvMachine) -> list[bytes]:
    out = SnapshotWriter(1024)
    m.snapshot(out)
    return out.chunks()


def test_snapshot_restore_round_trip() -> None:
    m = KvMachine()
    lease = apply(m, Op.LEASE_GRANT, pb.LeaseGrantRequest(TTL=60), pb.LeaseGrantResponse, now_ms=7).ID
    for i in range(50):
        put(m, b"k%02d" % (i % 7), bytes(range(i % 256)) * 3, lease=lease if i % 3 == 0 else 0)
    delete(m, b"k03")
    apply(m, Op.COMPACT, pb.CompactionRequest(revision=20), pb.CompactionResponse)
    chunks = snapshot_of(m)
    assert len(chunks) > 1
    copy = KvMachine()
    copy.restore(SnapshotReader(chunks))
    assert snapshot_of(copy) == chunks
    assert copy.leases.leases[lease].keys == m.leases.leases[lease].keys
    assert get(copy, b"\x00", b"\x00") == get(m, b"\x00", b"\x00")
    assert put(copy, b"new").header.revision == put(m, b"new").header.revision  # same next revision
    bad = KvMachine()
    with pytest.raises(ValueError, match="format"):
        bad.restore(SnapshotReader([b'{"format": 99}']))


# --- what the differential test against a real etcd taught (kept here as fast cases) -------------
def txn_kw(m: KvMachine, **kw: Any) -> Any:
    return apply(m, Op.TXN, pb.TxnRequest(**kw), pb.TxnResponse)


def op_put(key: bytes, value: bytes = b"v", **kw: Any) -> Any:
    return pb.RequestOp(request_put=pb.PutRequest(key=key, value=value, **kw))


def op_del(key: bytes, range_end: bytes = b"") -> Any:
    return pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=key, range_end=range_end))


def test_duplicate_keys_are_refused_in_either_branch_whichever_runs() -> None:
    m = KvMachine()
    never = [pb.Compare(key=b"a", target=pb.Compare.VERSION, result=pb.Compare.GREATER, version=5)]
    fails_with(errors.DUPLICATE_KEY, txn_kw, m, compare=never, success=[op_del(b"k"), op_put(b"k")])
    fails_with(errors.DUPLICATE_KEY, txn_kw, m, failure=[op_put(b"c/1"), op_del(b"c/", b"c0")], compare=never)
    # a nested Txn's two branches may put the same key (only one runs); a delete up to "\x00" overlaps nothing
    nested = pb.RequestOp(request_txn=pb.TxnRequest(success=[op_put(b"k")], failure=[op_put(b"k")]))
    assert txn_kw(m, success=[nested, op_del(b"a", b"\x00")]).succeeded
    fails_with(errors.DUPLICATE_KEY, txn_kw, m, success=[nested, op_put(b"k")])
    assert m.revision == 2


def test_nested_compares_see_the_state_before_the_txn() -> None:
    m = KvMachine()
    absent = [pb.Compare(key=b"k", target=pb.Compare.VERSION, result=pb.Compare.EQUAL, version=0)]
    inner = pb.RequestOp(request_txn=pb.TxnRequest(compare=absent, success=[op_put(b"seen", b"absent")],
                                                   failure=[op_put(b"seen", b"present")]))
    r = txn_kw(m, success=[op_put(b"k"), inner])
    assert r.responses[1].response_txn.succeeded and get(m, b"seen").kvs[0].value == b"absent"
    assert not r.responses[1].response_txn.header.revision  # etcd leaves a nested header empty
    assert r.responses[0].response_put.header.revision == r.header.revision == 2


def test_error_order_of_a_plain_put_and_of_a_put_in_a_txn() -> None:
    m = KvMachine()
    fails_with(errors.LEASE_NOT_FOUND, put, m, b"absent", b"", lease=7, ignore_value=True)
    fails_with(errors.KEY_NOT_FOUND, txn_kw, m, success=[op_put(b"absent", b"", lease=7, ignore_value=True)])


def test_count_only_has_no_more_and_limit_comes_before_an_unordered_target_sort() -> None:
    m = KvMachine()
    for key, value in ((b"a", b"3"), (b"b", b"2"), (b"c", b"1")):
        put(m, key, value)
    assert not get(m, b"a", b"\x00", limit=1, count_only=True).more
    # no order asked, target VALUE: etcd takes limit + 1 keys by key (a, b), then sorts those by value
    r = get(m, b"a", b"\x00", limit=1, sort_target=pb.RangeRequest.VALUE)
    assert [kv.key for kv in r.kvs] == [b"b"] and r.more
    r = get(m, b"a", b"\x00", limit=1, sort_order=pb.RangeRequest.ASCEND, sort_target=pb.RangeRequest.VALUE)
    assert [kv.key for kv in r.kvs] == [b"c"]  # an order asked: all keys sorted, then the limit


class _Node:
    """What a watcher needs of the server: headers at a revision."""

    def __init__(self, machine: KvMachine) -> None:
        self.machine = machine

    def header(self, revision: int | None = None) -> Any:
        return pb.ResponseHeader(revision=self.machine.revision if revision is None else revision)


async def test_watch_progress_notify_only_when_asked_and_idle() -> None:
    import asyncio

    from scriba.examples.kvstore.watch import Watcher

    m = KvMachine()
    put(m, b"w/a")
    out: asyncio.Queue[Any] = asyncio.Queue()
    asked = Watcher(1, pb.WatchCreateRequest(key=b"w/", range_end=b"w0", progress_notify=True), m, out, _Node(m),
                    progress_notify_s=0.05)
    silent = Watcher(2, pb.WatchCreateRequest(key=b"w/", range_end=b"w0"), m, out, _Node(m), progress_notify_s=0.05)
    tasks = [asyncio.create_task(asked.run()), asyncio.create_task(silent.run())]
    try:
        async with asyncio.timeout(30):
            progress = await out.get()
            assert (progress.watch_id, list(progress.events), progress.header.revision) == (1, [], m.revision)
            put(m, b"w/b")  # applied: the state machine wakes both watchers
            got: list[Any] = []
            while {r.watch_id for r in got if r.events} != {1, 2}:
                got.append(await out.get())
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert all(r.watch_id == 1 for r in got if not r.events)  # no progress for a watch that did not ask
