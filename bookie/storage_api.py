"""The bookie's storage contract: what the gRPC service needs from a disk.

Two implementations keep the same behaviour: ``scriba.bookie.storage.DiskLedgerStorage``
(journal + entry logs + LMDB index) and ``scriba.bookie.memory_storage.InMemoryLedgerStorage``
(the twin for unit tests and simulation). A shared behavioural test suite runs against both.

Per-ledger state: master key (fixed by the first add or fence), fenced flag, LAC (the
highest last-add-confirmed piggybacked on a stored entry or written explicitly) and the
last stored entry id. Invariants: an add is acknowledged OK only once durable; a fenced
ledger accepts only recovery adds; an entry's bytes never change once stored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from scriba.config import require
from scriba.entry import ENTRY_SIZE_MAX_DEFAULT, HEADER_SIZE
from scriba.errors import ScribaError, Status

__all__ = [
    "AddColumns", "AddOp", "LacState", "LedgerStorage", "StorageConfig", "check_add_op", "long_poll_entries",
]


@dataclass(frozen=True, slots=True)
class AddOp:
    """One add as the service hands it to storage (``entry`` is the packed entry)."""

    ledger_id: int
    entry_id: int
    master_key: bytes
    entry: bytes
    recovery: bool = False


@dataclass(frozen=True, slots=True)
class AddColumns:
    """A batch of adds as parallel sequences (the service's hot path: no object per add).

    ``recovery`` is None when no add of the batch is a recovery add. ``blob``, when the
    caller has it (an ``AddRun``'s ``entries`` field for a batch of one run), is exactly
    ``b"".join(entries)``, and ``sizes`` the entries' lengths (an ``AddRun``'s ``sizes``):
    storage then reads headers and journals the batch from them without measuring and
    joining the entries again (a blob or sizes that do not add up are ignored).
    """

    ledger_ids: Sequence[int]
    entry_ids: Sequence[int]
    master_keys: Sequence[bytes]
    entries: Sequence[bytes]
    recovery: Sequence[bool] | None = None
    blob: bytes | None = None
    sizes: Sequence[int] | None = None

    @staticmethod
    def of(ops: Sequence[AddOp]) -> AddColumns:
        rec = [op.recovery for op in ops]
        return AddColumns(
            [op.ledger_id for op in ops],
            [op.entry_id for op in ops],
            [op.master_key for op in ops],
            [op.entry for op in ops],
            rec if any(rec) else None,
        )

    def __len__(self) -> int:
        return len(self.entries)


@dataclass(frozen=True, slots=True)
class LacState:
    """What a bookie knows about a ledger's progress."""

    lac: int
    last_entry_id: int
    fenced: bool


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """Storage tunables. ``journal_dir`` may equal ``ledger_dir`` (or be a separate disk)."""

    journal_dir: Path
    ledger_dir: Path
    entry_size_max: int = ENTRY_SIZE_MAX_DEFAULT
    journal_group_wait_ms_max: float = 1.0
    journal_group_bytes_max: int = 4 * 1024 * 1024
    journal_file_bytes_max: int = 256 * 1024 * 1024
    journal_prealloc_bytes: int = 4 * 1024 * 1024  # journal files grown this far ahead of their records; 0: not
    journal_drop_cache_bytes: int = 1024 * 1024  # synced journal pages dropped from the page cache in steps; 0: kept
    journal_queue_bytes_max: int = 64 * 1024 * 1024
    journal_sync_inline_when_idle: bool = True  # see journal.Journal (idle path)
    entry_log_file_bytes_max: int = 256 * 1024 * 1024
    write_cache_bytes_max: int = 64 * 1024 * 1024
    checkpoint_interval_s: float = 30.0
    disk_usage_threshold: float = 0.95
    disk_usage_lwm: float = 0.90
    disk_check_interval_s: float = 5.0
    index_map_size_bytes: int = 64 * 1024 * 1024 * 1024
    lac_wait_timeout_s_max: float = 120.0

    def validate(self) -> None:
        require(str(self.journal_dir) != "", "journal_dir", "must be set")
        require(str(self.ledger_dir) != "", "ledger_dir", "must be set")
        require(self.entry_size_max > HEADER_SIZE, "entry_size_max", "must exceed the header")
        require(self.journal_group_wait_ms_max >= 0, "journal_group_wait_ms_max", "must be >= 0")
        require(self.journal_group_bytes_max >= 4096, "journal_group_bytes_max", "must be >= 4096")
        require(
            self.journal_file_bytes_max >= self.journal_group_bytes_max,
            "journal_file_bytes_max",
            "must be >= journal_group_bytes_max",
        )
        require(self.journal_prealloc_bytes >= 0, "journal_prealloc_bytes", "must be >= 0")
        require(self.journal_drop_cache_bytes >= 0, "journal_drop_cache_bytes", "must be >= 0")
        require(
            self.journal_queue_bytes_max >= self.journal_group_bytes_max,
            "journal_queue_bytes_max",
            "must be >= journal_group_bytes_max",
        )
        require(self.entry_log_file_bytes_max >= 4096, "entry_log_file_bytes_max", ">= 4096")
        require(self.write_cache_bytes_max >= 4096, "write_cache_bytes_max", "must be >= 4096")
        require(self.checkpoint_interval_s > 0, "checkpoint_interval_s", "must be > 0")
        require(
            0 < self.disk_usage_lwm <= self.disk_usage_threshold <= 1,
            "disk_usage_threshold",
            "need 0 < disk_usage_lwm <= disk_usage_threshold <= 1",
        )
        require(self.disk_check_interval_s > 0, "disk_check_interval_s", "must be > 0")
        require(self.index_map_size_bytes >= 1 << 20, "index_map_size_bytes", ">= 1 MiB")
        require(self.lac_wait_timeout_s_max > 0, "lac_wait_timeout_s_max", "must be > 0")


@runtime_checkable
class LedgerStorage(Protocol):
    async def add_batch(self, ops: Sequence[AddOp]) -> list[Status]:
        """Statuses per op; every OK is durable (journal write + fdatasync) on return.

        OK, FENCED, UNAUTHORIZED (master key differs from the ledger's first), READ_ONLY,
        BAD_REQUEST (header does not name ledger/entry, too large), STORAGE after a disk
        error (never OK after a failed fsync). A re-add of a stored entry is OK (the bytes
        first written are kept).
        """
        ...

    async def add_columns(self, adds: AddColumns) -> list[Status]:
        """As :meth:`add_batch`, for adds given as parallel sequences (the service's path)."""
        ...

    async def fence(self, ledger_id: int, master_key: bytes) -> LacState:
        """Fence (creating the ledger's state if unknown); durable before it returns."""
        ...

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The stored bytes (-1: the last stored entry). NoSuchLedger/NoSuchEntry/CorruptEntry."""
        ...

    def read_range(
        self, ledger_id: int, first: int, last: int, max_entries: int, max_bytes: int
    ) -> list[bytes]:
        """Consecutive entries from ``first``; stops at a gap, a bound or an entry corrupt at
        rest (at least one entry: NoSuchLedger/NoSuchEntry/CorruptEntry for ``first``)."""
        ...

    def lac_state(self, ledger_id: int) -> LacState: ...

    def ledger_master_key(self, ledger_id: int) -> bytes | None:
        """The master key the ledger is bound to here (None: the ledger is not here)."""
        ...

    async def wait_lac(self, ledger_id: int, previous_lac: int, timeout_s: float, *, entry: bool = False) -> LacState:
        """Return once the LAC exceeds ``previous_lac`` (with ``entry``: and entry
        ``previous_lac + 1`` is stored here, so the answer can carry it: a bookie learns an
        LAC when it admits the entry carrying it, before its earlier entries may be
        durable) or ``timeout_s`` passes (long poll)."""
        ...

    async def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> None: ...

    def note_lac(self, ledger_id: int, lac: int, master_key: bytes) -> None:
        """A writer's LAC pushed for tailing readers: the LAC rises at once (long polls
        wake), nothing is journaled (the entries' piggybacked LACs are the durable record;
        after a restart the LAC may read lower, never higher). UnauthorizedError for a
        wrong key, NoSuchLedgerError for a ledger this bookie holds nothing of."""
        ...

    def ledger_ids(self) -> list[int]: ...

    async def delete_ledgers(self, ledger_ids: Collection[int]) -> None: ...

    @property
    def read_only(self) -> bool: ...

    @property
    def read_only_reason(self) -> str: ...

    def disk_usage(self) -> tuple[int, int]:
        """(free bytes, total bytes) of the ledger disk."""
        ...

    def add_state_listener(self, cb: Callable[[bool, str], None]) -> None: ...

    async def set_read_only(self, read_only: bool, reason: str) -> None: ...

    async def checkpoint(self) -> None: ...

    async def close(self) -> None: ...


def check_add_op(op: AddOp, entry_size_max: int) -> bool:
    """Whether an add is well formed: its header names its ledger and entry, size in bounds."""
    entry = op.entry
    if len(entry) < HEADER_SIZE or len(entry) > entry_size_max or op.entry_id < 0:
        return False
    if op.ledger_id < 0 or op.ledger_id >= 1 << 63:
        return False
    return (
        int.from_bytes(entry[0:8], "big") == op.ledger_id
        and int.from_bytes(entry[8:16], "big", signed=True) == op.entry_id
    )


def long_poll_entries(
    storage: LedgerStorage, ledger_id: int, previous_lac: int, lac: int, entries_max: int, bytes_max: int
) -> list[bytes]:
    """The entries a long-poll answer carries to a tailing reader: consecutive from
    ``previous_lac + 1``, at most ``entries_max`` and about ``bytes_max`` bytes (at least
    one), and **never one beyond ``lac``**: a reader may only see confirmed entries.
    Empty when the LAC did not pass ``previous_lac`` or ``previous_lac + 1`` cannot be
    read here (this bookie's copy is not durable yet, or corrupt): the reader then reads
    it from the replicas itself."""
    first = previous_lac + 1
    last = min(lac, previous_lac + entries_max)
    if entries_max <= 0 or last < first:
        return []
    try:
        return storage.read_range(ledger_id, first, last, entries_max, bytes_max)
    except ScribaError:
        return []


class ReadOnlySwitch:
    """Why a storage is read-only: operator/server choice, a full disk, or a failed disk.

    Read-only while any cause holds; a disk failure holds until restart. Listeners get
    ``(read_only, reason)`` on every change of the combined state.
    """

    def __init__(self) -> None:
        self.forced = ""
        self.disk_full = ""
        self.failed = ""
        self._listeners: list[Callable[[bool, str], None]] = []
        self._last: tuple[bool, str] = (False, "")

    @property
    def read_only(self) -> bool:
        return bool(self.failed or self.disk_full or self.forced)

    @property
    def reason(self) -> str:
        return self.failed or self.disk_full or self.forced

    def add_listener(self, cb: Callable[[bool, str], None]) -> None:
        self._listeners.append(cb)

    def update(self, **causes: str) -> None:
        for name, why in causes.items():
            if name == "failed" and self.failed:
                continue  # the first disk error is the one that counts
            setattr(self, name, why)
        now = (self.read_only, self.reason)
        if now[0] != self._last[0]:
            self._last = now
            for cb in list(self._listeners):
                try:
                    cb(now[0], now[1])
                except Exception:  # a listener's bug must not break storage
                    logging.getLogger(__name__).exception("read_only_listener_failed")
        else:
            self._last = now
