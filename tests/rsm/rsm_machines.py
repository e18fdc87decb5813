"""State machines for the RSM tests: a counter and a register, each with a state digest."""

from __future__ import annotations

import hashlib

from scriba.rsm import SnapshotReader, SnapshotWriter
from scriba.stream import Position


class Counter:
    """``incr`` adds one (result: the new count); ``boom`` raises; query: the count."""

    def __init__(self) -> None:
        self.count = 0
        self.log: list[tuple[Position, bytes]] = []  # (position, command) applied, in order

    def apply(self, command: bytes, position: Position) -> bytes:
        if command == b"boom":
            raise RuntimeError("the state machine refused boom")
        self.count += 1
        self.log.append((position, command))
        return str(self.count).encode()

    def query(self, request: bytes) -> bytes:
        if request == b"digest":
            return self.digest().encode()
        return str(self.count).encode()

    def digest(self) -> str:
        return hashlib.sha256(str(self.count).encode()).hexdigest()[:16]

    def snapshot(self, out: SnapshotWriter) -> None:
        out.write(str(self.count).encode())

    def restore(self, src: SnapshotReader) -> None:
        self.count = int(src.read())
        self.log = []


class Register:
    """``set:<v>`` sets the value (result: the old one); query: the value."""

    def __init__(self) -> None:
        self.value = b""

    def apply(self, command: bytes, position: Position) -> bytes:
        old = self.value
        self.value = command.removeprefix(b"set:")
        return old

    def query(self, request: bytes) -> bytes:
        return self.value

    def snapshot(self, out: SnapshotWriter) -> None:
        out.write(self.value)

    def restore(self, src: SnapshotReader) -> None:
        self.value = src.read()
