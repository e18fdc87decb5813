"""What a user implements (:class:`StateMachine`) and the snapshot streams it is given.

    class Counter(StateMachine):
        def apply(self, command: bytes, position: Position) -> bytes: ...   # deterministic
        def query(self, request: bytes) -> bytes: ...                       # read-only
        def snapshot(self, out: SnapshotWriter) -> None: ...                # write the state, chunked
        def restore(self, src: SnapshotReader) -> None: ...                 # replace the state

``apply`` must be deterministic: the same commands in the same order give the same
state and results on every replica (no clocks, randomness or I/O of its own). It
runs on the replica's event loop; an exception from it stops that replica
(:class:`~scriba.errors.StateMachineError`). ``snapshot`` is called between two
applies, so what it writes is a point-in-time copy; Scriba stores the chunks while
apply continues.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from scriba.stream import Position


@runtime_checkable
class StateMachine(Protocol):
    def apply(self, command: bytes, position: Position) -> bytes: ...

    def query(self, request: bytes) -> bytes: ...

    def snapshot(self, out: SnapshotWriter) -> None: ...

    def restore(self, src: SnapshotReader) -> None: ...


class SnapshotWriter:
    """Collects a snapshot's bytes as chunks of at most ``chunk_bytes`` (in memory)."""

    def __init__(self, chunk_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes
        self._chunks: list[bytes] = []
        self._current = bytearray()
        self.size_bytes = 0

    def write(self, data: bytes) -> None:
        view = memoryview(bytes(data))
        self.size_bytes += len(view)
        while view:
            room = self.chunk_bytes - len(self._current)
            self._current += view[:room]
            view = view[room:]
            if len(self._current) >= self.chunk_bytes:
                self._chunks.append(bytes(self._current))
                self._current = bytearray()

    def chunks(self) -> list[bytes]:
        """The chunks written (the last one may be short); closes the writer."""
        if self._current:
            self._chunks.append(bytes(self._current))
            self._current = bytearray()
        return self._chunks


class SnapshotReader:
    """A snapshot's bytes: ``read(n)`` (``-1``: all that is left), or iterate the chunks."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks
        self._data: bytes | None = None
        self._offset = 0

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._chunks)

    def read(self, n: int = -1) -> bytes:
        if self._data is None:
            self._data = b"".join(self._chunks)
        end = len(self._data) if n < 0 else min(len(self._data), self._offset + n)
        out = self._data[self._offset:end]
        self._offset = end
        return out
