"""``allocate_id`` for every driver: ids handed out from ranges each client reserves.

The record ``ids/<name>`` holds, as decimal text, the highest id anyone has reserved
from the sequence ``name`` (no record: nothing reserved yet, or a driver's ``floor``).
A client reserves the next ``n`` ids with one compare-and-set ``c -> c + n`` and then
hands out ``c+1 .. c+n`` from memory, in order, with no I/O. One counter CAS per id
(the old way) made every creator in the cluster contend on one key; here the creators
of one client never contend, and clients contend once per range.

Range sizes adapt: a sequence's first range holds :data:`RANGE_MIN` ids and every
refill doubles it, up to :data:`RANGE_MAX` — and holds at least as many ids as callers
are waiting — so a short-lived client (one CLI command) skips few ids and a busy one
does one CAS per :data:`RANGE_MAX` ids. The version this client last wrote is kept, so
a refill that nobody raced costs one round trip, not a read and a write.

Invariants:

- an id is handed out only after the CAS that reserved it has committed, so no two
  clients ever hold one id, whatever crashes; a CAS whose outcome is unknown (a
  time-out) is retried after a fresh read, and the range it may have reserved is
  simply skipped;
- the counter only grows, so one allocator's ids strictly increase, and no id is
  handed out twice, even after every client has restarted;
- ids are not dense: what a closed or crashed client had not handed out is skipped.
  Never 0; never above :data:`ID_MAX`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

from scriba.errors import (
    BadRequestError,
    BadVersionError,
    InternalError,
    KeyExistsError,
    MetadataError,
    NoSuchKeyError,
)
from scriba.invariant import invariant
from scriba.meta.store import Versioned, check_key
from scriba.retry import RetryPolicy, is_retriable, retry_async

ID_MAX: Final = (1 << 63) - 1
RANGE_MIN: Final = 1
RANGE_MAX: Final = 1024
SEQUENCES_MAX: Final = 1024
RESERVE_RETRY: Final = RetryPolicy(attempts_max=32, delay_s_min=0.002, delay_s_max=0.1).validate()
"""A reservation retries lost races (re-reading first) and unreachable stores."""

Floor = Callable[[str], Awaitable[int]]


class CounterStore(Protocol):
    """The three record operations a reservation needs (every ``MetadataStore`` has them)."""

    async def get(self, key: str) -> Versioned[bytes]: ...

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> int: ...

    async def set(self, key: str, value: bytes, *, expected_version: int) -> int: ...


async def _no_floor(name: str) -> int:
    return 0


def _worth_retrying(error: BaseException) -> bool:
    """Lost races (the next attempt re-reads) and unreachable stores."""
    return isinstance(error, BadVersionError | KeyExistsError) or is_retriable(error)


@dataclass(slots=True)
class _Sequence:
    next_id: int = 1
    last_id: int = 0  # the range is next_id .. last_id (empty when next_id > last_id)
    range_size: int = 0
    known: Versioned[bytes] | None = None  # the counter record as this client last wrote it
    waiting: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class IdRanges:
    """One client's reserved ranges, per sequence name (see the module docstring)."""

    def __init__(self, store: CounterStore, *, floor: Floor = _no_floor, range_max: int = RANGE_MAX) -> None:
        invariant(range_max >= RANGE_MIN, f"range_max {range_max} < {RANGE_MIN}")
        self._store = store
        self._floor = floor
        self._range_max = range_max
        self._sequences: dict[str, _Sequence] = {}

    async def allocate(self, name: str) -> int:
        """The next id of sequence ``name``: unique, never reused, increasing per client."""
        seq = self._sequence(name)
        if seq.next_id > seq.last_id:
            seq.waiting += 1
            try:
                async with seq.lock:
                    if seq.next_id > seq.last_id:
                        await self._refill(name, seq)
            finally:
                seq.waiting -= 1
        new_id = seq.next_id
        seq.next_id += 1
        return new_id

    def _sequence(self, name: str) -> _Sequence:
        seq = self._sequences.get(name)
        if seq is None:
            if not name or "/" in name:
                raise BadRequestError(f"id sequence name {name!r} must be one path segment")
            check_key(f"ids/{name}")
            if len(self._sequences) >= SEQUENCES_MAX:  # forget idle ones: their rest is skipped
                for old, s in list(self._sequences.items()):
                    if s.waiting == 0 and not s.lock.locked():
                        del self._sequences[old]
            if len(self._sequences) >= SEQUENCES_MAX:
                raise MetadataError(f"more than {SEQUENCES_MAX} id sequences busy at once")
            seq = self._sequences[name] = _Sequence()
        return seq

    async def _refill(self, name: str, seq: _Sequence) -> None:
        count = min(self._range_max, max(RANGE_MIN, seq.range_size * 2, seq.waiting))
        first, last = await retry_async(
            lambda: self._reserve(name, seq, count),
            policy=RESERVE_RETRY, what=f"allocate_id {name}", retry_if=_worth_retrying,
        )
        invariant(first > seq.last_id, f"id sequence {name}: range {first} is not above {seq.last_id}")
        seq.next_id, seq.last_id, seq.range_size = first, last, count

    async def _reserve(self, name: str, seq: _Sequence, count: int) -> tuple[int, int]:
        """One attempt: CAS the counter up by ``count``; the reserved ``(first, last)``."""
        key = f"ids/{name}"
        known, seq.known = seq.known, None  # kept again only once this attempt's write is known
        if known is None:
            try:
                known = await self._store.get(key)
            except NoSuchKeyError:
                base = max(await self._floor(name), seq.last_id)
                first, last = _bounds(name, base, count)
                version = await self._store.create(key, str(last).encode())
                seq.known = Versioned(str(last).encode(), version)
                return first, last
        first, last = _bounds(name, _parse(key, known.value), count)
        try:
            version = await self._store.set(key, str(last).encode(), expected_version=known.version)
        except NoSuchKeyError:  # deleted since read: the next attempt starts it again
            raise BadVersionError(f"{key}: deleted while reserving ids") from None
        seq.known = Versioned(str(last).encode(), version)
        return first, last


def _parse(key: str, value: bytes) -> int:
    try:
        current = int(value)
    except ValueError:
        raise InternalError(f"{key}: id counter holds {value[:40]!r}, not a number") from None
    if not 0 <= current <= ID_MAX:
        raise InternalError(f"{key}: id counter {current} is out of range")
    return current


def _bounds(name: str, current: int, count: int) -> tuple[int, int]:
    if current >= ID_MAX:
        raise MetadataError(f"id sequence {name!r} is exhausted (2**63 - 1 ids)")
    return current + 1, min(ID_MAX, current + count)
