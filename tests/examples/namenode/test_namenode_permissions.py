"""HDFS's permission checks in the namespace core (no I/O): the user travels in each edit
record and query, every replica decides the same, and a denied edit changes nothing."""

from __future__ import annotations

import json

import pytest

from scriba.examples.namenode import edits as e
from scriba.examples.namenode.edits import Block
from scriba.examples.namenode.errors import AccessControlException, FileNotFoundException
from scriba.examples.namenode.machine import NamenodeMachine, parse_answer
from scriba.examples.namenode.namespace import Namespace
from scriba.examples.namenode.permissions import mode_string
from scriba.examples.namenode.views import query
from scriba.stream import Position

T = 1_700_000_000_000


def as_user(ns: Namespace, user: str, edit: e.Edit) -> object:
    import dataclasses

    return ns.apply(dataclasses.replace(edit, user=user))  # type: ignore[type-var]


def setup() -> Namespace:
    """``/home/alice`` (alice 755), ``/home/alice/private`` (alice 700) with a file, ``/tmp`` 777."""
    ns = Namespace()
    ns.apply(e.Mkdirs("/home", 0o755, "hdfs", "supergroup", T, user="hdfs"))
    ns.apply(e.Mkdirs("/tmp", 0o777, "hdfs", "supergroup", T, user="hdfs"))
    ns.apply(e.Mkdirs("/home/alice", 0o755, "alice", "supergroup", T, user="hdfs"))
    ns.apply(e.Mkdirs("/home/alice/private", 0o700, "alice", "supergroup", T, user="alice"))
    file_id = ns.apply(e.Create("/home/alice/f", False, 0o644, "alice", "supergroup", 3, 1 << 20, T, user="alice"))
    ns.apply(e.AddBlock("/home/alice/f", file_id["file_id"], Block(7, 10, 1, 10)))
    ns.apply(e.Complete("/home/alice/f", file_id["file_id"], T))
    return ns


def denied(ns: Namespace, user: str, edit: e.Edit, match: str) -> None:
    before, txid = ns.digest(), ns.txid
    with pytest.raises(AccessControlException, match=match):
        as_user(ns, user, edit)
    assert ns.txid == txid + 1
    ns.txid = txid
    assert ns.digest() == before  # a denied edit changed nothing


def test_writes_need_write_on_the_parent_and_traverse_on_the_way() -> None:
    ns = setup()
    denied(ns, "bob", e.Mkdirs("/home/bob", 0o755, "bob", "supergroup", T),
           r'user=bob, access=WRITE, inode="/home":hdfs:supergroup:drwxr-xr-x')
    denied(ns, "bob", e.Create("/home/alice/g", False, 0o644, "bob", "supergroup", 3, 1024, T),
           r'access=WRITE, inode="/home/alice":alice')
    denied(ns, "bob", e.Mkdirs("/home/alice/private/x/y", 0o755, "bob", "supergroup", T),
           r'access=EXECUTE, inode="/home/alice/private"')  # traverse, before any creation
    denied(ns, "bob", e.Create("/home/alice/f", True, 0o644, "bob", "supergroup", 3, 1024, T),
           r'access=WRITE, inode="/home/alice/f"')  # overwrite needs WRITE on the file
    denied(ns, "bob", e.Append("/home/alice/f", T), "access=WRITE")
    denied(ns, "bob", e.Rename("/home/alice/f", "/tmp/f", T), r'access=WRITE, inode="/home/alice"')
    denied(ns, "bob", e.Delete("/home/alice/f", False, T), r'access=WRITE, inode="/home/alice"')
    denied(ns, "bob", e.SetTimes("/home/alice/f", T, T), "access=WRITE")
    denied(ns, "bob", e.SetReplication("/home/alice/f", 2), "access=WRITE")
    assert as_user(ns, "bob", e.Mkdirs("/tmp/bob", 0o755, "bob", "supergroup", T)) is True  # 777: allowed
    assert ns.get("/tmp/bob").owner == "bob"
    # into a directory the user cannot write
    denied(ns, "alice", e.Rename("/home/alice/f", "/tmp/bob", T), r'access=WRITE, inode="/tmp/bob"')


def test_owner_only_and_superuser_only_changes() -> None:
    ns = setup()
    denied(ns, "bob", e.SetPermission("/home/alice/f", 0o777), "user=bob is not the owner of inode=/home/alice/f")
    denied(ns, "alice", e.SetOwner("/home/alice/f", "bob", None), "non-super user cannot change owner")
    denied(ns, "alice", e.SetOwner("/home/alice/f", None, "staff"), "User alice does not belong to staff")
    as_user(ns, "alice", e.SetPermission("/home/alice/f", 0o600))
    as_user(ns, "alice", e.SetOwner("/home/alice/f", None, "alice"))  # a group of her own
    as_user(ns, "hdfs", e.SetOwner("/home/alice/f", "carol", "staff"))  # the superuser may
    node = ns.get("/home/alice/f")
    assert (node.owner, node.group, mode_string(node)) == ("carol", "staff", "-rw-------")


def test_recursive_delete_needs_all_on_every_directory_below() -> None:
    ns = setup()
    as_user(ns, "hdfs", e.SetPermission("/home", 0o777))
    as_user(ns, "hdfs", e.SetPermission("/home/alice", 0o777))
    denied(ns, "bob", e.Delete("/home/alice", True, T), r'access=ALL, inode="/home/alice')
    assert as_user(ns, "alice", e.Delete("/home/alice", True, T))["deleted"] is True  # type: ignore[index]


def test_reads_checked_as_the_querying_user() -> None:
    ns = setup()
    as_user(ns, "alice", e.SetPermission("/home/alice/f", 0o600))
    for q in ("blocks", "checksum"):
        with pytest.raises(AccessControlException, match="access=READ"):
            query(ns, {"q": q, "path": "/home/alice/f", "user": "bob"})
        assert query(ns, {"q": q, "path": "/home/alice/f", "user": "alice"})
    with pytest.raises(AccessControlException, match="access=READ_EXECUTE"):
        query(ns, {"q": "list", "path": "/home/alice/private", "user": "bob"})
    with pytest.raises(AccessControlException, match="access=EXECUTE"):
        query(ns, {"q": "status", "path": "/home/alice/private/x", "user": "bob"})
    with pytest.raises(AccessControlException, match="access=READ_EXECUTE"):
        query(ns, {"q": "summary", "path": "/home", "user": "bob"})
    assert query(ns, {"q": "status", "path": "/home/alice/f", "user": "bob"})["FileStatus"]["permission"] == "600"
    with pytest.raises(FileNotFoundException):  # reachable but missing: not an access error
        query(ns, {"q": "status", "path": "/home/alice/nope", "user": "bob"})
    assert query(ns, {"q": "summary", "path": "/home"})  # the namenode itself (no user)


def test_user_in_records_and_old_records_read_as_the_namenode() -> None:
    edit = e.Mkdirs("/a", 0o755, "alice", "supergroup", T, user="alice")
    body = json.loads(e.encode(edit))
    assert body["v"] == 2 and body["user"] == "alice" and e.decode(e.encode(edit)) == edit
    old = {k: v for k, v in body.items() if k != "user"} | {"v": 1}
    assert e.decode(json.dumps(old).encode()).user == ""
    machine = NamenodeMachine()
    answer = machine.apply(e.encode(e.Mkdirs("/x", 0o755, "bob", "supergroup", T, user="bob")), Position(1, 0))
    with pytest.raises(AccessControlException) as denied_:
        parse_answer(answer)  # the answer carries the error to whichever replica proposed it
    assert denied_.value.http_status == 403
    assert denied_.value.remote_exception()["RemoteException"]["javaClassName"] == \
        "org.apache.hadoop.security.AccessControlException"
