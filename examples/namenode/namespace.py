"""The namespace: a tree of inodes changed only by edit records (I/O-free, deterministic).

    ns = Namespace()
    result = ns.apply(Mkdirs("/a", 0o755, "hdfs", "supergroup", t))   # -> JSON-able result
    ns.file_status("/a"); ns.list_status("/"); ns.fsimage(); Namespace.from_fsimage(image)

HDFS's rules, as ``FSDirectory`` applies them; permissions as ``permissions`` says,
checked for the record's ``user`` before any other rule:

- mkdirs creates missing parents; a file on the way is ``ParentNotDirectoryException``;
  an existing file at the path is ``FileAlreadyExistsException``.
- create creates parents; an existing directory, or a file without ``overwrite``, is
  ``FileAlreadyExistsException``; a file still under construction is
  ``AlreadyBeingCreatedException``. Overwrite returns the old blocks (to free).
- add block / complete name the file id create or append returned: a file replaced or
  deleted meanwhile answers ``LeaseExpiredException``, so a late writer never adds to
  someone else's file.
- rename (the old, boolean API WebHDFS exposes): ``false`` when the source is missing
  or the root, the destination's parent is missing, the destination is an existing
  file, or it lies inside the source's subtree; an existing directory destination
  receives the source under its own name.
- delete: ``false`` when missing or the root; a non-empty directory without
  ``recursive`` is ``PathIsNotEmptyDirectoryException``. Returns the freed blocks.

Every applied record increments ``txid`` (failed ones too: they are in the log, and
their failure is as deterministic as a success).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Final

from scriba.examples.namenode import edits as e
from scriba.examples.namenode import permissions as perm
from scriba.examples.namenode.edits import Block
from scriba.examples.namenode.errors import (
    AlreadyBeingCreatedException,
    EditLogError,
    FileAlreadyExistsException,
    FileNotFoundException,
    HdfsError,
    IllegalArgumentException,
    InvalidPathException,
    LeaseExpiredException,
    ParentNotDirectoryException,
    PathIsNotEmptyDirectoryException,
)

FSIMAGE_VERSION: Final = 1
ROOT_ID: Final = 16385  # HDFS's INodeId.ROOT_INODE_ID
PATH_BYTES_MAX: Final = 8000  # HDFS's dfs.namenode.fs-limits.max-path-length
NAME_BYTES_MAX: Final = 255  # dfs.namenode.fs-limits.max-component-length


def split_path(path: str) -> list[str]:
    """The components of an absolute HDFS path; ``InvalidPathException`` as ``DFSUtil.isValidName``."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidPathException(f"Invalid path name {path!r}: not absolute")
    if len(path.encode()) > PATH_BYTES_MAX:
        raise InvalidPathException(f"Invalid path name: longer than {PATH_BYTES_MAX} bytes")
    parts = path.rstrip("/").split("/")[1:] if path != "/" else []
    for part in parts:
        if part in ("", ".", "..") or ":" in part or "\x00" in part:
            raise InvalidPathException(f"Invalid path name {path!r}: component {part!r}")
        if len(part.encode()) > NAME_BYTES_MAX:
            raise InvalidPathException(f"Invalid path name {path!r}: component longer than {NAME_BYTES_MAX} bytes")
    return parts


@dataclass(slots=True)
class INode:
    inode_id: int
    is_dir: bool
    owner: str
    group: str
    permission: int
    mtime_ms: int
    atime_ms: int
    children: dict[str, INode] = field(default_factory=dict)  # directories
    replication: int = 0  # files from here on
    block_size: int = 0
    blocks: list[Block] = field(default_factory=list)
    under_construction: bool = False

    @property
    def length_bytes(self) -> int:
        return sum(b.length_bytes for b in self.blocks)

    def subtree_blocks(self) -> list[Block]:
        if not self.is_dir:
            return list(self.blocks)
        return [b for name in sorted(self.children) for b in self.children[name].subtree_blocks()]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.inode_id, "dir": self.is_dir, "owner": self.owner, "group": self.group,
                               "perm": self.permission, "mtime": self.mtime_ms, "atime": self.atime_ms}
        if self.is_dir:
            out["children"] = {name: self.children[name].to_json() for name in sorted(self.children)}
        else:
            out.update(repl=self.replication, bsize=self.block_size, uc=self.under_construction,
                       blocks=[b.to_json() for b in self.blocks])
        return out

    @staticmethod
    def from_json(d: dict[str, Any]) -> INode:
        node = INode(d["id"], d["dir"], d["owner"], d["group"], d["perm"], d["mtime"], d["atime"])
        if node.is_dir:
            node.children = {name: INode.from_json(child) for name, child in d["children"].items()}
        else:
            node.replication, node.block_size, node.under_construction = d["repl"], d["bsize"], d["uc"]
            node.blocks = [Block.from_json(b) for b in d["blocks"]]
        return node


class Namespace:
    def __init__(self, superuser: str = perm.SUPERUSER, supergroup: str = perm.SUPERGROUP) -> None:
        self.root = INode(ROOT_ID, True, superuser, supergroup, 0o755, 0, 0)
        self.txid = 0
        self.last_inode_id = ROOT_ID

    # --- lookup -------------------------------------------------------------------------
    def lookup(self, path: str) -> INode | None:
        node = self.root
        for part in split_path(path):
            if not node.is_dir:
                raise ParentNotDirectoryException(f"Parent path is not a directory: {path}")
            child = node.children.get(part)
            if child is None:
                return None
            node = child
        return node

    def walk(self, path: str, user: str) -> tuple[tuple[str, INode], INode | None]:
        """The nearest existing directory above ``path`` (with its path) and the node at ``path``
        (None: missing); EXECUTE is checked on every directory passed through."""
        parts = split_path(path)
        above, node = ("/", self.root), self.root
        for i, part in enumerate(parts):
            if not node.is_dir:
                raise ParentNotDirectoryException(f"Parent path is not a directory: {above[0]}")
            perm.check(node, user, perm.EXECUTE, above[0])
            child = node.children.get(part)
            if child is None:
                return above, None
            if i < len(parts) - 1:
                above = ("/" + "/".join(parts[:i + 1]), child)
            node = child
        return above, node

    def reach(self, path: str, user: str, access: int = 0) -> INode:
        """The node at ``path`` (``FileNotFoundException``), reached as ``user`` with ``access`` on it."""
        _, node = self.walk(path, user)
        if node is None:
            raise FileNotFoundException(f"File does not exist: {path}")
        if access:
            perm.check(node, user, access, path)
        return node

    def _lookup_or_none(self, path: str) -> INode | None:
        try:
            return self.lookup(path)
        except ParentNotDirectoryException:
            return None

    def get(self, path: str) -> INode:
        node = self.lookup(path)
        if node is None:
            raise FileNotFoundException(f"File does not exist: {path}")
        return node

    def _parent(self, path: str, *, create_as: tuple[str, str, int] | None = None) -> tuple[INode, str]:
        """The parent directory of ``path`` and its last name; missing parents are made with
        ``create_as = (owner, group, mtime_ms)``, else ``FileNotFoundException``."""
        parts = split_path(path)
        if not parts:
            raise FileAlreadyExistsException("/ already exists")
        node = self.root
        for i, part in enumerate(parts[:-1]):
            child = node.children.get(part)
            if child is None:
                if create_as is None:
                    raise FileNotFoundException(f"Parent directory doesn't exist: /{'/'.join(parts[:i + 1])}")
                child = self._new_inode(True, create_as[0], create_as[1], 0o755, create_as[2])
                node.children[part] = child
                node.mtime_ms = create_as[2]
            elif not child.is_dir:
                raise ParentNotDirectoryException(f"Parent path is not a directory: /{'/'.join(parts[:i + 1])}")
            node = child
        return node, parts[-1]

    def _new_inode(self, is_dir: bool, owner: str, group: str, permission: int, mtime_ms: int) -> INode:
        self.last_inode_id += 1
        return INode(self.last_inode_id, is_dir, owner, group, permission, mtime_ms, 0 if is_dir else mtime_ms)

    # --- edits ----------------------------------------------------------------------------
    def apply(self, edit: e.Edit) -> Any:
        """Apply one edit record; its result (JSON-able) or the ``HdfsError`` it fails with.

        A failed edit changes nothing: every check runs before the first change.
        """
        self.txid += 1
        handler = getattr(self, f"_apply_{edit.op.lower()}", None)
        if handler is None:
            raise EditLogError(f"no handler for edit opcode {edit.op}")
        return handler(edit)

    def _apply_mkdirs(self, edit: e.Mkdirs) -> bool:
        above, existing = self.walk(edit.path, edit.user)
        if existing is None:
            perm.check(above[1], edit.user, perm.WRITE, above[0])
        if existing is not None:
            if not existing.is_dir:
                raise FileAlreadyExistsException(f"Path is not a directory: {edit.path}")
            return True
        self._check_ancestors(edit.path)
        parent, name = self._parent(edit.path, create_as=(edit.owner, edit.group, edit.mtime_ms))
        parent.children[name] = self._new_inode(True, edit.owner, edit.group, edit.permission, edit.mtime_ms)
        parent.mtime_ms = edit.mtime_ms
        return True

    def _check_ancestors(self, path: str) -> None:
        """``ParentNotDirectoryException`` if a file lies on the way (before any change)."""
        node = self.root
        parts = split_path(path)
        for i, part in enumerate(parts[:-1]):
            child = node.children.get(part)
            if child is None:
                return
            if not child.is_dir:
                raise ParentNotDirectoryException(f"Parent path is not a directory: /{'/'.join(parts[:i + 1])}")
            node = child

    def _apply_create(self, edit: e.Create) -> dict[str, Any]:
        if edit.replication < 1 or edit.block_size < 1:
            raise IllegalArgumentException(f"replication {edit.replication} and block size {edit.block_size} must be >= 1")
        above, existing = self.walk(edit.path, edit.user)
        if existing is not None and edit.overwrite and not existing.is_dir:
            perm.check(existing, edit.user, perm.WRITE, edit.path)
        perm.check(above[1], edit.user, perm.WRITE, above[0])
        freed: list[Block] = []
        if existing is not None:
            if existing.is_dir:
                raise FileAlreadyExistsException(f"{edit.path} already exists as a directory")
            if existing.under_construction:
                raise AlreadyBeingCreatedException(f"{edit.path} is being created or appended")
            if not edit.overwrite:
                raise FileAlreadyExistsException(f"{edit.path} for client already exists")
            freed = existing.subtree_blocks()
        self._check_ancestors(edit.path)
        parent, name = self._parent(edit.path, create_as=(edit.owner, edit.group, edit.mtime_ms))
        node = self._new_inode(False, edit.owner, edit.group, edit.permission, edit.mtime_ms)
        node.replication, node.block_size, node.under_construction = edit.replication, edit.block_size, True
        parent.children[name] = node
        parent.mtime_ms = edit.mtime_ms
        return {"file_id": node.inode_id, "freed": [b.to_json() for b in freed]}

    def _writing(self, path: str, file_id: int) -> INode:
        node = self.lookup(path)
        if node is None or node.inode_id != file_id or not node.under_construction:
            raise LeaseExpiredException(f"No lease on {path} (inode {file_id}): the file was closed, replaced "
                                        "or deleted")
        return node

    def _apply_add_block(self, edit: e.AddBlock) -> int:
        node = self._writing(edit.path, edit.file_id)
        node.blocks.append(edit.block)
        return node.length_bytes

    def _apply_complete(self, edit: e.Complete) -> bool:
        node = self._writing(edit.path, edit.file_id)
        node.under_construction = False
        node.mtime_ms = edit.mtime_ms
        return True

    def _apply_append(self, edit: e.Append) -> dict[str, Any]:
        node = self.reach(edit.path, edit.user, perm.WRITE)
        if node.is_dir:
            raise FileNotFoundException(f"{edit.path} is a directory, not a file")
        if node.under_construction:
            raise AlreadyBeingCreatedException(f"{edit.path} is being created or appended")
        node.under_construction = True
        return {"file_id": node.inode_id, "length": node.length_bytes}

    def _apply_rename(self, edit: e.Rename) -> bool:
        src_parts, dst_parts = split_path(edit.path), split_path(edit.destination)
        src, dst = self._lookup_or_none(edit.path), self._lookup_or_none(edit.destination)
        if src is None or not src_parts:
            return False
        self._check_rename(edit)
        if src_parts == dst_parts:
            return True
        if dst is not None:
            if not dst.is_dir:
                return False
            dst_parts = [*dst_parts, src_parts[-1]]
            if self._lookup_or_none("/" + "/".join(dst_parts)) is not None:
                return False
        if dst_parts[:len(src_parts)] == src_parts:
            return False  # into its own subtree
        try:
            dst_parent, dst_name = self._parent("/" + "/".join(dst_parts))
        except (FileNotFoundException, ParentNotDirectoryException):
            return False
        src_parent, src_name = self._parent(edit.path)
        del src_parent.children[src_name]
        dst_parent.children[dst_name] = src
        src_parent.mtime_ms = dst_parent.mtime_ms = edit.mtime_ms
        return True

    def _check_rename(self, edit: e.Rename) -> None:
        src_parent, _ = self.walk(edit.path, edit.user)
        perm.check(src_parent[1], edit.user, perm.WRITE, src_parent[0])
        with contextlib.suppress(ParentNotDirectoryException):  # answered by the rename rules
            dst_above, dst = self.walk(edit.destination, edit.user)
            where = (edit.destination, dst) if dst is not None and dst.is_dir else dst_above
            perm.check(where[1], edit.user, perm.WRITE, where[0])

    def _apply_delete(self, edit: e.Delete) -> dict[str, Any]:
        above, node = self.walk(edit.path, edit.user)
        if node is None or not split_path(edit.path):
            return {"deleted": False, "freed": []}
        perm.check(above[1], edit.user, perm.WRITE, above[0])
        if edit.recursive:
            perm.check_subtree(node, edit.user, perm.ALL, edit.path)
        if node.is_dir and node.children and not edit.recursive:
            raise PathIsNotEmptyDirectoryException(f"{edit.path} is non empty")
        parent, name = self._parent(edit.path)
        del parent.children[name]
        parent.mtime_ms = edit.mtime_ms
        return {"deleted": True, "freed": [b.to_json() for b in node.subtree_blocks()]}

    def _apply_set_permission(self, edit: e.SetPermission) -> None:
        if not 0 <= edit.permission <= 0o1777:
            raise IllegalArgumentException(f"permission {edit.permission:o} out of range 0..1777")
        node = self.reach(edit.path, edit.user)
        perm.check_owner(node, edit.user, edit.path)
        node.permission = edit.permission

    def _apply_set_owner(self, edit: e.SetOwner) -> None:
        if edit.owner is None and edit.group is None:
            raise IllegalArgumentException("Both user and group are not specified")
        node = self.reach(edit.path, edit.user)
        perm.check_set_owner(node, edit.user, edit.path, edit.owner, edit.group)
        node.owner = edit.owner if edit.owner is not None else node.owner
        node.group = edit.group if edit.group is not None else node.group

    def _apply_set_times(self, edit: e.SetTimes) -> None:
        node = self.reach(edit.path, edit.user, perm.WRITE)
        node.mtime_ms = edit.mtime_ms if edit.mtime_ms != -1 else node.mtime_ms
        node.atime_ms = edit.atime_ms if edit.atime_ms != -1 else node.atime_ms

    def _apply_set_replication(self, edit: e.SetReplication) -> bool:
        if not 1 <= edit.replication <= 512:
            raise IllegalArgumentException(f"replication {edit.replication} out of range 1..512")
        node = self.reach(edit.path, edit.user)
        if not node.is_dir:
            perm.check(node, edit.user, perm.WRITE, edit.path)
        if node.is_dir:
            return False
        node.replication = edit.replication
        return True

    # --- fsimage --------------------------------------------------------------------------
    def fsimage(self) -> bytes:
        """The whole namespace, canonical (equal namespaces give equal bytes)."""
        image = {"v": FSIMAGE_VERSION, "txid": self.txid, "last_inode_id": self.last_inode_id,
                 "root": self.root.to_json()}
        return json.dumps(image, separators=(",", ":"), sort_keys=True).encode()

    def digest(self) -> str:
        return hashlib.sha256(self.fsimage()).hexdigest()

    @staticmethod
    def from_fsimage(data: bytes) -> Namespace:
        image = json.loads(data)
        if image.get("v") != FSIMAGE_VERSION:
            raise EditLogError(f"fsimage version {image.get('v')!r}: this namenode reads {FSIMAGE_VERSION}")
        ns = Namespace()
        ns.txid, ns.last_inode_id, ns.root = image["txid"], image["last_inode_id"], INode.from_json(image["root"])
        return ns


__all__ = ["HdfsError", "INode", "Namespace", "split_path"]
