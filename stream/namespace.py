"""Namespaces: ``open_namespace`` and the ``Namespace`` handle (streams, cursors, truncation).

    ns = await open_namespace(client, "prod/payments", create=True, segment_records_max=100_000)
    w = await ns.open_writer("orders", create=True)
    r = await ns.open_reader("orders", start="earliest")   # | "latest" | Position | publish time (ms)
    await ns.commit_cursor("orders", "replicator-eu", pos)
    await ns.truncate("orders", before=pos)
    await ns.apply_retention("orders")

Settings given to ``open_namespace`` are stored as the namespace's (created, or
updated if they differ); ``open_writer(..., create=True, **overrides)`` stores a
stream's own overrides when it creates it.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeAlias

from scriba.client import Client
from scriba.clock import Clock, SystemClock
from scriba.errors import (
    BadVersionError,
    KeyExistsError,
    NamespaceNotEmptyError,
    NamespaceNotFoundError,
    NoSuchKeyError,
    NoSuchLedgerError,
    PositionOutOfRangeError,
    PositionTruncatedError,
    StreamExistsError,
    StreamNotFoundError,
)
from scriba.log import get_logger
from scriba.meta.update import read_record, update_metadata
from scriba.stream import record_set
from scriba.stream.catalog import Catalog
from scriba.stream.ledgers import (
    Record,
    delete_ledgers,
    peek_segment,
    read_entry,
    recover_segment,
    write_staged_ledger,
)
from scriba.stream.position import Position
from scriba.stream.reader import ReaderOptions, StreamReader
from scriba.stream.retention import apply_retention, truncate_stream
from scriba.stream.segments import (
    NAMESPACE_CODEC,
    STREAMS_PREFIX,
    CursorRecord,
    NamespaceRecord,
    Segment,
    SegmentSummary,
    StreamRecord,
    StreamState,
    advance_cursor,
    check_active,
    cursor_key,
    namespace_from_token,
    namespace_key,
    open_segments,
    stream_key,
    streams_prefix,
)
from scriba.stream.settings import (
    StreamSettings,
    check_name,
    check_namespace_name,
    check_overrides,
    effective_settings,
)
from scriba.stream.writer import StreamWriter, WriterOptions, adopt_ledgers, open_stream_writer

log = get_logger(__name__)

Start: TypeAlias = Position | str | int | datetime.datetime


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """What ``stream-info`` shows: the record, the effective settings and the cursors."""

    namespace: str
    record: StreamRecord
    settings: StreamSettings
    cursors: Mapping[str, Position]


async def open_namespace(
    client: Client,
    name: str,
    *,
    create: bool = False,
    password: bytes = b"",
    clock: Clock | None = None,
    **settings: Any,
) -> Namespace:
    """Open (or with ``create=True`` create) a namespace; see the module docstring."""
    check_namespace_name(name)
    overrides = check_overrides(settings)
    StreamSettings().with_overrides(overrides)  # validate before writing anything
    catalog = Catalog(client.store, name, clock or SystemClock())
    key = namespace_key(name)
    try:
        current = await catalog.call(read_record(client.store, key, NAMESPACE_CODEC))
    except NoSuchKeyError:
        if not create:
            raise NamespaceNotFoundError(f"namespace {name} does not exist (create=True creates it)") from None
        record = NamespaceRecord(name, overrides, catalog.now_ms())
        try:
            await catalog.call(client.store.create(key, record.to_bytes()))
            log.info("stream_namespace_created", namespace=name)
        except KeyExistsError:
            pass  # created concurrently: apply the settings below
        current = await catalog.call(read_record(client.store, key, NAMESPACE_CODEC))
    if overrides and {**current.value.settings, **overrides} != dict(current.value.settings):
        current = await catalog.call(update_metadata(
            client.store, key, NAMESPACE_CODEC,
            lambda r: {**r.settings, **overrides} != dict(r.settings),
            lambda r: replace(r, settings={**r.settings, **overrides}),
        ))
        log.info("stream_namespace_settings_updated", namespace=name, settings=overrides)
    return Namespace(client, catalog, current.value, password)


async def list_namespaces(client: Client) -> list[str]:
    async def scan() -> list[str]:
        return [namespace_from_token(key[len(STREAMS_PREFIX):]) async for key, _ in client.store.scan(STREAMS_PREFIX)]

    return await Catalog(client.store, "", SystemClock()).call(scan())


class Namespace:
    def __init__(self, client: Client, catalog: Catalog, record: NamespaceRecord, password: bytes) -> None:
        self.client = client
        self.catalog = catalog
        self.name = record.name
        self.record = record
        self._password = password

    @property
    def settings(self) -> StreamSettings:
        return StreamSettings().with_overrides(self.record.settings)

    # --- streams --------------------------------------------------------------------
    async def create_stream(self, name: str, **overrides: Any) -> StreamRecord:
        check_name(name)
        checked = check_overrides(overrides)
        effective_settings(self.record.settings, checked)  # validate
        record = StreamRecord(name, checked, self.catalog.now_ms())
        try:
            await self.catalog.call(self.client.store.create(stream_key(self.name, name), record.to_bytes()))
        except KeyExistsError:
            raise StreamExistsError(f"stream {self.name}/{name} already exists") from None
        log.info("stream_created", stream=f"{self.name}/{name}")
        return record

    async def list_streams(self) -> list[str]:
        async def scan() -> list[str]:
            prefix = streams_prefix(self.name)
            return [key[len(prefix):] async for key, _ in self.client.store.scan(prefix)]

        return await self.catalog.call(scan())

    async def stream_settings(self, name: str) -> StreamSettings:
        record = (await self.catalog.read_stream(check_name(name))).value
        return await self._settings_of(record)

    async def _settings_of(self, record: StreamRecord) -> StreamSettings:
        self.record = await self.catalog.read_namespace()
        return effective_settings(self.record.settings, record.settings)

    async def info(self, name: str) -> StreamInfo:
        record = (await self.catalog.read_stream(check_name(name))).value
        return StreamInfo(self.name, record, await self._settings_of(record), await self.catalog.cursors(name))

    # --- writers and readers ------------------------------------------------------------
    async def open_writer(
        self, name: str, *, create: bool = False, options: WriterOptions | None = None, **overrides: Any
    ) -> StreamWriter:
        """Take the stream's writer lock, fence and recover, start a segment (see ``stream.writer``)."""
        check_name(name)
        try:
            record = (await self.catalog.read_stream(name)).value
        except StreamNotFoundError:
            if not create:
                raise
            try:
                record = await self.create_stream(name, **overrides)
            except StreamExistsError:
                record = (await self.catalog.read_stream(name)).value
        check_active(record)
        settings = await self._settings_of(record)
        return await open_stream_writer(self.client, self.catalog, name, settings, self._password,
                                        options or WriterOptions())

    async def stage(self, name: str, records: Sequence[tuple[bytes, Mapping[str, bytes]]], *,
                    staged_by: str = "staged") -> int:
        """``records`` written to a new closed ledger in segment format, not yet in the stream
        (an exactly-once batch write's task), tagged ``staged_by`` (a job id, for its
        clean-up); its id, for :meth:`adopt`."""
        record = (await self.catalog.read_stream(check_name(name))).value
        check_active(record)
        return await write_staged_ledger(self.client, await self._settings_of(record), self._password, records,
                                         namespace=self.name, stream=name, publish_time_ms=self.catalog.now_ms(),
                                         staged_by=staged_by)

    async def adopt(self, name: str, ledger_ids: Sequence[int], *, options: WriterOptions | None = None
                    ) -> StreamRecord:
        """Staged ledgers appended as CLOSED segments, in order, all in one CAS, under the
        writer lock (the current writer is fenced, as opening a writer does). Repeating it
        with the same ledgers changes nothing (a duplicate commit)."""
        record = (await self.catalog.read_stream(check_name(name))).value
        check_active(record)
        settings = await self._settings_of(record)
        return await adopt_ledgers(self.client, self.catalog, name, settings, self._password,
                                   options or WriterOptions(), ledger_ids)

    async def open_reader(
        self, name: str, start: Start = "earliest", *, options: ReaderOptions | None = None
    ) -> StreamReader:
        """Records from ``start``: ``"earliest"``, ``"latest"`` (new records only), a
        :class:`Position` (or its text), or a publish time (ms since the epoch, or a
        ``datetime``): the first record published at or after it."""
        check_name(name)
        record = (await self.catalog.read_stream(name)).value
        check_active(record)
        position = await self._resolve_start(record, start)
        return StreamReader(self.client, self.catalog, name, record, position, self._password,
                            options or ReaderOptions())

    async def read_range(
        self, name: str, start: Start = "earliest", *, until: Position | None = None, count: int | None = None,
        options: ReaderOptions | None = None,
    ) -> AsyncGenerator[Record, None]:
        """The records from ``start`` up to ``until`` (inclusive; default: the last record
        confirmed now), at most ``count`` of them; it ends there instead of tailing."""
        last = until if until is not None else await self.last_position(name)
        record = (await self.catalog.read_stream(check_name(name))).value
        check_active(record)
        position = await self._resolve_start(record, start)
        if last is None or position > last or (count is not None and count <= 0):
            return
        seen = 0
        async with StreamReader(self.client, self.catalog, name, record, position, self._password,
                                options or ReaderOptions()) as reader:
            async for found in reader:
                yield found
                seen += 1
                if found.position >= last or (count is not None and seen >= count):
                    return

    async def _resolve_start(self, record: StreamRecord, start: Start) -> Position:
        if isinstance(start, datetime.datetime):
            start = int(start.timestamp() * 1000)
        if start == "earliest":
            first = record.segments[0].start if record.segments else Position(record.next_seq, 0, 0)
            return max(first, record.truncated_before)
        if start == "latest":
            return await self._end(record)
        if isinstance(start, int) and not isinstance(start, bool):
            return await self._seek_time(record, start)
        position = Position.parse(start)  # type: ignore[arg-type]
        if position < record.truncated_before:
            raise PositionTruncatedError(
                f"stream {record.name}: position {position} is before the truncation point {record.truncated_before}"
            )
        end = await self._end(record)
        if position > end:
            raise PositionOutOfRangeError(f"stream {record.name}: position {position} is beyond the end {end}")
        return position

    async def end_position(self, name: str) -> Position:
        """The position right after the last confirmed record (where ``"latest"`` starts)."""
        record = (await self.catalog.read_stream(check_name(name))).value
        return await self._end(record)

    async def last_position(self, name: str) -> Position | None:
        """The position of the last confirmed record (None: the stream holds none)."""
        record = (await self.catalog.read_stream(check_name(name))).value
        for segment in reversed(record.segments):
            summary = (await peek_segment(self.client, segment, self._password)) if segment.is_open \
                else segment.summary
            if summary.record_count:
                return Position(segment.seq, summary.last_entry_id, summary.last_slot)
        return None

    async def segment_summary(self, segment: Segment) -> SegmentSummary:
        """A segment's summary: the recorded one, or an OPEN segment's so far (not fencing it)."""
        return await peek_segment(self.client, segment, self._password) if segment.is_open else segment.summary

    async def _end(self, record: StreamRecord) -> Position:
        """The position right after the last confirmed record."""
        last = record.last_segment
        if last is None:
            return Position(record.next_seq, 0, 0)
        if not last.is_open:
            return last.end
        reader = await self.client.open_ledger(last.ledger_id, self._password, recovery=False)
        lac = int(await reader.read_last_add_confirmed())
        return Position(last.seq, lac + 1, 0)

    async def _seek_time(self, record: StreamRecord, publish_ms: int) -> Position:
        """The first entry published at or after ``publish_ms`` (binary search in one segment)."""
        for segment in record.segments:
            if not segment.is_open and segment.summary.last_publish_ms < publish_ms:
                continue
            reader = await self.client.open_ledger(segment.ledger_id, self._password, recovery=False)
            last = int(segment.summary.last_entry_id if not segment.is_open
                       else await reader.read_last_add_confirmed())
            low, high = 0, last + 1  # first entry in [low, high) with publish >= publish_ms
            while low < high:
                mid = (low + high) // 2
                header = record_set.decode_header((await read_entry(reader, mid)).payload)
                if header.publish_time_ms >= publish_ms:
                    high = mid
                else:
                    low = mid + 1
            if low <= last or segment.is_open:
                return max(Position(segment.seq, low, 0), record.truncated_before)
        return await self._end(record)

    # --- cursors ----------------------------------------------------------------------
    async def commit_cursor(self, stream: str, cursor: str, position: Position | str, *, force: bool = False) -> Position:
        """Store ``cursor``'s position durably (monotonic unless ``force``)."""
        check_name(stream)
        check_name(cursor, "cursor")
        position = Position.parse(position)
        await self.catalog.read_stream(stream)  # the stream must exist
        key = cursor_key(self.name, stream, cursor)
        new = CursorRecord(cursor, position, self.catalog.now_ms())
        for _ in range(32):
            current = await self.catalog.cursor(stream, cursor)
            if not advance_cursor(current.value.position if current else None, position, force=force, name=cursor):
                return position
            try:
                if current is None:
                    await self.catalog.call(self.client.store.create(key, new.to_bytes()))
                else:
                    await self.catalog.call(self.client.store.set(key, new.to_bytes(),
                                                                  expected_version=current.version))
                return position
            except (KeyExistsError, BadVersionError):
                continue
        raise BadVersionError(f"cursor {cursor}: gave up after 32 conflicting commits")

    async def cursor(self, stream: str, cursor: str) -> Position | None:
        check_name(stream)
        check_name(cursor, "cursor")
        found = await self.catalog.cursor(stream, cursor)
        return found.value.position if found else None

    async def cursors(self, stream: str) -> dict[str, Position]:
        return await self.catalog.cursors(check_name(stream))

    async def delete_cursor(self, stream: str, cursor: str) -> None:
        try:
            await self.catalog.call(self.client.store.delete(cursor_key(self.name, check_name(stream),
                                                                        check_name(cursor, "cursor"))))
        except NoSuchKeyError:
            pass

    # --- truncation, retention, deletion ---------------------------------------------------
    async def truncate(self, stream: str, before: Position | str) -> tuple[int, ...]:
        """Delete the whole CLOSED segments before ``before`` and record the truncation point.

        Returns the ledgers deleted (with any a crashed earlier truncation left).
        """
        return await truncate_stream(self.client, self.catalog, check_name(stream), Position.parse(before))

    async def apply_retention(self, stream: str) -> Position | None:
        """Truncate as the retention settings say now; returns the new truncation point, if any."""
        return await apply_retention(self.client, self.catalog, check_name(stream))

    async def delete_stream(self, stream: str) -> None:
        """Mark it DELETING (readers and writers' CAS stop), fence a live writer by recovering
        its open segment, delete the segments' ledgers, the cursors, then the record."""
        check_name(stream)
        record = await self.catalog.update_stream(
            stream, lambda r: r.state is not StreamState.DELETING,
            lambda r: replace(r, state=StreamState.DELETING),
        )
        for segment in open_segments(record):  # fence a live writer: its next append fails
            with contextlib.suppress(NoSuchLedgerError):
                await recover_segment(self.client, segment, self._password)
        await delete_ledgers(self.client, (*record.deleting, *(s.ledger_id for s in record.segments)))
        for cursor in await self.catalog.cursors(stream):
            await self.delete_cursor(stream, cursor)
        try:
            await self.catalog.call(self.client.store.delete(stream_key(self.name, stream)))
        except NoSuchKeyError:
            raise StreamNotFoundError(f"stream {self.name}/{stream} does not exist") from None
        log.info("stream_deleted", stream=f"{self.name}/{stream}", ledgers=len(record.segments))

    async def delete(self, *, recursive: bool = False) -> None:
        """Delete the namespace; it must be empty unless ``recursive``."""
        streams = await self.list_streams()
        if streams and not recursive:
            raise NamespaceNotEmptyError(
                f"namespace {self.name} holds {len(streams)} streams ({', '.join(streams[:5])}...); "
                "delete them or pass recursive=True"
            )
        for stream in streams:
            await self.delete_stream(stream)
        try:
            await self.catalog.call(self.client.store.delete(namespace_key(self.name)))
        except NoSuchKeyError:
            raise NamespaceNotFoundError(f"namespace {self.name} does not exist") from None
        log.info("stream_namespace_deleted", namespace=self.name)


async def delete_namespace(client: Client, name: str, *, recursive: bool = False) -> None:
    ns = await open_namespace(client, name)
    await ns.delete(recursive=recursive)


