"""``MetadataStore.txn`` on ZooKeeper: user checks and writes as one multi, guarded by a read.

ZooKeeper's multi can check a znode's version, create, set and delete, but it cannot
say "this key is absent", and a record here may be a container (absent as a record,
present as a znode). So a transaction is built from a read:

1. read every key the transaction checks or writes (one ``get`` each, in parallel);
2. user checks are decided on that read: a check that fails now is a valid outcome
   (the transaction aborts at this read) and raises ``BadVersionError``;
3. missing parents are created as containers;
4. the multi holds, per user check, ops that fail unless the znode is still as read
   (absent: a create and its delete; a container or a record: a version check), then
   per written key the write at the version read: a create, a set, a container kept
   (a deleted key with records under it, or under a key this transaction puts), a
   delete, or, for a deleted key already absent, the same ops as a check (a *guard*);
5. each op has an *owner*: the user check it decides (absent or record), or none (a
   container's check, a write, a guard). When the multi fails, the failing op's owner
   tells why: a user check's op raises ``BadVersionError``; an op with no owner
   (someone wrote between our read and the multi) makes the transaction read again
   and rebuild the multi, at most ``TXN_ATTEMPTS_MAX`` times.

Writes apply in order: the last write of a key wins. Bounds: ``TXN_OPS_MAX`` checks and
writes per transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from kazoo import exceptions as kz

from scriba.errors import BadRequestError, BadVersionError
from scriba.meta.store import Check, Delete, Put, check_key, check_value
from scriba.meta.zk_requests import CONTAINER, ROLLED_BACK, Node, ZkRequests, unauthorized

TXN_OPS_MAX: Final = 128
TXN_ATTEMPTS_MAX: Final = 16

_Owners = list[Check | None]


async def zk_txn(zk: ZkRequests, checks: Sequence[Check], writes: Sequence[Put | Delete]) -> None:
    """ZooKeeper multi: user checks first, then writes guarded by the versions just read.

    A failed user check is ``BadVersionError``; a failed guard (someone wrote a key
    between our read and the multi) makes us read again and retry.
    """
    if len(checks) + len(writes) > TXN_OPS_MAX:
        raise BadRequestError(f"a transaction holds at most {TXN_OPS_MAX} checks and writes")
    final: dict[str, bytes | None] = {}  # applied in order: the last write of a key wins
    for write in writes:
        if isinstance(write, Put):
            final[check_key(write.key)] = check_value(write.key, write.value)
        else:
            final[check_key(write.key)] = None
    for check in checks:
        check_key(check.key)
    # Hand-written: a failed guard means read again and rebuild the multi at once.
    for _ in range(TXN_ATTEMPTS_MAX):
        if await _txn_attempt(zk, checks, final):
            return
    raise BadVersionError(f"txn: lost {TXN_ATTEMPTS_MAX} races in a row")


async def _txn_attempt(zk: ZkRequests, checks: Sequence[Check], final: dict[str, bytes | None]) -> bool:
    """One try: True if committed, False if a guard failed (retry), BadVersionError if a check did."""
    keys = sorted(final.keys() | {c.key for c in checks})
    read = await zk.get_many([zk.path(k) for k in keys])
    nodes = {
        k: (None if n is None or n[0] == CONTAINER else n)
        for k, n in zip(keys, read, strict=True)
    }
    raw = dict(zip(keys, read, strict=True))
    for check in checks:  # a check failing now is a valid outcome: the txn aborts at this read
        node = nodes[check.key]
        actual = None if node is None else node[1].version
        if actual != check.version:
            raise BadVersionError(
                f"txn check failed: {check.key} is at {actual}, expected {check.version}"
            )
    for key in keys:
        if raw[key] is None:
            await zk.ensure_path(zk.path(key).rpartition("/")[0])
    put_keys = [k for k, v in final.items() if v is not None]
    t = zk.client.transaction()
    owners: _Owners = []  # per op: the user check it implements, or None for a guard
    for check in checks:
        _txn_guard(t, owners, zk.path(check.key), raw[check.key], check)
    for key in sorted(final):
        path, node, value = zk.path(key), raw[key], final[key]
        if value is not None:
            if node is None:
                t.create(path, value)
            else:
                t.set_data(path, value, node[1].version)
            owners.append(None)
        elif nodes[key] is None:  # already absent: guard against a concurrent create
            _txn_guard(t, owners, path, node, None)
        elif node is not None and (
            node[1].numChildren or any(k.startswith(key + "/") for k in put_keys)
        ):
            t.set_data(path, CONTAINER, node[1].version)  # records stay under it
            owners.append(None)
        elif node is not None:
            t.delete(path, node[1].version)
            owners.append(None)
    results = await zk.kz("txn", t.commit_async)
    for i, result in enumerate(results):
        if not isinstance(result, Exception) or isinstance(result, ROLLED_BACK):
            continue
        if isinstance(result, kz.NoAuthError):
            raise unauthorized("txn", zk.hosts, result)
        owner = owners[i]
        if owner is None:
            return False  # a key changed between our read and the multi: read again
        raise BadVersionError(
            f"txn check failed: {owner.key} changed from version {owner.version} ({type(result).__name__})"
        )
    return True


def _txn_guard(t: Any, owners: _Owners, path: str, node: Node | None, check: Check | None) -> None:
    """Ops that fail unless ``path`` is as read: absent, a container, or a record at its version."""
    if node is None:  # absent: creating it must succeed (then undo)
        t.create(path, b"")
        t.delete(path, -1)
        owners += [check, check]
    elif node[0] == CONTAINER:  # absent as a record: the container must stay untouched
        t.check(path, node[1].version)
        owners.append(None)
    else:
        t.check(path, node[1].version)
        owners.append(check)
