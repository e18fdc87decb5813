"""DiskLedgerStorage: journal + write cache + entry logs + LMDB index.

An add is journaled (group commit + fdatasync) and answered, then kept in the write cache;
a checkpoint moves the cache to the entry logs and the LMDB index and trims the journal.
The class is put together from layers, each a module named for what it does:

- ``storage_parts``: the shared fields (one ``__init__``) and helpers, the failure switch;
- ``storage_checkpoints``: restart (journal replay), checkpoints, deletion, compaction;
- ``storage_writes``: the add path (admission, one journal record a batch, the durable
  callback into the write cache), fences and explicit LACs;
- ``storage_reads``: entry, range and LAC reads;
- this module: opening (dirs, locks, replay, periodic tasks), the disk-space watch and
  the read-only state, figures, closing.

Failures: a failed journal write or fdatasync fails that group and every later add
(STORAGE) and switches to read-only for good; ENOSPC (journal cut back to its durable
end) or disk usage over ``disk_usage_threshold`` switch to read-only until usage drops
under ``disk_usage_lwm`` (and, after an ENOSPC, until each dir takes a small durable
write again). Reads keep working in read-only mode.

Invariant: an add is OK only after its journal record's fdatasync returned.

On disk: ``<journal_dir>/<id:016x>.jnl`` (journal.py, journal_format.py), ``<ledger_dir>/entrylogs/<id:08x>.elog``
(entry_log.py), ``<ledger_dir>/index/`` (LMDB, ledger_index.py) and a ``LOCK`` file in each
dir held with ``flock`` while open (a second process on the same dirs is refused).
"""
from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scriba.bookie.fileio import FileIO, default_fileio
from scriba.bookie.journal import Journal
from scriba.bookie.log_compactor import Reclaimer
from scriba.bookie.storage_api import StorageConfig
from scriba.bookie.storage_reads import StorageReads
from scriba.bookie.storage_writes import StorageWrites
from scriba.errors import StorageError
from scriba.log import get_logger

__all__ = ["DiskLedgerStorage", "open_storage"]

log = get_logger(__name__)


class DiskLedgerStorage(StorageWrites, StorageReads):
    """The disk ``LedgerStorage`` (``storage_api``); open it with :func:`open_storage`."""

    async def _start(self) -> None:
        await self._loop.run_in_executor(self._executor, self._replay)
        self._reclaimer = Reclaimer(
            self._logs, self._index, self._meta, loop=self._loop, executor=self._executor,
            lock=self._flush_lock, stopped=lambda: bool(self._switch.failed or self._closed),
            on_error=self._disk_error,
        )
        c = self._config
        self._journal = Journal(
            c.journal_dir, self._fio, self._loop, self._on_durable, self._on_failure,
            group_wait_ms_max=c.journal_group_wait_ms_max,
            group_bytes_max=c.journal_group_bytes_max,
            file_bytes_max=c.journal_file_bytes_max,
            prealloc_bytes=c.journal_prealloc_bytes,
            drop_cache_bytes=c.journal_drop_cache_bytes,
            sync_inline_when_idle=c.journal_sync_inline_when_idle,
        )
        self._applied_pos = self._journal.position
        self._check_disk()
        await self.checkpoint()
        self._tasks.append(self._loop.create_task(self._every(c.checkpoint_interval_s, self.checkpoint)))
        self._tasks.append(self._loop.create_task(self._every(c.disk_check_interval_s, self._check_disk_async)))

    async def _every(self, interval_s: float, fn: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await fn()
            except Exception:
                log.exception("storage_periodic_task_failed")

    # --- state ------------------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        return self._switch.read_only

    @property
    def read_only_reason(self) -> str:
        return self._switch.reason

    def disk_usage(self) -> tuple[int, int]:
        usage = shutil.disk_usage(self._config.ledger_dir)
        return usage.free, usage.total

    def _check_disk(self) -> None:
        used_max = 0.0
        for d in {self._config.ledger_dir, self._config.journal_dir}:
            usage = shutil.disk_usage(d)
            if usage.used + usage.free > 0:  # as df's Use%: blocks reserved for root excluded
                used_max = max(used_max, usage.used / (usage.used + usage.free))
        c = self._config
        if used_max >= c.disk_usage_threshold:
            if not self._switch.disk_full:
                log.warning("disk_full", used=round(used_max, 4), threshold=c.disk_usage_threshold)
            self._switch.update(disk_full=f"disk usage {used_max:.1%} >= {c.disk_usage_threshold:.0%}")
        elif used_max < c.disk_usage_lwm and self._switch.disk_full:
            if self._enospc and not self._probe_space():
                return  # statvfs says there is room, but writes still fail (quota, inodes...)
            log.info("disk_space_back", used=round(used_max, 4))
            self._enospc = False
            self._switch.update(disk_full="")

    def _probe_space(self) -> bool:
        """After an ENOSPC: can each dir take a small durable write again?"""
        for d in {self._config.ledger_dir, self._config.journal_dir}:
            path = Path(d) / ".space-probe"
            try:
                fd = self._fio.open(path, create=True)
                try:
                    self._fio.write(fd, b"\0" * 4096)
                    self._fio.fdatasync(fd)
                finally:
                    self._fio.close(fd)
                    self._fio.remove(path)
            except OSError:
                return False
        return True

    async def _check_disk_async(self) -> None:
        was_full = bool(self._switch.disk_full)
        self._check_disk()
        if was_full and not self._switch.disk_full and self._cache.bytes:
            await self.checkpoint()

    def add_state_listener(self, cb: Callable[[bool, str], None]) -> None:
        self._switch.add_listener(cb)

    async def set_read_only(self, read_only: bool, reason: str) -> None:
        self._switch.update(forced=(reason or "operator") if read_only else "")

    def stats(self) -> dict[str, float]:
        """Figures for metrics (gauges/counters; names carry their units)."""
        j = self._journal
        return {
            "journal_groups_total": j.groups if j else 0,
            "journal_records_total": j.records if j else 0,
            "journal_write_sync_seconds_total": j.syncs_seconds if j else 0.0,
            "journal_queued_bytes": self._journal_queued_bytes,
            "write_cache_bytes": self._cache.bytes,
            "write_cache_entries": self._cache.count,
            "checkpoints_total": self._checkpoints,
            "ledgers": len(self._states),
            **self._entry_log_stats(),
            "read_only": 1 if self._switch.read_only else 0,
        }

    def _entry_log_stats(self) -> dict[str, float]:
        usages = self._meta.usages()
        total = sum(u.total_bytes for u in usages)
        live = sum(u.live_bytes for u in usages)
        progress = self._reclaimer.progress if self._reclaimer is not None else None
        return {
            "entry_logs": len(usages),
            "entry_log_bytes": total,
            "entry_log_live_bytes": live,
            "entry_log_reclaimable_bytes": total - live,
            "compaction_running": 1 if progress is not None and progress.running else 0,
            "compaction_pass_bytes": progress.pass_bytes if progress is not None else 0,
            "compaction_pass_scanned_bytes": progress.scanned_bytes if progress is not None else 0,
        }

    def journal_stats(self) -> dict[str, float]:
        j = self._journal
        if j is None:
            return {}
        return {"groups": j.groups, "records": j.records, "sync_seconds": j.syncs_seconds}

    async def close(self) -> None:
        """Graceful: finish queued journal writes, checkpoint, release everything."""
        if self._closed:
            return
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._journal is not None:
            await self.checkpoint()
        self._closed = True
        self._waiters.notify_all()
        await self._release(abandon=False)

    async def abandon(self) -> None:
        """Test hook, as a crash: stop without flushing anything not yet durable."""
        self._closed = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        async with self._flush_lock:
            await self._release(abandon=True)

    async def _release(self, *, abandon: bool) -> None:
        if self._journal is not None:
            journal = self._journal
            await self._loop.run_in_executor(None, lambda: journal.close(abandon=abandon))
        self._executor.shutdown(wait=True)
        self._logs.close()
        self._index.close()
        locks, self._locks = self._locks, []
        for fd in locks:
            os.close(fd)


def _make_dirs(config: StorageConfig) -> None:
    for d in (config.journal_dir, config.ledger_dir, config.ledger_dir / "entrylogs"):
        Path(d).mkdir(parents=True, exist_ok=True)


def _lock_dirs(config: StorageConfig) -> list[int]:
    """Hold an exclusive lock on each dir: two processes on one journal would corrupt it."""
    fds: list[int] = []
    try:
        for d in dict.fromkeys([Path(config.journal_dir), Path(config.ledger_dir)]):
            fd = os.open(d / "LOCK", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StorageError(f"{d}: in use by another storage (LOCK held)") from None
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


async def open_storage(config: StorageConfig, *, fileio: FileIO | None = None) -> DiskLedgerStorage:
    """Open (creating dirs), replay the journal from the last checkpoint, and checkpoint."""
    config.validate()
    _make_dirs(config)
    locks = _lock_dirs(config)
    try:
        storage = DiskLedgerStorage(config, fileio or default_fileio(), asyncio.get_running_loop())
    except BaseException:
        for fd in locks:
            os.close(fd)
        raise
    storage._locks = locks
    try:
        await storage._start()
    except BaseException:
        await storage._release(abandon=True)
        raise
    return storage
