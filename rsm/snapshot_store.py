"""Snapshots in ledgers, referenced from the catalog record (the I/O around ``snapshots_core``).

Storing (:func:`store_snapshot`): the chunks (already a point-in-time copy) are
appended to a new ledger (the namespace's quorums), which is closed; then the
catalog record gains a :class:`SnapshotInfo` (CAS loop), dropped snapshots' ledgers
are deleted, and the stream is truncated before the oldest kept snapshot, or before the
stream's lowest named cursor if that is lower (a geo replicator's cursor holds what it
has not copied yet).

Loading (:func:`load_newest`): the catalog's snapshots newest first; each ledger is
read whole and its SHA-256 compared with the recorded digest. A mismatch, a missing
ledger or an unreadable entry is logged and the previous snapshot is tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable

from scriba.client import Client
from scriba.errors import (
    KeyExistsError,
    NoSuchKeyError,
    NoSuchLedgerError,
    ScribaError,
    SnapshotCorruptError,
)
from scriba.log import get_logger
from scriba.meta.update import read_record, update_metadata
from scriba.rsm.snapshots_core import (
    CATALOG_CODEC,
    SnapshotCatalog,
    SnapshotInfo,
    add_snapshot,
    finish_deletes,
    truncation_point,
)
from scriba.stream import Namespace, Position

log = get_logger(__name__)


def digest_of(chunks: list[bytes]) -> str:
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(len(chunk).to_bytes(8, "big"))
        h.update(chunk)
    return h.hexdigest()


async def read_catalog(client: Client, key: str) -> SnapshotCatalog:
    try:
        return (await read_record(client.store, key, CATALOG_CODEC)).value
    except NoSuchKeyError:
        return SnapshotCatalog()


async def store_snapshot(
    ns: Namespace, stream: str, key: str, chunks: list[bytes], position: Position, records_applied: int,
    token: int, kept: int, password: bytes = b"",
) -> SnapshotInfo:
    client = ns.client
    settings = await ns.stream_settings(stream)
    ledger = await client.create_ledger(
        settings.ensemble_size, settings.write_quorum_size, settings.ack_quorum_size, password=password,
        digest=settings.digest, custom_metadata={"rsm": f"{ns.name}/{stream}", "position": str(position)},
    )
    try:
        await asyncio.gather(*[ledger.append_async(chunk) for chunk in chunks])
        await ledger.close()
    except BaseException:
        with contextlib.suppress(ScribaError):
            await ledger.abort()
            await client.delete_ledger(ledger.ledger_id)
        raise
    info = SnapshotInfo(int(ledger.ledger_id), position, records_applied, sum(len(c) for c in chunks),
                        len(chunks), digest_of(chunks), int(time.time() * 1000), token)
    catalog = await _update_catalog(client, key, lambda c: add_snapshot(c, info, kept))
    await _delete_dropped(client, key, catalog)
    point = truncation_point(catalog, kept)
    if point is not None:
        cursors = await ns.cursors(stream)
        point = min(point, *cursors.values()) if cursors else point
        await ns.truncate(stream, before=point)
    log.info("rsm_snapshot_stored", stream=f"{ns.name}/{stream}", position=str(position),
             ledger_id=info.ledger_id, size_bytes=info.size_bytes, truncated_before=str(point))
    return info


async def _update_catalog(
    client: Client, key: str, change: Callable[[SnapshotCatalog], SnapshotCatalog]
) -> SnapshotCatalog:
    for _ in range(32):
        try:
            record = await update_metadata(client.store, key, CATALOG_CODEC, lambda c: change(c) != c, change)
            return record.value
        except NoSuchKeyError:
            with contextlib.suppress(KeyExistsError):
                await client.store.create(key, SnapshotCatalog().to_bytes())
    raise SnapshotCorruptError(f"{key}: the snapshot catalog could not be created")


async def _delete_dropped(client: Client, key: str, catalog: SnapshotCatalog) -> None:
    if not catalog.deleting:
        return
    done: set[int] = set()
    for ledger_id in catalog.deleting:
        with contextlib.suppress(NoSuchLedgerError):
            await client.delete_ledger(ledger_id)
        done.add(ledger_id)
    await _update_catalog(client, key, lambda c: finish_deletes(c, done))


async def read_snapshot(client: Client, info: SnapshotInfo, password: bytes = b"") -> list[bytes]:
    """The snapshot's chunks, checked against its digest (``SnapshotCorruptError`` if not)."""
    try:
        reader = await client.open_ledger(info.ledger_id, password, recovery=False)
        last = int(reader.metadata.last_entry_id)
        chunks = [bytes(e.payload) async for e in reader.read(0, last)] if last >= 0 else []
    except (NoSuchLedgerError, NoSuchKeyError) as exc:
        raise SnapshotCorruptError(f"snapshot at {info.position}: ledger {info.ledger_id} is gone ({exc})") from None
    except ScribaError as exc:
        raise SnapshotCorruptError(
            f"snapshot at {info.position}: ledger {info.ledger_id} unreadable: {type(exc).__name__}: {exc}"
        ) from None
    if len(chunks) != info.chunks or digest_of(chunks) != info.digest:
        raise SnapshotCorruptError(
            f"snapshot at {info.position} (ledger {info.ledger_id}): {len(chunks)} chunks with digest "
            f"{digest_of(chunks)[:16]}..., recorded {info.chunks} chunks with {info.digest[:16]}..."
        )
    return chunks


async def load_newest(
    client: Client, key: str, newer_than: Position | None = None, password: bytes = b""
) -> tuple[SnapshotInfo, list[bytes]] | None:
    """The newest snapshot whose digest checks (newer than ``newer_than``), or None."""
    catalog = await read_catalog(client, key)
    for info in reversed(catalog.snapshots):
        if newer_than is not None and info.position <= newer_than:
            return None
        try:
            return info, await read_snapshot(client, info, password)
        except SnapshotCorruptError as exc:
            log.warning("rsm_snapshot_corrupt", position=str(info.position), ledger_id=info.ledger_id,
                        error=str(exc))
    return None
