"""The multi-version key space: every key's versions since the last compaction.

A key's history is a list of :class:`Version` in increasing ``mod_revision``; a
deletion appends a tombstone (``version == 0``). A read at revision ``R`` sees, per
key, the newest version with ``mod_revision <= R`` unless it is a tombstone. Keys
are kept sorted (``bisect``) for range scans. Range conventions are etcd's:
``end == b""`` one key, ``end == b"\\x00"`` every key from ``key`` on (``key ==
b"\\x00"`` too: all keys), otherwise ``[key, end)``; an ``end`` at or before ``key``
selects nothing (etcd answers an empty range, not an error). ``compact(R)`` drops
what no read at ``R`` or later can see. Pure data, no I/O, no clock.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass

from scriba.invariant import invariant

ALL = b"\x00"


@dataclass(frozen=True, slots=True)
class Version:
    key: bytes
    create_revision: int
    mod_revision: int
    version: int  # 0: a tombstone
    value: bytes
    lease: int

    @property
    def live(self) -> bool:
        return self.version > 0


class KeySpace:
    def __init__(self) -> None:
        self.history: dict[bytes, list[Version]] = {}
        self.keys: list[bytes] = []  # sorted; keys with any history (tombstones until compacted)

    def select(self, key: bytes, end: bytes) -> Iterator[bytes]:
        if not end:
            if key in self.history:
                yield key
            return
        if key == ALL and end == ALL:
            key = b""
        start = bisect.bisect_left(self.keys, key)
        stop = len(self.keys) if end == ALL else bisect.bisect_left(self.keys, end)
        yield from self.keys[start:stop]

    def at(self, key: bytes, revision: int) -> Version | None:
        """The version of ``key`` a read at ``revision`` sees (None: absent or deleted)."""
        for v in reversed(self.history.get(key, ())):
            if v.mod_revision <= revision:
                return v if v.live else None
        return None

    def range(self, key: bytes, end: bytes, revision: int) -> list[Version]:
        return [v for k in self.select(key, end) if (v := self.at(k, revision)) is not None]

    def put(self, key: bytes, value: bytes, lease: int, revision: int) -> tuple[Version | None, Version]:
        """Write ``key`` at ``revision``; (the previous live version, the new one)."""
        prev = self.at(key, revision)
        if prev is None:
            new = Version(key, revision, revision, 1, value, lease)
        else:
            new = Version(key, prev.create_revision, revision, prev.version + 1, value, lease)
        self._append(new)
        return prev, new

    def delete(self, key: bytes, end: bytes, revision: int) -> list[Version]:
        """Tombstone every live key in the range at ``revision``; the deleted versions."""
        deleted = self.range(key, end, revision)
        for v in deleted:
            self._append(Version(v.key, 0, revision, 0, b"", 0))
        return deleted

    def _append(self, new: Version) -> None:
        versions = self.history.get(new.key)
        if versions is None:
            self.history[new.key] = [new]
            bisect.insort(self.keys, new.key)
            return
        invariant(versions[-1].mod_revision <= new.mod_revision, "key history goes back in revisions")
        if versions[-1].mod_revision == new.mod_revision:
            versions.pop()  # a second change in one revision replaces the first
        versions.append(new)

    def compact(self, revision: int) -> None:
        """Forget every version a read at ``revision`` or later cannot see."""
        for key in list(self.keys):
            versions = self.history[key]
            keep = 0
            for i, v in enumerate(versions):
                if v.mod_revision <= revision:
                    keep = i
            rest = versions[keep:]
            if rest and rest[0].mod_revision <= revision and not rest[0].live:
                rest = rest[1:]
            if rest:
                self.history[key] = rest
            else:
                del self.history[key]
                self.keys.remove(key)

    def versions(self) -> Iterator[Version]:
        for key in self.keys:
            yield from self.history[key]

    def load(self, versions: list[Version]) -> None:
        self.history.clear()
        for v in versions:
            self.history.setdefault(v.key, []).append(v)
        self.keys = sorted(self.history)
