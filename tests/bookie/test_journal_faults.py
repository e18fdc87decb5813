"""Journal durability under one-shot and partial faults (#23 D, RELIABILITY.md harness 7).

A rule that holds only while a fault lasts is not enough:

- one fdatasync EIO, and the next would succeed: the journal has failed for good. The
  group that met the error, every record queued behind it and every later submit fail;
  none is acknowledged (a failed sync is never retried-and-acknowledged).
- a partial (torn) write then ENOSPC, once: that group fails as "disk full" and the file
  is cut back to its last durable end before anything else is written, so the groups
  acknowledged after the episode are replayed after a restart.

The journal thread is held inside the faulty call (``HeldFileIO``) so that records are
queued behind the failing group deterministically.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from scriba.bookie import journal as jr
from scriba.bookie.fileio import OsFileIO
from scriba.bookie.storage import open_storage
from scriba.bookie.storage_api import AddOp, StorageConfig
from scriba.entry import Crc32cDigest, pack_entry
from scriba.errors import Status, StorageError
from scriba.testing.diskfaults import FaultyFileIO
from scriba.testing.waiting import eventually

WAIT_S = 10.0
KEY = b"k" * 32
DIGEST = Crc32cDigest()
ONE_FSYNC_EIO = {"fsync_eio": True, "faults_max": 1, "path_contains": ".jnl"}
ONE_TORN_ENOSPC = {"enospc": True, "torn_write_bytes": 11, "faults_max": 1, "path_contains": ".jnl"}


class HeldFileIO(FaultyFileIO):
    """Holds the journal thread at the start of its next ``hold`` call until released."""

    def __init__(self, hold: str) -> None:
        super().__init__()
        self.hold = hold  # "write" or "fdatasync"
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def _maybe_hold(self, call: str) -> None:
        if self.armed and call == self.hold and threading.current_thread().name == "scriba-journal":
            self.armed = False
            self.entered.set()
            self.release.wait(WAIT_S)

    def write(self, fd: int, data: bytes | memoryview) -> None:
        self._maybe_hold("write")
        super().write(fd, data)

    def fdatasync(self, fd: int) -> None:
        self._maybe_hold("fdatasync")
        super().fdatasync(fd)


class Outcomes:
    def __init__(self) -> None:
        self.durable: list[Any] = []
        self.failures: list[StorageError] = []

    def open(self, root: Path, fio: FaultyFileIO, *, inline: bool) -> jr.Journal:
        root.mkdir(exist_ok=True)
        return jr.Journal(root, fio, asyncio.get_running_loop(),
                          lambda tokens, pos: self.durable.extend(tokens), self.failures.append,
                          sync_inline_when_idle=inline)


def idle_submit(j: jr.Journal, n: int) -> asyncio.Future[None]:
    """Submit on the idle path: written and synced inline, on the loop's thread. (The
    journal leaves that path after a sync slower than INLINE_SYNC_S_MAX; a busy shared
    disk must not move this test onto the thread.)"""
    j._last_sync_s = 0.0
    return j.submit(record(n), n)


def record(n: int) -> bytes:
    return jr.encode_explicit_lac(1, n)


def replayed(root: Path) -> list[int]:
    """The explicit-LAC values of the records a restart replays."""
    first = jr.journal_files(root)[0][0]
    out = []
    for rtype, body, _ in jr.replay_journal(root, OsFileIO(), jr.JournalPosition(first, jr.FILE_HEADER_SIZE)):
        assert rtype == jr.EXPLICIT_LAC
        out.append(int.from_bytes(body[9:17], "big", signed=True))
    return out


async def outcome(fut: asyncio.Future[None]) -> BaseException | None:
    try:
        await asyncio.wait_for(fut, WAIT_S)
    except StorageError as exc:
        return exc
    return None


async def test_one_fsync_error_fails_the_group_queued_records_and_later_submits(tmp_path: Path) -> None:
    fio = HeldFileIO("fdatasync")
    out = Outcomes()
    j = out.open(tmp_path / "j", fio, inline=False)
    try:
        assert await outcome(j.submit(record(0), 0)) is None
        fio.set_spec(ONE_FSYNC_EIO)
        fio.armed = True
        first = j.submit(record(1), 1)
        assert await asyncio.to_thread(fio.entered.wait, WAIT_S), "the journal never synced"
        queued = [j.submit(record(n), n) for n in range(2, 6)]  # behind the failing group
        assert j.queued() == 4
        fio.release.set()
        results = [await outcome(f) for f in (first, *queued)]
        assert all(isinstance(r, StorageError) for r in results), results
        assert out.durable == [0], "acknowledged after a failed fdatasync"
        assert fio.faults == [f"fsync_eio:{jr.file_name(tmp_path / 'j', 1)}"]  # one-shot: spent
        assert j.failed is not None and out.failures
        later = j.submit(record(6), 6)  # the disk works again: still nothing is acknowledged
        assert isinstance(await outcome(later), StorageError)
        assert out.durable == [0]
    finally:
        fio.release.set()
        j.close()


async def test_one_fsync_error_on_the_idle_path_fails_the_journal_for_good(tmp_path: Path) -> None:
    fio = FaultyFileIO()
    out = Outcomes()
    j = out.open(tmp_path / "j", fio, inline=True)
    try:
        assert await outcome(idle_submit(j, 0)) is None
        fio.set_spec(ONE_FSYNC_EIO)
        assert isinstance(await outcome(idle_submit(j, 1)), StorageError)
        assert len(fio.faults) == 1
        for n in (2, 3):  # idle again, and the next fdatasync would succeed
            assert isinstance(await outcome(idle_submit(j, n)), StorageError)
        assert out.durable == [0]
        assert j.failed is not None
    finally:
        j.close()


@pytest.mark.parametrize("path", ["idle", "queued"])
async def test_a_torn_write_then_disk_full_is_cut_back_before_later_groups(tmp_path: Path, path: str) -> None:
    fio = HeldFileIO("write")
    out = Outcomes()
    root = tmp_path / "j"
    j = out.open(root, fio, inline=path == "idle")
    try:
        assert await outcome(j.submit(record(0), 0)) is None
        fio.set_spec(ONE_TORN_ENOSPC)
        fio.armed = path == "queued"
        torn = idle_submit(j, 1) if path == "idle" else j.submit(record(1), 1)
        later = []
        if path == "queued":
            assert await asyncio.to_thread(fio.entered.wait, WAIT_S), "the journal never wrote"
            later = [j.submit(record(n), n) for n in (2, 3)]  # queued behind the torn group
            fio.release.set()
        assert isinstance(await outcome(torn), jr.DiskFullError)
        assert fio.faults and fio.written_bytes > 0
        later += [j.submit(record(n), n) for n in (4, 5)]  # after the episode
        assert [await outcome(f) for f in later] == [None] * len(later)
        assert j.failed is None and out.durable == [0, *range(2 if path == "queued" else 4, 6)]
    finally:
        fio.release.set()
        j.close()
    assert replayed(root) == out.durable  # every acknowledged record, and nothing torn


async def test_entries_acknowledged_after_a_torn_disk_full_survive_a_restart(tmp_path: Path) -> None:
    def op(entry_id: int) -> AddOp:
        return AddOp(7, entry_id, KEY, pack_entry(DIGEST, 7, entry_id, entry_id - 1, 0, b"e%d" % entry_id * 50))

    config = StorageConfig(tmp_path / "journal", tmp_path / "ledgers", checkpoint_interval_s=3600,
                           disk_check_interval_s=0.02)
    fio = FaultyFileIO()
    s = await open_storage(config, fileio=fio)
    try:
        assert await s.add_batch([op(0)]) == [Status.OK]
        fio.set_spec(ONE_TORN_ENOSPC)
        assert await s.add_batch([op(1)]) == [Status.READ_ONLY]
        assert fio.faults, "the fault never fired"
        await eventually(lambda: not s.read_only, WAIT_S, what="the disk check sees room again: writable")
        assert await s.add_batch([op(1), op(2)]) == [Status.OK, Status.OK]
        assert await s.add_batch([op(3)]) == [Status.OK]
    finally:
        await s.abandon()  # a crash: what is not checkpointed comes back from the journal
    s = await open_storage(config)
    try:
        assert s.read_range(7, 0, 10, 10, 1 << 20) == [op(i).entry for i in range(4)]
    finally:
        await s.close()
