"""Reading and changing a namespace's records in the metadata store (the stream layer's I/O).

Every change goes through ``update_metadata`` (a compare-and-set loop) with a
transform from :mod:`scriba.stream.segments`; absent records become the stream
layer's typed errors, and every call has a deadline.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from scriba.clock import Clock
from scriba.errors import (
    DeadlineExceededError,
    NamespaceNotFoundError,
    NoSuchKeyError,
    StreamNotFoundError,
)
from scriba.meta.store import MetadataStore, Versioned
from scriba.meta.update import read_record, update_metadata
from scriba.stream.position import Position
from scriba.stream.segments import (
    CURSOR_CODEC,
    NAMESPACE_CODEC,
    STREAM_CODEC,
    CursorRecord,
    NamespaceRecord,
    StreamRecord,
    cursor_key,
    cursors_prefix,
    namespace_key,
    stream_key,
)
from scriba.stream.settings import StreamSettings, effective_settings

T = TypeVar("T")

METADATA_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Catalog:
    """One namespace's records on one store."""

    store: MetadataStore
    namespace: str
    clock: Clock
    timeout_s: float = METADATA_TIMEOUT_S

    def now_ms(self) -> int:
        return int(self.clock.wall() * 1000)

    async def call(self, call: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await call
        except builtins.TimeoutError:
            raise DeadlineExceededError(f"metadata store {self.store.uri}: no answer in {self.timeout_s} s") from None

    async def read_stream(self, name: str) -> Versioned[StreamRecord]:
        try:
            return await self.call(read_record(self.store, stream_key(self.namespace, name), STREAM_CODEC))
        except NoSuchKeyError:
            raise StreamNotFoundError(f"stream {self.namespace}/{name} does not exist") from None

    async def read_namespace(self) -> NamespaceRecord:
        try:
            found = await self.call(read_record(self.store, namespace_key(self.namespace), NAMESPACE_CODEC))
        except NoSuchKeyError:
            raise NamespaceNotFoundError(f"namespace {self.namespace} does not exist") from None
        value: NamespaceRecord = found.value
        return value

    async def settings_of(self, record: StreamRecord) -> StreamSettings:
        """A stream's effective settings now: the namespace's, then the stream's overrides."""
        return effective_settings((await self.read_namespace()).settings, record.settings)

    async def update_stream(
        self,
        name: str,
        needs_update: Callable[[StreamRecord], bool],
        transform: Callable[[StreamRecord], StreamRecord],
    ) -> StreamRecord:
        try:
            record = await self.call(update_metadata(
                self.store, stream_key(self.namespace, name), STREAM_CODEC, needs_update, transform
            ))
        except NoSuchKeyError:
            raise StreamNotFoundError(f"stream {self.namespace}/{name} does not exist") from None
        value: StreamRecord = record.value
        return value

    async def cursors(self, name: str) -> dict[str, Position]:
        async def scan() -> dict[str, Position]:
            found = {}
            async for _, raw in self.store.scan(cursors_prefix(self.namespace, name)):
                cursor = CursorRecord.from_bytes(raw.value)
                found[cursor.name] = cursor.position
            return found

        return await self.call(scan())

    async def cursor(self, name: str, cursor: str) -> Versioned[CursorRecord] | None:
        try:
            return await self.call(read_record(self.store, cursor_key(self.namespace, name, cursor), CURSOR_CODEC))
        except NoSuchKeyError:
            return None
