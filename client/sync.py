"""``SyncClient``: a blocking facade over ``Client`` for scripts and Spark executors.

It runs a private event loop in a daemon thread and forwards each call to it with
a deadline; the async objects stay on that loop. Not for use inside a running
event loop (use ``Client`` there).

    with SyncClient.connect("etcd://127.0.0.1:2379/scriba") as client:
        writer = client.create_ledger(3, 3, 2, password=b"pw")
        writer.append(b"x")
        writer.close()
        for entry in client.open_ledger(writer.ledger_id, password=b"pw").read():
            ...
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any, Final, TypeVar

from scriba.client.client import Client
from scriba.client.reader import LedgerReader
from scriba.client.writer import LedgerWriter
from scriba.entry import Entry
from scriba.errors import ConfigError, DeadlineExceededError
from scriba.ids import EntryId, LedgerId
from scriba.meta.records import LedgerMetadata

T = TypeVar("T")

CALL_TIMEOUT_S_DEFAULT: Final = 120.0
ITER_CHUNK_ENTRIES: Final = 1024


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="scriba-sync-client", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        if threading.current_thread() is self._thread:
            coro.close()
            raise ConfigError("SyncClient called from its own event loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        future = self.submit(coro)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise DeadlineExceededError(f"call did not finish within {timeout_s} s") from None

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


class SyncLedgerWriter:
    def __init__(self, runner: _LoopThread, writer: LedgerWriter, timeout_s: float) -> None:
        self._runner = runner
        self._writer = writer
        self._timeout_s = timeout_s

    @property
    def ledger_id(self) -> LedgerId:
        return self._writer.ledger_id

    @property
    def last_add_confirmed(self) -> EntryId:
        return self._writer.last_add_confirmed

    @property
    def metadata(self) -> LedgerMetadata:
        return self._writer.metadata

    def append(self, payload: bytes | bytearray | memoryview) -> EntryId:
        """Append one payload; returns its entry id once confirmed. A payload that is not
        bytes-like (``TypeError``) or too large (``EntryTooLargeError``) changes nothing."""
        payload = self._writer.check_payload(payload)  # copied here, in the caller's thread
        return self._runner.call(self._writer.append(payload), self._timeout_s)

    def append_many(self, payloads: Iterable[bytes | bytearray | memoryview]) -> list[EntryId]:
        """Append all, pipelined; returns their entry ids once all are confirmed.

        Every payload is checked first: one that is not bytes-like or too large raises
        before any is appended."""
        checked = [self._writer.check_payload(p) for p in payloads]
        writer = self._writer

        async def run() -> list[EntryId]:
            futures: list[asyncio.Future[int]] = []
            try:
                for payload in checked:
                    futures.append(writer.append_async(payload))
            except BaseException:
                # Refused part-way (closed, failed, too many waiting): the appends already
                # accepted go on; wait for them so that none is left unobserved.
                await asyncio.gather(*futures, return_exceptions=True)
                raise
            return [EntryId(e) for e in await asyncio.gather(*futures)]

        return self._runner.call(run(), self._timeout_s)

    def close(self) -> None:
        self._runner.call(self._writer.close(), self._timeout_s)


class SyncLedgerReader:
    def __init__(self, runner: _LoopThread, reader: LedgerReader, timeout_s: float) -> None:
        self._runner = runner
        self._reader = reader
        self._timeout_s = timeout_s

    @property
    def ledger_id(self) -> LedgerId:
        return self._reader.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._reader.metadata

    @property
    def last_add_confirmed(self) -> EntryId:
        return self._reader.last_add_confirmed

    def read_last_add_confirmed(self) -> EntryId:
        return self._runner.call(self._reader.read_last_add_confirmed(), self._timeout_s)

    def read(self, first: int = 0, last: int | None = None) -> Iterator[Entry]:
        """Entries ``first..last`` (default: to the LAC), fetched in chunks."""
        if last is None:
            last = int(self.read_last_add_confirmed())
        next_id = first
        while next_id <= last:
            chunk_last = min(last, next_id + ITER_CHUNK_ENTRIES - 1)
            chunk = self._runner.call(self._collect(next_id, chunk_last), self._timeout_s)
            yield from chunk
            next_id = chunk_last + 1

    async def _collect(self, first: int, last: int) -> list[Entry]:
        return [e async for e in self._reader.read(first, last)]

    def tail(self, start: int = 0) -> Iterator[Entry]:
        """Follow the ledger until it is closed (blocking between entries)."""
        agen = self._reader.tail(start)
        try:
            while True:
                try:
                    entry = self._runner.call(agen.__anext__(), self._timeout_s)
                except StopAsyncIteration:
                    return
                yield entry
        finally:
            self._runner.call(agen.aclose(), self._timeout_s)


class SyncClient:
    """Blocking twin of ``Client``: same methods, results instead of awaitables."""

    def __init__(self, runner: _LoopThread, client: Client, timeout_s: float) -> None:
        self._runner = runner
        self._client = client
        self._timeout_s = timeout_s

    @classmethod
    def connect(
        cls, uri: str, *, call_timeout_s: float = CALL_TIMEOUT_S_DEFAULT, **kwargs: Any
    ) -> SyncClient:
        """Same keywords as ``Client.connect``; every call waits at most ``call_timeout_s``."""
        runner = _LoopThread()
        try:
            client = runner.call(cls._open(uri, kwargs), call_timeout_s)
        except BaseException:
            runner.stop()
            raise
        return cls(runner, client, call_timeout_s)

    @staticmethod
    async def _open(uri: str, kwargs: Mapping[str, Any]) -> Client:
        return await Client.connect(uri, **kwargs)

    @property
    def client(self) -> Client:
        """The async client (use only on ``loop``)."""
        return self._client

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._runner.loop

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` (built on :attr:`client`) on the client's loop and wait for its result.

        Waits at most ``timeout_s`` (default: the client's ``call_timeout_s``), then cancels it
        and raises ``DeadlineExceededError``. Calling from the loop's own thread is a ``ConfigError``.
        """
        return self._runner.call(coro, self._timeout_s if timeout_s is None else timeout_s)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Start ``coro`` on the client's loop; the caller waits on the returned future."""
        return self._runner.submit(coro)

    def create_ledger(self, *args: Any, **kwargs: Any) -> SyncLedgerWriter:
        writer = self._runner.call(self._client.create_ledger(*args, **kwargs), self._timeout_s)
        return SyncLedgerWriter(self._runner, writer, self._timeout_s)

    def open_ledger(
        self, ledger_id: int, password: bytes = b"", *, recovery: bool = True
    ) -> SyncLedgerReader:
        reader = self._runner.call(
            self._client.open_ledger(ledger_id, password, recovery=recovery), self._timeout_s
        )
        return SyncLedgerReader(self._runner, reader, self._timeout_s)

    def delete_ledger(self, ledger_id: int) -> None:
        self._runner.call(self._client.delete_ledger(ledger_id), self._timeout_s)

    def list_ledgers(self) -> list[LedgerId]:
        return self._runner.call(self._client.list_ledgers(), self._timeout_s)

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return self._runner.call(self._client.ledger_metadata(ledger_id), self._timeout_s)

    def close(self) -> None:
        try:
            self._runner.call(self._client.close(), self._timeout_s)
        finally:
            self._runner.stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
