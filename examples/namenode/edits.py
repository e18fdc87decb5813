"""The edit log's records: one frozen dataclass per operation, versioned JSON on the wire.

    record = encode(Mkdirs("/a/b", permission=0o755, owner="hdfs", group="supergroup", mtime_ms=t))
    edit = decode(record)              # EditLogError on an unknown opcode or version: replay stops

A record is ``{"v": 2, "op": "MKDIRS", "user": "alice", <fields>}``; ``user`` is who asked
(checked against the namespace's permissions when applied; ``""``: the namenode itself).
A version-1 record has no ``user`` and reads as ``""`` (it was written before checks).
Every field the proposer knows is in the record — times included — so that applying it is deterministic on every
replica. The transaction id is not in the record: it is the record's rank among the
applied records (``Namespace.txid``), the same on every replica.

Versioning rule: a reader knows versions ``1..VERSION``; a record of a newer version
or an opcode it does not know is an :class:`EditLogError` (never skipped). A new field
is added with a default and a version bump.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from scriba.examples.namenode.errors import EditLogError

VERSION: Final = 2  # 2: every record carries the requesting ``user`` (permission checks)


@dataclass(frozen=True, slots=True)
class Block:
    """A file's block: a closed ledger holding ``length_bytes`` in entries of ``entry_bytes``."""

    ledger_id: int
    length_bytes: int
    crc32c: int
    entry_bytes: int

    def to_json(self) -> list[int]:
        return [self.ledger_id, self.length_bytes, self.crc32c, self.entry_bytes]

    @staticmethod
    def from_json(value: Any) -> Block:
        if not (isinstance(value, list) and len(value) == 4 and all(type(v) is int for v in value)):
            raise EditLogError(f"bad block {value!r}: [ledger_id, length_bytes, crc32c, entry_bytes]")
        return Block(*value)


class Edit:
    op: ClassVar[str]
    path: str
    user: str


@dataclass(frozen=True, slots=True)
class Mkdirs(Edit):
    op: ClassVar[str] = "MKDIRS"
    path: str
    permission: int
    owner: str
    group: str
    mtime_ms: int
    user: str = ""


@dataclass(frozen=True, slots=True)
class Create(Edit):
    """A new file under construction (parents created); ``overwrite`` replaces a file."""

    op: ClassVar[str] = "CREATE"
    path: str
    overwrite: bool
    permission: int
    owner: str
    group: str
    replication: int
    block_size: int
    mtime_ms: int
    user: str = ""


@dataclass(frozen=True, slots=True)
class AddBlock(Edit):
    op: ClassVar[str] = "ADD_BLOCK"
    path: str
    file_id: int
    block: Block
    user: str = ""


@dataclass(frozen=True, slots=True)
class Complete(Edit):
    op: ClassVar[str] = "COMPLETE"
    path: str
    file_id: int
    mtime_ms: int
    user: str = ""


@dataclass(frozen=True, slots=True)
class Append(Edit):
    """Reopen a closed file for more blocks."""

    op: ClassVar[str] = "APPEND"
    path: str
    mtime_ms: int
    user: str = ""


@dataclass(frozen=True, slots=True)
class Rename(Edit):
    op: ClassVar[str] = "RENAME"
    path: str
    destination: str
    mtime_ms: int
    user: str = ""


@dataclass(frozen=True, slots=True)
class Delete(Edit):
    op: ClassVar[str] = "DELETE"
    path: str
    recursive: bool
    mtime_ms: int
    user: str = ""


@dataclass(frozen=True, slots=True)
class SetPermission(Edit):
    op: ClassVar[str] = "SET_PERMISSION"
    path: str
    permission: int
    user: str = ""


@dataclass(frozen=True, slots=True)
class SetOwner(Edit):
    op: ClassVar[str] = "SET_OWNER"
    path: str
    owner: str | None
    group: str | None
    user: str = ""


@dataclass(frozen=True, slots=True)
class SetTimes(Edit):
    """``-1`` leaves a time unchanged (WebHDFS's default)."""

    op: ClassVar[str] = "SET_TIMES"
    path: str
    mtime_ms: int
    atime_ms: int
    user: str = ""


@dataclass(frozen=True, slots=True)
class SetReplication(Edit):
    op: ClassVar[str] = "SET_REPLICATION"
    path: str
    replication: int
    user: str = ""


EDITS: Final[dict[str, type[Edit]]] = {cls.op: cls for cls in (
    Mkdirs, Create, AddBlock, Complete, Append, Rename, Delete, SetPermission, SetOwner, SetTimes,
    SetReplication,
)}

_TYPES: Final[dict[str, type | tuple[type, ...]]] = {"int": int, "str": str, "bool": bool, "str | None": (str, type(None)), "Block": Block}


def encode(edit: Edit) -> bytes:
    body: dict[str, Any] = {"v": VERSION, "op": edit.op}
    for f in dataclasses.fields(edit):  # type: ignore[arg-type]
        value = getattr(edit, f.name)
        body[f.name] = value.to_json() if isinstance(value, Block) else value
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def decode(record: bytes) -> Edit:
    try:
        body = json.loads(record)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EditLogError(f"edit record is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise EditLogError("edit record is not a JSON object")
    version, op = body.pop("v", None), body.pop("op", None)
    if type(version) is not int or not 1 <= version <= VERSION:
        raise EditLogError(f"edit record version {version!r}: this namenode reads versions 1..{VERSION}")
    if version == 1:
        body.setdefault("user", "")
    cls = EDITS.get(op)  # type: ignore[arg-type]
    if cls is None:
        raise EditLogError(f"unknown edit opcode {op!r} (version {version}): replay stops here")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    if set(body) != set(fields):
        raise EditLogError(f"{op} record fields {sorted(body)}, expected {sorted(fields)}")
    args: dict[str, Any] = {}
    for name, f in fields.items():
        value = body[name]
        if f.type == "Block":
            value = Block.from_json(value)
        wanted = _TYPES[str(f.type)]
        if not isinstance(value, wanted) or (f.type == "int" and type(value) is bool):
            raise EditLogError(f"{op} record field {name}={value!r}: expected {f.type}")
        args[name] = value
    return cls(**args)
