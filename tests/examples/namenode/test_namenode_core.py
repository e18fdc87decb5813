"""The namespace core: HDFS's rules, edit records, replay and fsimage (no I/O)."""

from __future__ import annotations

import json

import pytest

from scriba.examples.namenode import edits as e
from scriba.examples.namenode.edits import Block
from scriba.examples.namenode.errors import (
    AlreadyBeingCreatedException,
    EditLogError,
    FileAlreadyExistsException,
    FileNotFoundException,
    InvalidPathException,
    LeaseExpiredException,
    ParentNotDirectoryException,
    PathIsNotEmptyDirectoryException,
)
from scriba.examples.namenode.machine import NamenodeMachine, parse_answer
from scriba.examples.namenode.namespace import Namespace, split_path
from scriba.examples.namenode.views import query
from scriba.rsm import SnapshotReader, SnapshotWriter
from scriba.stream import Position

T = 1_700_000_000_000


def mkdirs(path: str) -> e.Mkdirs:
    return e.Mkdirs(path, 0o755, "alice", "staff", T)


def create(path: str, overwrite: bool = False) -> e.Create:
    return e.Create(path, overwrite, 0o644, "alice", "staff", 3, 1 << 20, T)


def write_file(ns: Namespace, path: str, *lengths: int) -> int:
    file_id = ns.apply(create(path, overwrite=True))["file_id"]
    for i, n in enumerate(lengths):
        ns.apply(e.AddBlock(path, file_id, Block(1000 + i, n, i, 65536)))
    ns.apply(e.Complete(path, file_id, T + 1))
    return int(file_id)


def test_paths_validated_like_dfsutil() -> None:
    assert split_path("/") == [] and split_path("/a/b/") == ["a", "b"]
    for bad in ("a/b", "", "/a/../b", "/a/./b", "/a//b", "/a:b", "/" + "x" * 300):
        with pytest.raises(InvalidPathException):
            split_path(bad)


def test_mkdirs_creates_parents_and_refuses_files_on_the_way() -> None:
    ns = Namespace()
    assert ns.apply(mkdirs("/a/b/c")) is True
    assert ns.get("/a/b").is_dir and ns.get("/a/b/c").owner == "alice"
    assert ns.apply(mkdirs("/a/b")) is True  # existing directory: true
    write_file(ns, "/a/f", 10)
    with pytest.raises(FileAlreadyExistsException):
        ns.apply(mkdirs("/a/f"))
    with pytest.raises(ParentNotDirectoryException):
        ns.apply(mkdirs("/a/f/x"))
    assert ns.txid == 7  # failed edits are records too


def test_create_overwrite_rules_and_freed_blocks() -> None:
    ns = Namespace()
    write_file(ns, "/d/f", 5, 7)
    assert ns.get("/d/f").length_bytes == 12 and ns.get("/d").is_dir
    with pytest.raises(FileAlreadyExistsException):
        ns.apply(create("/d/f"))
    with pytest.raises(FileAlreadyExistsException):
        ns.apply(create("/d"))
    result = ns.apply(create("/d/f", overwrite=True))
    assert [b[0] for b in result["freed"]] == [1000, 1001]
    assert ns.get("/d/f").length_bytes == 0 and ns.get("/d/f").under_construction
    with pytest.raises(AlreadyBeingCreatedException):
        ns.apply(create("/d/f", overwrite=True))


def test_blocks_only_for_the_file_being_written() -> None:
    ns = Namespace()
    old_id = write_file(ns, "/f", 3)
    with pytest.raises(LeaseExpiredException):  # closed
        ns.apply(e.AddBlock("/f", old_id, Block(1, 1, 0, 1)))
    new_id = ns.apply(create("/f", overwrite=True))["file_id"]
    with pytest.raises(LeaseExpiredException):  # replaced: the old writer's id no longer matches
        ns.apply(e.Complete("/f", old_id, T))
    assert ns.apply(e.Complete("/f", new_id, T)) is True


def test_append_reopens_a_closed_file() -> None:
    ns = Namespace()
    file_id = write_file(ns, "/f", 4)
    assert ns.apply(e.Append("/f", T + 5)) == {"file_id": file_id, "length": 4}
    with pytest.raises(AlreadyBeingCreatedException):
        ns.apply(e.Append("/f", T + 6))
    ns.apply(e.AddBlock("/f", file_id, Block(7, 6, 0, 65536)))
    ns.apply(e.Complete("/f", file_id, T + 7))
    assert ns.get("/f").length_bytes == 10 and ns.get("/f").mtime_ms == T + 7
    with pytest.raises(FileNotFoundException):
        ns.apply(e.Append("/nope", T))


def test_rename_rules() -> None:
    ns = Namespace()
    ns.apply(mkdirs("/a/b"))
    ns.apply(mkdirs("/c"))
    write_file(ns, "/f", 1)
    write_file(ns, "/g", 1)
    assert ns.apply(e.Rename("/a", "/a/b/x", T)) is False  # into its own subtree
    assert ns.apply(e.Rename("/a", "/a/b", T)) is False
    assert ns.apply(e.Rename("/missing", "/x", T)) is False
    assert ns.apply(e.Rename("/f", "/nodir/f", T)) is False  # destination parent missing
    assert ns.apply(e.Rename("/f", "/g", T)) is False  # existing file destination
    assert ns.apply(e.Rename("/", "/x", T)) is False
    assert ns.apply(e.Rename("/f", "/c", T)) is True  # into an existing directory
    assert ns.lookup("/c/f") is not None and ns.lookup("/f") is None
    assert ns.apply(e.Rename("/a", "/c/a2", T)) is True  # a directory, atomically
    assert ns.get("/c/a2/b").is_dir and ns.lookup("/a") is None


def test_delete_rules() -> None:
    ns = Namespace()
    write_file(ns, "/d/e/f", 3, 4)
    with pytest.raises(PathIsNotEmptyDirectoryException):
        ns.apply(e.Delete("/d", False, T))
    assert ns.apply(e.Delete("/missing", True, T)) == {"deleted": False, "freed": []}
    assert ns.apply(e.Delete("/", True, T))["deleted"] is False
    result = ns.apply(e.Delete("/d", True, T))
    assert result["deleted"] is True and [b[0] for b in result["freed"]] == [1000, 1001]
    assert ns.lookup("/d") is None


def test_attributes() -> None:
    ns = Namespace()
    write_file(ns, "/f", 3)
    ns.apply(e.SetPermission("/f", 0o600))
    ns.apply(e.SetOwner("/f", None, "wheel"))
    ns.apply(e.SetTimes("/f", -1, T + 9))
    assert ns.apply(e.SetReplication("/f", 2)) is True
    node = ns.get("/f")
    assert (node.permission, node.owner, node.group, node.atime_ms, node.mtime_ms, node.replication) == \
        (0o600, "alice", "wheel", T + 9, T + 1, 2)
    status = query(ns, {"q": "status", "path": "/f"})["FileStatus"]
    assert status["permission"] == "600" and status["type"] == "FILE" and status["length"] == 3
    with pytest.raises(FileNotFoundException):
        ns.apply(e.SetPermission("/nope", 0o600))


def test_views() -> None:
    ns = Namespace()
    for name in ("b", "a", "c"):
        write_file(ns, f"/d/{name}", 2, 3)
    listing = query(ns, {"q": "list", "path": "/d"})
    assert [s["pathSuffix"] for s in listing["FileStatuses"]["FileStatus"]] == ["a", "b", "c"]
    batch = query(ns, {"q": "list", "path": "/d", "after": "a", "limit": 1})
    assert [s["pathSuffix"] for s in batch["FileStatuses"]["FileStatus"]] == ["b"] and batch["remainingEntries"] == 1
    summary = query(ns, {"q": "summary", "path": "/"})["ContentSummary"]
    assert (summary["directoryCount"], summary["fileCount"], summary["length"]) == (2, 3, 15)
    assert query(ns, {"q": "checksum", "path": "/d/a"}) == query(ns, {"q": "checksum", "path": "/d/b"})


def test_records_roundtrip_and_unknown_records_stop_replay() -> None:
    edit = e.AddBlock("/f", 17, Block(1, 2, 3, 4))
    assert e.decode(e.encode(edit)) == edit
    body = json.loads(e.encode(edit))
    for bad, why in (({**body, "op": "TRUNCATE"}, "unknown edit opcode"),
                     ({**body, "v": 3}, "version 3"),
                     ({**body, "extra": 1}, "fields"),
                     ({**body, "file_id": "17"}, "expected int"),
                     ({**body, "file_id": True}, "expected int")):
        with pytest.raises(EditLogError, match=why):
            e.decode(json.dumps(bad).encode())
    machine = NamenodeMachine()
    with pytest.raises(EditLogError):
        machine.apply(b'{"v":1,"op":"CONCAT","path":"/x"}', Position(1, 0))
    assert machine.ns.txid == 0  # nothing applied


def test_machine_answers_errors_and_replay_is_deterministic() -> None:
    records = [e.encode(x) for x in (mkdirs("/a"), create("/a/f"), e.Rename("/a", "/b", T), e.Delete("/b", False, T),
                                     e.SetOwner("/b/f", "bob", None), mkdirs("/b/f/x"))]
    one, two = NamenodeMachine(), NamenodeMachine()
    answers = [one.apply(r, Position(1, i)) for i, r in enumerate(records)]
    assert [two.apply(r, Position(1, i)) for i, r in enumerate(records)] == answers
    assert parse_answer(answers[0]) == (1, True)
    with pytest.raises(PathIsNotEmptyDirectoryException):
        parse_answer(answers[3])
    with pytest.raises(ParentNotDirectoryException):
        parse_answer(answers[5])
    assert one.ns.digest() == two.ns.digest() and one.ns.get("/b/f").owner == "bob"
    out = SnapshotWriter(1024)
    one.snapshot(out)
    three = NamenodeMachine()
    three.restore(SnapshotReader(out.chunks()))
    assert three.ns.digest() == one.ns.digest() and three.ns.txid == 6
    # a further edit keeps them equal; a differing one makes the digests differ (negative control)
    nxt = e.encode(e.SetPermission("/b", 0o700))
    one.apply(nxt, Position(1, 9))
    three.apply(nxt, Position(1, 9))
    assert three.ns.digest() == one.ns.digest()
    three.apply(e.encode(e.SetPermission("/b", 0o701)), Position(1, 10))
    assert three.ns.digest() != one.ns.digest()
    with pytest.raises(FileNotFoundException):
        parse_answer(one.query(json.dumps({"q": "status", "path": "/zzz"}).encode()))
