"""Log streams: namespaces of unbounded, single-writer logs made of ledger segments.

    from scriba.stream import open_namespace, Position
    ns = await open_namespace(client, "prod/payments", create=True, segment_records_max=100_000)
    w = await ns.open_writer("orders", create=True)
    pos = await w.append(b"...", headers={"k": b"v"})
    r = await ns.open_reader("orders", start="earliest")
    async for rec in r: rec.position, rec.payload, rec.headers, rec.publish_time_ms

The rules live in I/O-free modules (``position``, ``record_set``, ``settings``,
``segments``, ``writer_core``); ``namespace``, ``writer``, ``reader`` and
``retention`` are the asyncio shells. ``scriba.stream.sync.SyncNamespace`` is the
blocking API (on a ``SyncClient``); ``scriba.stream.shell`` holds the
``scriba shell stream-*`` verbs.
"""

from scriba.stream.ledgers import Record
from scriba.stream.namespace import (
    Namespace,
    StreamInfo,
    delete_namespace,
    list_namespaces,
    open_namespace,
)
from scriba.stream.position import Position
from scriba.stream.reader import ReaderOptions, StreamReader
from scriba.stream.settings import StreamSettings
from scriba.stream.writer import StreamWriter, WriterOptions

__all__ = [
    "Namespace",
    "Position",
    "ReaderOptions",
    "Record",
    "StreamInfo",
    "StreamReader",
    "StreamSettings",
    "StreamWriter",
    "WriterOptions",
    "delete_namespace",
    "list_namespaces",
    "open_namespace",
]
