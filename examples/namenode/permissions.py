"""HDFS's permission checks (``FSPermissionChecker``), I/O-free and deterministic.

    check(node, user, WRITE, "/a/b")     # AccessControlException unless allowed

The user comes from the request (WebHDFS's ``user.name``, as in HDFS without Kerberos)
and travels inside every edit record, so every replica decides the same. Rules:

- the superuser (``hdfs``, the namespace's root owner) passes every check; so does the
  namenode itself (user ``""``: lease recovery, blocks of an upload already allowed);
- a user's groups are ``{user}`` (this example has no group mapping service): the
  group bits apply to a node whose group is named like the user;
- the owner's bits apply to the owner, the group's to its group, the others' to the rest;
- reaching a path needs EXECUTE on every directory on the way (``traverse``).

What each operation needs (as HDFS): mkdirs/create — WRITE on the nearest existing
ancestor (create with overwrite also WRITE on the file); append, set times, set
replication — WRITE on the file; rename — WRITE on the source's parent and on the
destination's nearest existing ancestor; delete — WRITE on the parent and, when
recursive, ALL on every directory below; set permission — the owner; set owner — the
superuser (an owner may only change the group to one of its own); open and checksum —
READ; list — READ and EXECUTE on the directory; content summary — READ and EXECUTE on
every directory below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from scriba.examples.namenode.errors import AccessControlException

if TYPE_CHECKING:
    from scriba.examples.namenode.namespace import INode

SUPERUSER: Final = "hdfs"
SUPERGROUP: Final = "supergroup"
INTERNAL: Final = ""  # the namenode's own records (never checked)
READ, WRITE, EXECUTE = 4, 2, 1
ALL: Final = READ | WRITE | EXECUTE
_NAMES: Final = {READ: "READ", WRITE: "WRITE", EXECUTE: "EXECUTE", READ | EXECUTE: "READ_EXECUTE",
                 WRITE | EXECUTE: "WRITE_EXECUTE", READ | WRITE: "READ_WRITE", ALL: "ALL"}


def privileged(user: str) -> bool:
    return user in (SUPERUSER, INTERNAL)


def mode_string(node: INode) -> str:
    """``drwxr-xr-x`` / ``-rw-r--r--`` (``t``/``T`` for the sticky bit), as HDFS prints it."""
    bits = "".join(c if node.permission & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))
    if node.permission & 0o1000:
        bits = bits[:8] + ("t" if bits[8] == "x" else "T")
    return ("d" if node.is_dir else "-") + bits


def check(node: INode, user: str, access: int, path: str) -> None:
    """``AccessControlException`` unless ``user`` has ``access`` on ``node``."""
    if privileged(user):
        return
    if user == node.owner:
        bits = node.permission >> 6
    elif user == node.group:
        bits = node.permission >> 3
    else:
        bits = node.permission
    if bits & access != access:
        raise AccessControlException(
            f'Permission denied: user={user}, access={_NAMES[access]}, '
            f'inode="{path}":{node.owner}:{node.group}:{mode_string(node)}')


def check_owner(node: INode, user: str, path: str) -> None:
    if not privileged(user) and user != node.owner:
        raise AccessControlException(f"Permission denied. user={user} is not the owner of inode={path}")


def check_set_owner(node: INode, user: str, path: str, owner: str | None, group: str | None) -> None:
    if privileged(user):
        return
    check_owner(node, user, path)
    if owner is not None and owner != node.owner:
        raise AccessControlException(f"User {user} is not a super user (non-super user cannot change owner).")
    if group is not None and group != user:
        raise AccessControlException(f"User {user} does not belong to {group}")


def check_subtree(node: INode, user: str, access: int, path: str) -> None:
    """``access`` on every directory of the subtree under ``node`` (delete -r, content summary)."""
    if privileged(user) or not node.is_dir:
        return
    stack = [(node, path)]
    while stack:
        current, where = stack.pop()
        check(current, user, access, where)
        stack.extend((child, f"{where.rstrip('/')}/{name}") for name, child in current.children.items()
                     if child.is_dir)
