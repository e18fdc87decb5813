"""``KvMachine``: etcd's data model as a deterministic Scriba state machine.

The store revision starts at 1 and grows by one per write transaction (a Put, a
DeleteRange that deleted something, a Txn whose chosen branch changed something, a
lease revocation that deleted keys); every change in it carries that revision.
Requests are validated before anything is written, in etcd's order: its stateless
checks (``checks``: both branches of a Txn, duplicate keys), then, on the branch a
Txn takes (every nested compare decided on the state before the Txn, as etcd's
``compareToPath``), its puts' leases and ``ignore_value``/``ignore_lease`` keys, then
its ranges' revisions; so an error leaves the store as it was. Ranges inside a Txn see the Txn's own earlier writes, as
in etcd. Results are etcd response messages with ``header.revision`` set; the server
fills the rest of the header. Errors are results (``commands.err``), never
exceptions: an exception from ``apply`` stops the replica.
"""

from __future__ import annotations

import json
from base64 import b64decode, b64encode
from collections.abc import Callable
from typing import Any

from aetcd.rpc import kv_pb2, rpc_pb2

from scriba.examples.kvstore import checks, errors
from scriba.examples.kvstore import commands as cmd
from scriba.examples.kvstore.commands import Op
from scriba.examples.kvstore.errors import EtcdError
from scriba.examples.kvstore.leases import Lease, LeaseTable
from scriba.examples.kvstore.mvcc import KeySpace, Version
from scriba.rsm import SnapshotReader, SnapshotWriter
from scriba.stream import Position

SNAPSHOT_FORMAT = 1


def to_kv(v: Version, keys_only: bool = False) -> Any:
    return kv_pb2.KeyValue(key=v.key, create_revision=v.create_revision, mod_revision=v.mod_revision,
                           version=v.version, value=b"" if keys_only else v.value, lease=v.lease)


class KvMachine:
    def __init__(self) -> None:
        self.space = KeySpace()
        self.leases = LeaseTable()
        self.revision = 1
        self.compact_revision = 0
        self._changed = False  # set by the write running in _commit
        self.listeners: list[Callable[[], None]] = []  # told after each new revision (watches); not state

    # --- the StateMachine protocol -------------------------------------------------------
    def apply(self, command: bytes, position: Position) -> bytes:
        try:
            op, now_ms, body = cmd.decode(command)
            return self._apply(op, now_ms, body)
        except EtcdError as exc:
            return cmd.err(exc)
        except ValueError as exc:  # a command this version cannot decode: refused, nothing written
            return cmd.err(EtcdError("INVALID_ARGUMENT", f"etcdserver: bad request: {exc}"))

    def query(self, request: bytes) -> bytes:
        try:
            op, now_ms, body = cmd.decode(request)
            return self._query(op, now_ms, body)
        except EtcdError as exc:
            return cmd.err(exc)

    def snapshot(self, out: SnapshotWriter) -> None:
        doc = {
            "format": SNAPSHOT_FORMAT, "revision": self.revision, "compact_revision": self.compact_revision,
            "next_lease_id": self.leases.next_id,
            "versions": [[b64encode(v.key).decode(), v.create_revision, v.mod_revision, v.version,
                          b64encode(v.value).decode(), v.lease] for v in self.space.versions()],
            "leases": [[x.lease_id, x.granted_ttl_s, x.ttl_s, x.deadline_ms] for x in self.leases.leases.values()],
        }
        out.write(json.dumps(doc, separators=(",", ":")).encode())

    def restore(self, src: SnapshotReader) -> None:
        doc = json.loads(src.read())
        if doc.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"kv snapshot format {doc.get('format')!r}, expected {SNAPSHOT_FORMAT}")
        self.revision, self.compact_revision = doc["revision"], doc["compact_revision"]
        self.space.load([Version(b64decode(k), c, m, n, b64decode(val), lease)
                         for k, c, m, n, val, lease in doc["versions"]])
        self.leases = LeaseTable()
        self.leases.next_id = doc["next_lease_id"]
        for lease_id, granted, ttl, deadline in doc["leases"]:
            self.leases.leases[lease_id] = Lease(lease_id, granted, ttl, deadline)
        for v in self.space.range(b"\x00", b"\x00", self.revision):
            if v.lease in self.leases.leases:
                self.leases.leases[v.lease].keys.add(v.key)

    # --- dispatch ------------------------------------------------------------------------
    def _apply(self, op: Op, now_ms: int, body: bytes) -> bytes:
        if op is Op.PUT:
            put = rpc_pb2.PutRequest.FromString(body)
            checks.check_put_request(put)
            self._check_put(put, self.revision, in_txn=False)
            return self._commit(lambda rev: self._put(put, rev))
        if op is Op.DELETE_RANGE:
            dr = rpc_pb2.DeleteRangeRequest.FromString(body)
            checks.check_delete_request(dr)
            return self._commit(lambda rev: self._delete(dr, rev))
        if op is Op.TXN:
            return self._txn(rpc_pb2.TxnRequest.FromString(body))
        if op is Op.COMPACT:
            return self._compact(rpc_pb2.CompactionRequest.FromString(body))
        if op is Op.LEASE_GRANT:
            req = rpc_pb2.LeaseGrantRequest.FromString(body)
            lease = self.leases.grant(req.ID, req.TTL, now_ms)
            return cmd.ok(rpc_pb2.LeaseGrantResponse(header=self._header(), ID=lease.lease_id, TTL=lease.ttl_s))
        if op is Op.LEASE_REVOKE:
            lease = self.leases.get(rpc_pb2.LeaseRevokeRequest.FromString(body).ID)
            self._revoke(lease)
            return cmd.ok(rpc_pb2.LeaseRevokeResponse(header=self._header()))
        if op is Op.LEASE_KEEPALIVE:
            req = rpc_pb2.LeaseKeepAliveRequest.FromString(body)
            ttl = self.leases.renew(req.ID, now_ms)
            return cmd.ok(rpc_pb2.LeaseKeepAliveResponse(header=self._header(), ID=req.ID, TTL=ttl))
        if op is Op.LEASE_EXPIRE:
            lease_id, deadline_ms = cmd.decode_expire(body)
            expiring = self.leases.leases.get(lease_id)
            if expiring is not None and expiring.deadline_ms == deadline_ms:
                self._revoke(expiring)
            return cmd.ok(rpc_pb2.LeaseRevokeResponse(header=self._header()))
        raise ValueError(f"op {op.name} is a query, not a command")

    def _query(self, op: Op, now_ms: int, body: bytes) -> bytes:
        if op is Op.RANGE:
            req = rpc_pb2.RangeRequest.FromString(body)
            checks.check_range_request(req)
            self._check_range(req, self.revision)
            return cmd.ok(self._range(req, self.revision))
        if op is Op.LEASE_TTL:
            req = rpc_pb2.LeaseTimeToLiveRequest.FromString(body)
            lease = self.leases.leases.get(req.ID)
            if lease is None:  # etcd answers TTL -1, not an error
                return cmd.ok(rpc_pb2.LeaseTimeToLiveResponse(header=self._header(), ID=req.ID, TTL=-1))
            keys = sorted(lease.keys) if req.keys else []
            return cmd.ok(rpc_pb2.LeaseTimeToLiveResponse(header=self._header(), ID=lease.lease_id,
                                                          TTL=lease.remaining_s(now_ms),
                                                          grantedTTL=lease.granted_ttl_s, keys=keys))
        if op is Op.LEASE_LIST:
            return cmd.ok(rpc_pb2.LeaseLeasesResponse(
                header=self._header(), leases=[rpc_pb2.LeaseStatus(ID=i) for i in sorted(self.leases.leases)]))
        if op is Op.LEASES_EXPIRED:
            expired = self.leases.expired(now_ms)
            return json.dumps([[x.lease_id, x.deadline_ms] for x in expired]).encode()
        if op is Op.STATUS:
            return json.dumps({"revision": self.revision, "compact_revision": self.compact_revision,
                               "keys": len(self.space.keys), "leases": len(self.leases.leases)}).encode()
        raise EtcdError("INVALID_ARGUMENT", f"etcdserver: op {op.name} is a command, not a query")

    def _header(self, revision: int | None = None) -> Any:
        return rpc_pb2.ResponseHeader(revision=self.revision if revision is None else revision)

    # --- checks that need the state (``checks`` holds etcd's stateless ones) ------------------
    def _check_range(self, req: Any, current: int) -> None:
        if req.revision > current:
            raise errors.FUTURE_REV
        if 0 < req.revision < self.compact_revision:
            raise errors.COMPACTED

    def _check_put(self, req: Any, next_rev: int, *, in_txn: bool) -> None:
        """etcd's order: a plain Put checks its lease before the key's existence; a put in a
        Txn (etcd's ``checkRequestPut``) the other way round."""
        missing_key = (req.ignore_value or req.ignore_lease) and self.space.at(req.key, next_rev) is None
        if in_txn and missing_key:
            raise errors.KEY_NOT_FOUND
        if req.lease and req.lease not in self.leases.leases:
            raise errors.LEASE_NOT_FOUND
        if missing_key:
            raise errors.KEY_NOT_FOUND

    def _path(self, req: Any, out: list[bool]) -> list[bool]:
        """Which branch each Txn takes (nested ones in order), all decided on the state before
        the Txn, as etcd's ``compareToPath``."""
        succeeded = all(self._compare(c, self.revision) for c in req.compare)
        out.append(succeeded)
        for o in req.success if succeeded else req.failure:
            if o.WhichOneof("request") == "request_txn":
                self._path(o.request_txn, out)
        return out

    def _branch_ops(self, req: Any, path: list[bool]) -> list[Any]:
        """The operations that will run, nested Txns flattened (etcd's ``checkRequests`` walk)."""
        taken: list[Any] = []
        steps = iter(path)

        def walk(r: Any) -> None:
            for o in r.success if next(steps) else r.failure:
                if o.WhichOneof("request") == "request_txn":
                    walk(o.request_txn)
                else:
                    taken.append(o)

        walk(req)
        return taken

    def _check_branch(self, ops: list[Any]) -> None:
        """etcd's applier checks: every put of the branch first, then every range."""
        for o in ops:
            if o.WhichOneof("request") == "request_put":
                self._check_put(o.request_put, self.revision, in_txn=True)
        for o in ops:
            if o.WhichOneof("request") == "request_range":
                self._check_range(o.request_range, self.revision)

    # --- writes ----------------------------------------------------------------------------
    def _commit(self, run: Any) -> bytes:
        """Run a write at the next revision; the revision moves only if something changed."""
        next_rev = self.revision + 1
        self._changed = False
        response = run(next_rev)
        if self._changed:
            self.revision = next_rev
            self._notify()
        response.header.CopyFrom(self._header())
        return cmd.ok(response)

    def _put(self, req: Any, rev: int) -> Any:
        current = self.space.at(req.key, rev)
        value = current.value if req.ignore_value and current else req.value
        lease = current.lease if req.ignore_lease and current else req.lease
        prev, _ = self.space.put(req.key, value, lease, rev)
        self.leases.attach(req.key, prev.lease if prev else 0, lease)
        self._changed = True
        resp = rpc_pb2.PutResponse(header=self._header(rev))  # inside a Txn, etcd says the new revision
        if req.prev_kv and prev is not None:
            resp.prev_kv.CopyFrom(to_kv(prev))
        return resp

    def _delete(self, req: Any, rev: int) -> Any:
        deleted = self.space.delete(req.key, req.range_end, rev)
        for v in deleted:
            self.leases.attach(v.key, v.lease, 0)
        self._changed = self._changed or bool(deleted)
        return rpc_pb2.DeleteRangeResponse(header=self._header(rev if self._changed else self.revision),
                                           deleted=len(deleted),
                                           prev_kvs=[to_kv(v) for v in deleted] if req.prev_kv else [])

    def _range(self, req: Any, rev: int) -> Any:
        at = req.revision or rev
        found = self.space.range(req.key, req.range_end, at)
        count = len(found)
        filtered = req.min_mod_revision or req.max_mod_revision or req.min_create_revision or req.max_create_revision
        if req.limit > 0 and req.sort_order == 0 and not filtered:
            # etcd fetches limit + 1 keys in key order when no order is asked, then sorts those by
            # the target (ascending, for a target other than the key): kept, clients see it
            found = found[:req.limit + 1]
        found = [v for v in found if _within(v, req)]
        found = _sorted(found, req)
        more = 0 < req.limit < len(found) and not req.count_only  # etcd: a count has no "more"
        if req.limit > 0:
            found = found[:req.limit]
        kvs = [] if req.count_only else [to_kv(v, req.keys_only) for v in found]
        return rpc_pb2.RangeResponse(header=self._header(), kvs=kvs, more=more, count=count)

    def _txn(self, req: Any) -> bytes:
        checks.check_txn_request(req)
        path = self._path(req, [])
        self._check_branch(self._branch_ops(req, path))
        steps = iter(path)
        return self._commit(lambda rev: self._run_txn(req, rev, steps))

    def _run_txn(self, req: Any, rev: int, steps: Any) -> Any:
        succeeded = next(steps)
        responses = []
        for o in req.success if succeeded else req.failure:
            kind = o.WhichOneof("request")
            if kind == "request_range":
                r = self._range(o.request_range, rev)
                r.header.revision = rev if self._changed else self.revision
                responses.append(rpc_pb2.ResponseOp(response_range=r))
            elif kind == "request_put":
                responses.append(rpc_pb2.ResponseOp(response_put=self._put(o.request_put, rev)))
            elif kind == "request_delete_range":
                responses.append(rpc_pb2.ResponseOp(response_delete_range=self._delete(o.request_delete_range, rev)))
            else:
                responses.append(rpc_pb2.ResponseOp(response_txn=self._run_txn(o.request_txn, rev, steps)))
        # a nested Txn's header stays empty in etcd; the outermost one's is set by _commit
        return rpc_pb2.TxnResponse(header=rpc_pb2.ResponseHeader(), succeeded=succeeded, responses=responses)

    def _compare(self, c: Any, rev: int) -> bool:
        found = self.space.range(c.key, c.range_end, rev)
        if not found:
            if c.target == rpc_pb2.Compare.VALUE:
                return False  # etcd: a value compare on a missing key always fails
            return _compare_kv(c, None)
        return all(_compare_kv(c, v) for v in found)

    def _compact(self, req: Any) -> bytes:
        if req.revision <= self.compact_revision:
            raise errors.COMPACTED
        if req.revision > self.revision:
            raise errors.FUTURE_REV
        self.space.compact(req.revision)
        self.compact_revision = req.revision
        return cmd.ok(rpc_pb2.CompactionResponse(header=self._header()))

    def _revoke(self, lease: Lease) -> None:
        keys = sorted(lease.keys)
        del self.leases.leases[lease.lease_id]
        if keys:
            next_rev = self.revision + 1
            for key in keys:
                self.space.delete(key, b"", next_rev)
            self.revision = next_rev
            self._notify()

    def _notify(self) -> None:
        for listener in self.listeners:
            listener()

    def events(self, key: bytes, end: bytes, first: int, last: int, prev_kv: bool) -> list[Any]:
        """The watch events of ``[key, end)`` in revisions ``first..last``, by revision then key."""
        found = []
        for k in self.space.select(key, end):
            versions = self.space.history[k]
            for i, v in enumerate(versions):
                if first <= v.mod_revision <= last:
                    found.append((v, versions[i - 1] if i > 0 and versions[i - 1].live else None))
        found.sort(key=lambda pair: (pair[0].mod_revision, pair[0].key))
        out = []
        for v, before in found:
            kv = to_kv(v) if v.live else kv_pb2.KeyValue(key=v.key, mod_revision=v.mod_revision)
            event = kv_pb2.Event(type=kv_pb2.Event.PUT if v.live else kv_pb2.Event.DELETE, kv=kv)
            if prev_kv and before is not None:
                event.prev_kv.CopyFrom(to_kv(before))
            out.append(event)
        return out


def _within(v: Version, req: Any) -> bool:
    return not (
        (req.min_mod_revision and v.mod_revision < req.min_mod_revision)
        or (req.max_mod_revision and v.mod_revision > req.max_mod_revision)
        or (req.min_create_revision and v.create_revision < req.min_create_revision)
        or (req.max_create_revision and v.create_revision > req.max_create_revision)
    )


_SORT_FIELDS = {0: "key", 1: "version", 2: "create_revision", 3: "mod_revision", 4: "value"}


def _sorted(found: list[Version], req: Any) -> list[Version]:
    order, target = req.sort_order, req.sort_target
    if order not in (0, 1, 2) or target not in _SORT_FIELDS:
        raise errors.INVALID_SORT
    if order == 0 and target == 0:
        return found  # already by key
    attr = _SORT_FIELDS[target]
    return sorted(found, key=lambda v: getattr(v, attr), reverse=order == 2)


def _compare_kv(c: Any, v: Version | None) -> bool:
    target = c.target
    mine: bytes | int
    theirs: bytes | int
    if target == rpc_pb2.Compare.VALUE:
        mine, theirs = (v.value if v else b""), c.value
    elif target == rpc_pb2.Compare.VERSION:
        mine, theirs = (v.version if v else 0), c.version
    elif target == rpc_pb2.Compare.CREATE:
        mine, theirs = (v.create_revision if v else 0), c.create_revision
    elif target == rpc_pb2.Compare.MOD:
        mine, theirs = (v.mod_revision if v else 0), c.mod_revision
    else:
        mine, theirs = (v.lease if v else 0), c.lease
    result = c.result
    if result == rpc_pb2.Compare.EQUAL:
        return mine == theirs  # type: ignore[no-any-return]
    if result == rpc_pb2.Compare.NOT_EQUAL:
        return mine != theirs  # type: ignore[no-any-return]
    if result == rpc_pb2.Compare.GREATER:
        return mine > theirs  # type: ignore[no-any-return,operator]
    return mine < theirs  # type: ignore[no-any-return,operator]
