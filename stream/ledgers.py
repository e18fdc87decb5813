"""The ledgers behind segments: create one, recover one, read a segment's entries as records.

Uses only the public client API (``Client.create_ledger``, ``open_ledger``,
``delete_ledger``, ``LedgerReader.read``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from scriba.client import Client, LedgerReader, LedgerWriter
from scriba.entry import Entry
from scriba.errors import NoSuchLedgerError, ScribaError
from scriba.log import get_logger
from scriba.stream import record_set
from scriba.stream.position import Position
from scriba.stream.segments import Segment, SegmentSummary
from scriba.stream.settings import StreamSettings

log = get_logger(__name__)


class Record(NamedTuple):
    """One record as a reader sees it (a named tuple: a catching-up reader makes many)."""

    position: Position
    payload: bytes
    headers: Mapping[str, bytes]
    publish_time_ms: int


async def create_segment_ledger(
    client: Client, settings: StreamSettings, password: bytes, *, namespace: str, stream: str, staged_by: str = ""
) -> LedgerWriter:
    return await client.create_ledger(
        settings.ensemble_size, settings.write_quorum_size, settings.ack_quorum_size,
        password=password, digest=settings.digest,
        custom_metadata={"stream": f"{namespace}/{stream}", **({"staged": staged_by} if staged_by else {})},
        placement=settings.placement,
        placement_options=settings.placement_options or None,
    )


async def write_staged_ledger(
    client: Client, settings: StreamSettings, password: bytes, records: Sequence[tuple[bytes, Mapping[str, bytes]]],
    *, namespace: str, stream: str, publish_time_ms: int, staged_by: str, records_per_set: int = 1000,
) -> int:
    """A closed ledger holding ``records`` in segment format (record sets counted from 0),
    outside the stream until ``adopt`` makes it a segment; its id. Nothing is left
    behind on an error but a ledger no stream names, tagged ``staged=<staged_by>`` in its
    custom metadata so that whoever staged it can find and delete it."""
    ledger = await create_segment_ledger(client, settings, password, namespace=namespace, stream=stream,
                                         staged_by=staged_by)
    before = size = 0
    sets = []
    for i in range(0, len(records), records_per_set):
        batch = [(bytes(p), record_set.check_headers(h)) for p, h in records[i:i + records_per_set]]
        data = record_set.encode(batch, records_before=before, bytes_before=size, publish_time_ms=publish_time_ms)
        sets.append(data)
        before, size = before + len(batch), size + len(data)
    try:
        await asyncio.gather(*[ledger.append_async(data) for data in sets])
        await ledger.close()
    except BaseException:
        with contextlib.suppress(ScribaError):
            await ledger.abort()
        raise
    return int(ledger.ledger_id)


def summary_of_last_entry(entry: Entry) -> SegmentSummary:
    """A segment's summary from its last entry's record-set header."""
    header = record_set.decode_header(entry.payload)
    return SegmentSummary(
        last_entry_id=int(entry.entry_id), last_slot=header.count - 1,
        record_count=header.records_before + header.count,
        size_bytes=header.bytes_before + len(entry.payload),
        last_publish_ms=header.publish_time_ms,
    )


async def recover_segment(client: Client, segment: Segment, password: bytes) -> SegmentSummary:
    """Open the segment's ledger with recovery (fences its writer, closes it) and summarise it."""
    reader = await client.open_ledger(segment.ledger_id, password, recovery=True)
    last = int(reader.metadata.last_entry_id)
    if last < 0:
        return SegmentSummary()
    async for entry in reader.read(last, last):
        return summary_of_last_entry(entry)
    raise NoSuchLedgerError(f"ledger {segment.ledger_id}: last entry {last} not readable")


async def peek_segment(client: Client, segment: Segment, password: bytes) -> SegmentSummary:
    """An OPEN segment's summary so far (to its last add confirmed), without fencing its writer."""
    reader = await client.open_ledger(segment.ledger_id, password, recovery=False)
    try:
        lac = int(await reader.read_last_add_confirmed())
        if lac < 0:
            return SegmentSummary()
        return summary_of_last_entry(await read_entry(reader, lac))
    finally:
        await reader.close()


def records_of(segment_seq: int, entry: Entry, first_slot: int = 0) -> list[Record]:
    """The records of one entry (a record set), from ``first_slot`` on."""
    header, items = record_set.decode(entry.payload)
    entry_id = int(entry.entry_id)
    publish = header.publish_time_ms
    new = tuple.__new__  # Record and Position without their constructors' checks: the parts are ours
    return [
        new(Record, (new(Position, (segment_seq, entry_id, slot)), payload, headers, publish))
        for slot, (payload, headers) in enumerate(items)
        if slot >= first_slot
    ]


async def read_entry(reader: LedgerReader, entry_id: int) -> Entry:
    async for entry in reader.read(entry_id, entry_id):
        return entry
    raise NoSuchLedgerError(f"ledger {reader.ledger_id}: entry {entry_id} not readable")


async def delete_ledgers(client: Client, ledger_ids: tuple[int, ...]) -> list[int]:
    """Delete each ledger (already gone counts as deleted); returns the ids done."""
    done = []
    for ledger_id in ledger_ids:
        try:
            await client.delete_ledger(ledger_id)
        except NoSuchLedgerError:
            pass
        done.append(ledger_id)
        log.info("segment_ledger_deleted", ledger_id=ledger_id)
    return done
