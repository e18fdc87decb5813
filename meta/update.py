"""The one way to change a record: a compare-and-set loop.

Learned from BookKeeper's ``MetadataUpdateLoop``: read the record, ask
``needs_update``; if it does, derive a new record with ``transform`` (records are
immutable), write it with the version read; on a lost race re-read and repeat (after a short
jittered pause, at most ``attempts_max`` times: ``scriba.retry``).
Every writer of records (ledger close, ensemble change, recovery, bookie state)
goes through :func:`update_metadata`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Final, Protocol, TypeVar

from scriba.errors import BadVersionError
from scriba.meta.store import MetadataStore, Versioned
from scriba.retry import RetryPolicy, retry_async

T = TypeVar("T")


class Codec(Protocol[T]):
    def to_bytes(self, value: T) -> bytes: ...

    def from_bytes(self, data: bytes) -> T: ...


UPDATE_ATTEMPTS_MAX = 32
CAS_RETRY: Final = RetryPolicy(attempts_max=UPDATE_ATTEMPTS_MAX, delay_s_min=0.001, delay_s_max=0.05)
"""Lost races are retried after a short jittered pause (windows of 1 to 50 ms), so racers spread out."""


class _LostRace(Exception):
    """Our compare-and-set lost (only this is retried: ``transform``'s own errors abort)."""


async def read_record(store: MetadataStore, key: str, codec: Codec[T]) -> Versioned[T]:
    raw = await store.get(key)
    return Versioned(codec.from_bytes(raw.value), raw.version, raw.created, raw.owner)


async def update_metadata(
    store: MetadataStore,
    key: str,
    codec: Codec[T],
    needs_update: Callable[[T], bool],
    transform: Callable[[T], T],
    *,
    current: Versioned[T] | None = None,
    attempts_max: int = UPDATE_ATTEMPTS_MAX,
) -> Versioned[T]:
    """Apply ``transform`` until it sticks or is no longer needed; return the record.

    ``transform`` may raise to abort (e.g. the ledger is already CLOSED). Raises
    ``BadVersionError`` only after ``attempts_max`` lost races in a row.
    """
    record = current

    async def attempt() -> Versioned[T]:
        nonlocal record
        if record is None:
            record = await read_record(store, key, codec)
        if not needs_update(record.value):
            return record
        new_value = transform(record.value)
        try:
            version = await store.set(key, codec.to_bytes(new_value), expected_version=record.version)
        except BadVersionError:
            record = None  # lost the race: the next attempt reads the winner's record
            raise _LostRace from None
        return Versioned(new_value, version, record.created, record.owner)  # a set keeps the owner

    policy = replace(CAS_RETRY, attempts_max=attempts_max).validate()
    try:
        return await retry_async(
            attempt, policy=policy, what=f"update {key}", retry_if=lambda e: isinstance(e, _LostRace)
        )
    except _LostRace:
        raise BadVersionError(f"{key}: gave up after {attempts_max} conflicting updates") from None
