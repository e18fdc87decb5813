"""StorageParts: what every part of ``DiskLedgerStorage`` holds and shares.

``DiskLedgerStorage`` (``storage.py``) is put together from layers, each a module named
for what it does: the restart and checkpoint path (``storage_checkpoints.py``), the add
path (``storage_writes.py``) and the read path (``storage_reads.py``). This base holds
their shared fields (all set in one ``__init__``, so the instance's layout is in one
place) and the few helpers more than one layer calls: a ledger's state, whether an
entry is stored, the journal write of a non-add record, and the failure switch.

Failures: a failed journal write or fdatasync fails that group and every later add
(STORAGE) and switches to read-only for good (``_on_failure``); a failed entry-log write
or index commit does the same, except that ENOSPC only switches to read-only until
space is back (``_disk_error``; ``storage.py`` watches the space). The layers are mixins
only in their code: no call on the add or read path goes through an extra object.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
from typing import Any

import lmdb

from scriba.bookie import journal as jr
from scriba.bookie.entry_log import EntryLogs
from scriba.bookie.entry_log_meta import LogMetaTable
from scriba.bookie.fileio import FileIO
from scriba.bookie.journal import DiskFullError, Journal, JournalPosition
from scriba.bookie.ledger_index import LedgerIndex
from scriba.bookie.ledger_state import LacWaiters, LedgerState, LedgerStates
from scriba.bookie.log_compactor import Reclaimer
from scriba.bookie.storage_api import ReadOnlySwitch, StorageConfig
from scriba.bookie.write_cache import WriteCache
from scriba.errors import BookieReadOnlyError, CorruptEntryError, StorageError
from scriba.invariant import InvariantViolation
from scriba.log import get_logger

__all__ = ["StorageParts"]

log = get_logger(__name__)


def _is_enospc(exc: BaseException) -> bool:
    if getattr(exc, "errno", None) == errno.ENOSPC:
        return True
    return isinstance(exc, lmdb.Error) and "No space left" in str(exc)


class StorageParts(LedgerStates):
    """The fields and shared helpers of ``DiskLedgerStorage`` (see the module docstring)."""

    def __init__(self, config: StorageConfig, fio: FileIO, loop: asyncio.AbstractEventLoop) -> None:
        self._config = config
        self._fio = fio
        self._loop = loop
        self._entry_size_max = config.entry_size_max
        self._cache_bytes_max = config.write_cache_bytes_max
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="scriba-flush")
        self._index = LedgerIndex(config.ledger_dir / "index", config.index_map_size_bytes)
        self._logs = EntryLogs(
            config.ledger_dir / "entrylogs", fio, config.entry_log_file_bytes_max,
            self._index.next_log_id(),
        )
        self._states: dict[int, LedgerState] = {}
        self._cache = WriteCache()
        self._flushing: WriteCache | None = None
        self._dirty: set[int] = set()
        self._meta = LogMetaTable({}, {})  # loaded at open (_replay)
        self._reclaimer: Reclaimer | None = None
        self._applied_pos = JournalPosition(0, jr.FILE_HEADER_SIZE)
        self._checkpointed = JournalPosition(-1, 0)
        self._enospc = False
        self._journal_queued_bytes = 0
        self._checkpoints = 0
        self._journal_room = asyncio.Event()
        self._switch = ReadOnlySwitch()
        self._waiters = LacWaiters()
        self._flush_lock = asyncio.Lock()
        self._flush_task: asyncio.Task[None] | None = None
        self._checkpoint_tasks: set[asyncio.Task[None]] = set()  # running (shielded) checkpoints
        self._tasks: list[asyncio.Task[None]] = []
        self._journal: Journal | None = None
        self._key_records: dict[int, tuple[bytes, bytes]] = {}  # ledger -> (key, its record)
        self._closed = False
        self._locks: list[int] = []

    def _on_failure(self, err: StorageError) -> None:
        if isinstance(err, DiskFullError):
            self._enospc = True
            self._switch.update(disk_full=str(err))
        else:
            self._switch.update(failed=str(err))
        log.error("storage_read_only", reason=self._switch.reason)

    def _has_entry(self, ledger_id: int, entry_id: int) -> bool:
        if self._cache.has(ledger_id, entry_id):
            return True
        if self._flushing is not None and self._flushing.has(ledger_id, entry_id):
            return True
        try:
            return self._index.get(ledger_id, entry_id) is not None
        except CorruptEntryError:
            return False

    async def _journal_write(self, record: bytes, token: Any) -> None:
        if self._switch.failed:
            raise StorageError(f"storage failed: {self._switch.failed}")
        journal = self._journal
        if journal is None:
            raise InvariantViolation("journal write before open")
        try:
            await journal.submit(record, token)
        except DiskFullError as exc:
            raise BookieReadOnlyError(f"read-only: {exc}") from exc

    def _disk_error(self, exc: BaseException, what: str) -> None:
        """A failed entry-log write or index commit (flush or compaction): the current
        log's tail may be partial, never append to it again; a full disk makes the storage
        read-only until space is back, anything else fails it for good."""
        self._logs.abandon_current()
        if _is_enospc(exc):
            self._enospc = True
            self._switch.update(disk_full=f"{what}: disk full ({exc})")
        else:
            self._switch.update(failed=f"{what} failed: {exc}")
            if self._journal is not None:
                self._journal.fail(StorageError(self._switch.failed))
        log.error(f"{what}_failed", error=str(exc), reason=self._switch.reason)
