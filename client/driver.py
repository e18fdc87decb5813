"""What the ledger drivers share: their config, metadata reads and CAS writes, error mapping.

The drivers (``writer.LedgerWriter``, ``operation.Operation``, ``reader.LedgerReader``)
carry out the I/O-free cores' effects on one event loop; this module holds the few
pieces all of them use.
"""

from __future__ import annotations

import asyncio
import builtins
from dataclasses import dataclass

from scriba.client.effects import (
    WriteMetadata,
)
from scriba.config import require
from scriba.errors import (
    DeadlineExceededError,
    InternalError,
    NoSuchKeyError,
    NoSuchLedgerError,
    ScribaError,
)
from scriba.log import get_logger
from scriba.meta.records import LEDGER_CODEC, LedgerMetadata, ledger_key
from scriba.meta.store import MetadataStore, Versioned
from scriba.meta.update import read_record, update_metadata

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class DriverConfig:
    read_timeout_s: float = 5.0
    metadata_timeout_s: float = 10.0
    appends_waiting_max: int = 100_000  # appends queued behind the in-flight bound
    # A confirmed LAC that no later entry carries (piggybacked) is pushed to the bookies
    # explicitly after this (0: on the next loop turn; tailing readers see the entry at
    # once); None: never (readers wait for a later entry or the close).
    explicit_lac_delay_s: float | None = 0.0
    long_poll_s: float = 1.0

    def validate(self) -> DriverConfig:
        require(self.read_timeout_s > 0, "read_timeout_s", "must be > 0")
        require(self.metadata_timeout_s > 0, "metadata_timeout_s", "must be > 0")
        require(self.appends_waiting_max >= 1, "appends_waiting_max", "must be >= 1")
        require(
            self.explicit_lac_delay_s is None or self.explicit_lac_delay_s >= 0,
            "explicit_lac_delay_s", "must be >= 0 or None",
        )
        require(self.long_poll_s > 0, "long_poll_s", "must be > 0")
        return self


def as_scriba_error(exc: BaseException) -> ScribaError:
    if isinstance(exc, ScribaError):
        return exc
    if isinstance(exc, builtins.TimeoutError):
        return DeadlineExceededError("metadata store did not answer in time")
    return InternalError(f"{type(exc).__name__}: {exc}")


async def update_record(
    store: MetadataStore, ledger_id: int, effect: WriteMetadata, timeout_s: float
) -> LedgerMetadata:
    record = await update_versioned_record(store, ledger_id, effect, timeout_s)
    return record.value


async def update_versioned_record(
    store: MetadataStore,
    ledger_id: int,
    effect: WriteMetadata,
    timeout_s: float,
    *,
    current: Versioned[LedgerMetadata] | None = None,
) -> Versioned[LedgerMetadata]:
    """``update_record`` starting from ``current``, a record the caller read or wrote itself.

    The first compare-and-set then goes out without reading the record back; if someone
    else wrote it since, that CAS loses and the loop reads the winner's record.
    """
    async with asyncio.timeout(timeout_s):
        record: Versioned[LedgerMetadata] = await update_metadata(
            store, ledger_key(ledger_id), LEDGER_CODEC, effect.needs_update, effect.transform,
            current=current,
        )
    return record


async def read_ledger_metadata(
    store: MetadataStore, ledger_id: int, timeout_s: float = 10.0
) -> LedgerMetadata:
    try:
        async with asyncio.timeout(timeout_s):
            record = await read_record(store, ledger_key(ledger_id), LEDGER_CODEC)
    except NoSuchKeyError:
        raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
    except builtins.TimeoutError:
        raise DeadlineExceededError(f"ledger {ledger_id}: metadata read timed out") from None
    value: LedgerMetadata = record.value
    return value
