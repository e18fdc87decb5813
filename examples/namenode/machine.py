"""``NamenodeMachine``: the namespace as a Scriba :class:`~scriba.rsm.StateMachine`.

Commands are edit records (``edits.encode``); the answer of ``apply`` is JSON
``{"txid": n, "ok": result}`` or ``{"txid": n, "error": [exception, message]}`` — an
HDFS error is an answer, the same on every replica. An :class:`EditLogError` (unknown
opcode or version) is raised: the RSM stops the replica rather than skip a record.
Queries are JSON requests (``views.query``) answered the same way. Snapshots are the
fsimage.
"""

from __future__ import annotations

import json
from typing import Any

from scriba.examples.namenode import edits
from scriba.examples.namenode.errors import HdfsError, error_from
from scriba.examples.namenode.namespace import Namespace
from scriba.examples.namenode.views import query
from scriba.rsm import SnapshotReader, SnapshotWriter
from scriba.stream import Position


def _answer(txid: int, work: Any, *args: Any) -> bytes:
    try:
        body: dict[str, Any] = {"txid": txid, "ok": work(*args)}
    except HdfsError as exc:
        body = {"txid": txid, "error": [exc.exception, str(exc)]}
    return json.dumps(body, separators=(",", ":")).encode()


def parse_answer(answer: bytes) -> tuple[int, Any]:
    """``(txid, result)`` of an apply or query answer; raises the ``HdfsError`` it carries."""
    body = json.loads(answer)
    if "error" in body:
        raise error_from(*body["error"])
    return body["txid"], body["ok"]


class NamenodeMachine:
    def __init__(self) -> None:
        self.ns = Namespace()

    def apply(self, command: bytes, position: Position) -> bytes:
        edit = edits.decode(command)  # EditLogError stops the replica
        return _answer(self.ns.txid + 1, self.ns.apply, edit)

    def query(self, request: bytes) -> bytes:
        return _answer(self.ns.txid, query, self.ns, json.loads(request))

    def snapshot(self, out: SnapshotWriter) -> None:
        out.write(self.ns.fsimage())

    def restore(self, src: SnapshotReader) -> None:
        self.ns = Namespace.from_fsimage(src.read())
