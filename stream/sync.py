"""``SyncNamespace``: the stream API, blocking, for scripts and Spark executors.

Built on :class:`~scriba.client.SyncClient`: every call runs on that client's event
loop (its private thread) with a deadline, and the async objects (namespace, writers,
readers) stay on that loop. The client layer does not know streams (the dependency
arrow points from stream to client), so the facade lives here::

    from scriba.client import SyncClient
    from scriba.stream.sync import SyncNamespace

    with SyncClient.connect("etcd://127.0.0.1:2379/scriba") as client:
        ns = SyncNamespace.open(client, "prod/payments", create=True)
        with ns.open_writer("orders", create=True) as writer:
            pos = writer.append(b"...", headers={"k": b"v"})
            positions = writer.append_many([b"a", b"b"])
            future = writer.append_async(b"c")   # a concurrent.futures.Future[Position]
        for record in ns.read_range("orders"):   # up to the last record confirmed now
            ...
        with ns.open_reader("orders", start=pos) as reader:   # tails: blocks for new records
            batch = reader.read_batch(1000, timeout_s=1.0)

Not for use inside the client's own event loop (use :class:`~scriba.stream.Namespace` there).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Mapping
from typing import Any, Final, TypeVar

from scriba.client import SyncClient
from scriba.client.sync import CALL_TIMEOUT_S_DEFAULT
from scriba.stream.ledgers import Record
from scriba.stream.namespace import (
    Namespace,
    Start,
    StreamInfo,
    delete_namespace,
    list_namespaces,
    open_namespace,
)
from scriba.stream.position import Position
from scriba.stream.reader import ReaderOptions, StreamReader
from scriba.stream.segments import StreamRecord
from scriba.stream.settings import StreamSettings
from scriba.stream.writer import StreamWriter, WriterOptions

T = TypeVar("T")

READ_CHUNK_RECORDS: Final = 1024  # records fetched per call while iterating
TAIL_WAIT_S: Final = 1.0  # an iterating tail asks for new records this often


class _Loop:
    """Runs coroutines on a SyncClient's loop from the caller's thread, each with a deadline."""

    def __init__(self, client: SyncClient, timeout_s: float) -> None:
        self._client = client
        self.timeout_s = timeout_s

    def __call__(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._client.call(coro, self.timeout_s)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return self._client.submit(coro)


class SyncStreamWriter:
    """Blocking twin of :class:`~scriba.stream.StreamWriter`."""

    def __init__(self, run: _Loop, writer: StreamWriter) -> None:
        self._run = run
        self._writer = writer

    @property
    def name(self) -> str:
        return self._writer.name

    @property
    def token(self) -> int:
        return self._writer.token

    @property
    def segment_seq(self) -> int:
        return self._writer.segment_seq

    @property
    def error(self) -> Exception | None:
        return self._writer.error

    def append(self, payload: bytes, headers: Mapping[str, bytes] | None = None) -> Position:
        return self._run(self._writer.append(payload, headers))

    def append_many(self, records: Iterable[bytes | tuple[bytes, Mapping[str, bytes] | None]]) -> list[Position]:
        """Append in order (packed together); every record is checked before any is queued."""
        return self._run(self._writer.append_many(list(records)))

    def append_async(self, payload: bytes, headers: Mapping[str, bytes] | None = None) -> concurrent.futures.Future[Position]:
        """Queue one record without waiting; the future resolves to its position. Records
        queued from one thread keep their order."""
        return self._run.submit(self._writer.append(payload, headers))

    def close(self) -> None:
        self._run(self._writer.close())

    def abort(self) -> None:
        self._run(self._writer.abort())

    def __enter__(self) -> SyncStreamWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if exc_info[0] is None:
            self.close()
        else:
            self.abort()


class SyncStreamReader:
    """Blocking twin of :class:`~scriba.stream.StreamReader`; iterating tails the stream
    (it waits for new records until closed)."""

    def __init__(self, run: _Loop, reader: StreamReader) -> None:
        self._run = run
        self._reader = reader

    @property
    def position(self) -> Position:
        return self._reader.position

    def read_next(self, timeout_s: float | None = None) -> Record | None:
        """The next record, or None if none arrives within ``timeout_s`` (at most the call deadline)."""
        return self._run(self._reader.read_next(self._wait(timeout_s)))

    def read_batch(self, records_max: int = READ_CHUNK_RECORDS, timeout_s: float | None = None) -> list[Record]:
        """Up to ``records_max`` records: waits for the first (at most ``timeout_s``), then
        takes what is already read ahead."""
        return self._run(self._reader.read_batch(records_max, self._wait(timeout_s)))

    def _wait(self, timeout_s: float | None) -> float:
        bound = self._run.timeout_s * 0.9  # answer before the call's own deadline
        return bound if timeout_s is None else min(timeout_s, bound)

    def __iter__(self) -> Iterator[Record]:
        while True:
            yield from self.read_batch(READ_CHUNK_RECORDS, TAIL_WAIT_S)

    def close(self) -> None:
        self._run(self._reader.close())

    def __enter__(self) -> SyncStreamReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SyncNamespace:
    """Blocking twin of :class:`~scriba.stream.Namespace` (see the module docstring)."""

    def __init__(self, run: _Loop, namespace: Namespace) -> None:
        self._run = run
        self._ns = namespace

    @classmethod
    def open(
        cls, client: SyncClient, name: str, *, create: bool = False, password: bytes = b"",
        call_timeout_s: float = CALL_TIMEOUT_S_DEFAULT, **settings: Any,
    ) -> SyncNamespace:
        """``open_namespace`` on ``client``'s loop; every later call waits at most ``call_timeout_s``."""
        run = _Loop(client, call_timeout_s)
        return cls(run, run(open_namespace(client.client, name, create=create, password=password, **settings)))

    @property
    def name(self) -> str:
        return self._ns.name

    @property
    def namespace(self) -> Namespace:
        """The async namespace (use only on the client's loop)."""
        return self._ns

    # --- streams --------------------------------------------------------------------
    def create_stream(self, name: str, **overrides: Any) -> StreamRecord:
        return self._run(self._ns.create_stream(name, **overrides))

    def list_streams(self) -> list[str]:
        return self._run(self._ns.list_streams())

    def stream_settings(self, name: str) -> StreamSettings:
        return self._run(self._ns.stream_settings(name))

    def info(self, name: str) -> StreamInfo:
        return self._run(self._ns.info(name))

    def end_position(self, name: str) -> Position:
        return self._run(self._ns.end_position(name))

    def last_position(self, name: str) -> Position | None:
        return self._run(self._ns.last_position(name))

    # --- writers and readers --------------------------------------------------------------
    def open_writer(
        self, name: str, *, create: bool = False, options: WriterOptions | None = None, **overrides: Any
    ) -> SyncStreamWriter:
        return SyncStreamWriter(self._run, self._run(self._ns.open_writer(name, create=create, options=options,
                                                                          **overrides)))

    def open_reader(self, name: str, start: Start = "earliest", *, options: ReaderOptions | None = None) -> SyncStreamReader:
        return SyncStreamReader(self._run, self._run(self._ns.open_reader(name, start, options=options)))

    def read_range(
        self, name: str, start: Start = "earliest", *, until: Position | None = None, count: int | None = None,
    ) -> Iterator[Record]:
        """The records from ``start`` up to ``until`` (default: the last confirmed now), fetched in chunks."""
        records = self._ns.read_range(name, start, until=until, count=count)
        try:
            while True:
                chunk = self._run(_take(records, READ_CHUNK_RECORDS))
                yield from chunk
                if len(chunk) < READ_CHUNK_RECORDS:
                    return
        finally:
            self._run(records.aclose())

    # --- cursors, truncation, retention, deletion --------------------------------------------
    def commit_cursor(self, stream: str, cursor: str, position: Position | str, *, force: bool = False) -> Position:
        return self._run(self._ns.commit_cursor(stream, cursor, position, force=force))

    def cursor(self, stream: str, cursor: str) -> Position | None:
        return self._run(self._ns.cursor(stream, cursor))

    def cursors(self, stream: str) -> dict[str, Position]:
        return self._run(self._ns.cursors(stream))

    def delete_cursor(self, stream: str, cursor: str) -> None:
        self._run(self._ns.delete_cursor(stream, cursor))

    def truncate(self, stream: str, before: Position | str) -> tuple[int, ...]:
        return self._run(self._ns.truncate(stream, before))

    def apply_retention(self, stream: str) -> Position | None:
        return self._run(self._ns.apply_retention(stream))

    def delete_stream(self, stream: str) -> None:
        self._run(self._ns.delete_stream(stream))

    def delete(self, *, recursive: bool = False) -> None:
        self._run(self._ns.delete(recursive=recursive))


async def _take(records: AsyncIterator[Record], n: int) -> list[Record]:
    """Up to ``n`` more records (fewer only at the end)."""
    out: list[Record] = []
    with contextlib.suppress(StopAsyncIteration):
        while len(out) < n:
            out.append(await anext(records))
    return out


def sync_list_namespaces(client: SyncClient, *, call_timeout_s: float = CALL_TIMEOUT_S_DEFAULT) -> list[str]:
    return _Loop(client, call_timeout_s)(list_namespaces(client.client))


def sync_delete_namespace(
    client: SyncClient, name: str, *, recursive: bool = False, call_timeout_s: float = CALL_TIMEOUT_S_DEFAULT
) -> None:
    _Loop(client, call_timeout_s)(delete_namespace(client.client, name, recursive=recursive))
