"""Truncation and retention: whole CLOSED segments before a position go, with their ledgers.

:func:`truncate_stream` records the truncation point and lists the dropped segments'
ledgers in ``deleting`` (one CAS, ``segments.truncate``), then deletes the ledgers and
clears them from ``deleting``; a crash in between leaves work that the next
truncation, retention pass or writer finishes. :func:`apply_retention` picks the point
from the stream's settings now (age, size, and cursors with ``retain_unconsumed``:
``segments.retention_point``). A writer with ``retention_interval_s`` runs it in its
own process (:class:`~scriba.stream.writer.StreamWriter`); ``scriba shell
stream-retention`` runs it from outside.
"""

from __future__ import annotations

from scriba.client import Client
from scriba.log import get_logger
from scriba.stream.catalog import Catalog
from scriba.stream.ledgers import delete_ledgers
from scriba.stream.position import Position
from scriba.stream.segments import StreamRecord, finish_deletes, retention_point, truncate

log = get_logger(__name__)


async def truncate_stream(client: Client, catalog: Catalog, stream: str, before: Position) -> tuple[int, ...]:
    """Drop the CLOSED segments before ``before``; the ledgers deleted (with any a crashed
    earlier truncation left)."""
    record = await catalog.update_stream(
        stream, lambda r: truncate(r, before)[0] != r, lambda r: truncate(r, before)[0]
    )
    return await finish_truncation(client, catalog, stream, record)


async def finish_truncation(client: Client, catalog: Catalog, stream: str, record: StreamRecord) -> tuple[int, ...]:
    """Delete the ledgers ``record`` lists in ``deleting`` and clear them from it."""
    if not record.deleting:
        return ()
    done = await delete_ledgers(client, record.deleting)
    await catalog.update_stream(stream, lambda r: bool(set(r.deleting) & set(done)),
                                lambda r: finish_deletes(r, done))
    log.info("stream_truncated", stream=f"{catalog.namespace}/{stream}",
             truncated_before=str(record.truncated_before), ledgers=len(done))
    return tuple(done)


async def apply_retention(client: Client, catalog: Catalog, stream: str) -> Position | None:
    """Truncate as the retention settings say now; the new truncation point, if any."""
    record = (await catalog.read_stream(stream)).value
    settings = await catalog.settings_of(record)
    cursors = list((await catalog.cursors(stream)).values()) if settings.retain_unconsumed else []
    point = retention_point(record, settings, catalog.now_ms(), cursors)
    if point is None:
        await finish_truncation(client, catalog, stream, record)
        return None
    await truncate_stream(client, catalog, stream, point)
    return point
