"""Read-only views of the namespace in WebHDFS's JSON shapes (FileStatus, ContentSummary,
FileChecksum), and the query codec the state machine answers.

    query(ns, {"q": "status", "path": "/a", "user": "alice"})  ->  {"FileStatus": {...}}

Queries: ``status``, ``list``, ``summary``, ``checksum``, ``blocks`` (a file's blocks
for OPEN), ``txid``, ``digest``. Path queries are checked as ``user`` (``permissions``;
no user: the namenode itself): status needs the path reachable, list READ and EXECUTE
on the directory, summary READ and EXECUTE on every directory below, checksum and
blocks READ on the file.
"""

from __future__ import annotations

import hashlib
from typing import Any

from scriba.examples.namenode import permissions as perm
from scriba.examples.namenode.errors import FileNotFoundException, IllegalArgumentException
from scriba.examples.namenode.namespace import INode, Namespace


def file_status(node: INode, suffix: str) -> dict[str, Any]:
    return {
        "accessTime": node.atime_ms,
        "blockSize": node.block_size,
        "childrenNum": len(node.children),
        "fileId": node.inode_id,
        "group": node.group,
        "length": 0 if node.is_dir else node.length_bytes,
        "modificationTime": node.mtime_ms,
        "owner": node.owner,
        "pathSuffix": suffix,
        "permission": f"{node.permission:o}",
        "replication": node.replication,
        "storagePolicy": 0,
        "type": "DIRECTORY" if node.is_dir else "FILE",
    }


def content_summary(node: INode) -> dict[str, Any]:
    dirs = files = length = space = 0
    stack = [node]
    while stack:
        n = stack.pop()
        if n.is_dir:
            dirs += 1
            stack.extend(n.children.values())
        else:
            files += 1
            length += n.length_bytes
            space += n.length_bytes * n.replication
    return {"ContentSummary": {"directoryCount": dirs, "fileCount": files, "length": length, "quota": -1,
                               "spaceConsumed": space, "spaceQuota": -1, "typeQuota": {}}}


def file_checksum(path: str, node: INode) -> dict[str, Any]:
    """An MD5 over the blocks' CRC32Cs (the shape of HDFS's MD5-of-CRC32C checksum, not its value)."""
    if node.is_dir:
        raise FileNotFoundException(f"Path is not a file: {path}")
    md5 = hashlib.md5(usedforsecurity=False)
    for block in node.blocks:
        md5.update(block.crc32c.to_bytes(4, "big"))
    return {"FileChecksum": {"algorithm": "MD5-of-0MD5-of-512CRC32C", "bytes": md5.hexdigest() + "00000000",
                             "length": 28}}


def query(ns: Namespace, request: dict[str, Any]) -> Any:
    q = request.get("q")
    if q == "txid":
        return ns.txid
    if q == "digest":
        return {"txid": ns.txid, "digest": ns.digest()}
    path = request.get("path")
    if not isinstance(path, str):
        raise IllegalArgumentException(f"query {q!r} needs a path")
    user = request.get("user", perm.INTERNAL)
    if not isinstance(user, str):
        raise IllegalArgumentException(f"query user {user!r} is not a string")
    node = ns.reach(path, user)
    if q == "status":
        return {"FileStatus": file_status(node, "")}
    if q == "list":
        if node.is_dir:
            perm.check(node, user, perm.READ | perm.EXECUTE, path)
        if not node.is_dir:
            return {"FileStatuses": {"FileStatus": [file_status(node, "")]}}
        names = sorted(node.children)
        start = request.get("after")
        if isinstance(start, str):
            names = [n for n in names if n > start]
        limit = request.get("limit")
        remaining = 0
        if isinstance(limit, int) and len(names) > limit:
            remaining, names = len(names) - limit, names[:limit]
        statuses = [file_status(node.children[n], n) for n in names]
        return {"FileStatuses": {"FileStatus": statuses}, "remainingEntries": remaining}
    if q == "summary":
        perm.check_subtree(node, user, perm.READ | perm.EXECUTE, path)
        return content_summary(node)
    if not node.is_dir:
        perm.check(node, user, perm.READ, path)
    if q == "checksum":
        return file_checksum(path, node)
    if q == "blocks":
        if node.is_dir:
            raise FileNotFoundException(f"Path is not a file: {path}")
        return {"blocks": [b.to_json() for b in node.blocks], "length": node.length_bytes}
    raise IllegalArgumentException(f"unknown query {q!r}")
