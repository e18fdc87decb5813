"""etcd's request checks that need no state (its ``api/v3rpc/key.go``), in its order.

A request that fails one is refused before it reaches the state: empty keys, an
invalid sort, a value or lease given with ``ignore_value`` / ``ignore_lease``, too
many operations in a Txn, and a Txn branch that writes one key twice (two puts, or
a put inside a deleted range; a nested Txn's two branches may put the same key,
since only one of them runs). Both branches of a Txn are checked, whichever runs.
The checks that need the store (revisions, leases, existing keys) are the state
machine's, on the branch that runs.

Deleted ranges are etcd's affine intervals ``[key, range_end)`` compared as byte
strings, where an empty end is the point ``key`` alone: a range end of ``\\x00``
sorts before every key, so such a delete (every key from ``key`` on) overlaps no put,
exactly as in etcd.
"""

from __future__ import annotations

from typing import Any

from scriba.examples.kvstore import errors

SORT_ORDERS = frozenset({0, 1, 2})
SORT_TARGETS = frozenset({0, 1, 2, 3, 4})
Interval = tuple[bytes, bytes]


def check_range_request(req: Any) -> None:
    if not req.key:
        raise errors.EMPTY_KEY
    if req.sort_order not in SORT_ORDERS or req.sort_target not in SORT_TARGETS:
        raise errors.INVALID_SORT


def check_put_request(req: Any) -> None:
    if not req.key:
        raise errors.EMPTY_KEY
    if req.ignore_value and req.value:
        raise errors.VALUE_PROVIDED
    if req.ignore_lease and req.lease:
        raise errors.LEASE_PROVIDED


def check_delete_request(req: Any) -> None:
    if not req.key:
        raise errors.EMPTY_KEY


def check_txn_request(req: Any) -> None:
    """The Txn and every operation in both branches (nested Txns too), then the duplicates."""
    _check_txn_shape(req)
    check_intervals(req.success)
    check_intervals(req.failure)


def _check_txn_shape(req: Any) -> None:
    if max(len(req.compare), len(req.success), len(req.failure)) > errors.MAX_OPS_PER_TXN:
        raise errors.TOO_MANY_OPS
    for c in req.compare:
        if not c.key:
            raise errors.EMPTY_KEY
    for o in [*req.success, *req.failure]:
        kind = o.WhichOneof("request")
        if kind == "request_range":
            check_range_request(o.request_range)
        elif kind == "request_put":
            check_put_request(o.request_put)
        elif kind == "request_delete_range":
            check_delete_request(o.request_delete_range)
        elif kind == "request_txn":
            _check_txn_shape(o.request_txn)


def _hits(dels: list[Interval], key: bytes) -> bool:
    return any((key == start) if not end else (start <= key < end) for start, end in dels)


def check_intervals(ops: Any) -> tuple[set[bytes], list[Interval]]:
    """etcd's ``checkIntervals``: the keys put and the ranges deleted by ``ops`` (nested
    Txns included), or DUPLICATE_KEY when a key is written twice."""
    dels: list[Interval] = [(o.request_delete_range.key, o.request_delete_range.range_end)
                            for o in ops if o.WhichOneof("request") == "request_delete_range"]
    puts: set[bytes] = set()
    for o in ops:
        if o.WhichOneof("request") != "request_txn":
            continue
        puts_then, dels_then = check_intervals(o.request_txn.success)
        puts_else, dels_else = check_intervals(o.request_txn.failure)
        for key in puts_then:
            if key in puts or _hits(dels, key):
                raise errors.DUPLICATE_KEY
            puts.add(key)
        for key in puts_else:
            if (key in puts and key not in puts_then) or _hits(dels, key):
                raise errors.DUPLICATE_KEY
            puts.add(key)
        dels += dels_then + dels_else
    for o in ops:
        if o.WhichOneof("request") != "request_put":
            continue
        key = o.request_put.key
        if key in puts or _hits(dels, key):
            raise errors.DUPLICATE_KEY
        puts.add(key)
    return puts, dels
