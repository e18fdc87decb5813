"""The journal drops its synced pages from the page cache (``bookie/page_cache.py``)."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path
from typing import Any

from scriba.bookie import journal as jr
from scriba.bookie.fileio import OsFileIO
from scriba.bookie.page_cache import PAGE_BYTES, PageDrops

STEP = 64 * 1024  # drop step used here
RECORD = 1000  # bytes of each record's body


class Recording(OsFileIO):
    """Real files; remembers each file's bytes written and synced, and every drop asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.written: dict[int, int] = {}
        self.synced: dict[int, int] = {}
        self.drops: list[tuple[int, int, int]] = []  # (file number, offset, length)
        self.unsynced_drops: list[tuple[int, int, int]] = []
        self._file_no: dict[int, int] = {}  # fd -> which file opened (fds are reused)
        self._opened = 0

    def open(self, path: Path, *, create: bool = True) -> int:
        fd = super().open(path, create=create)
        self._file_no[fd] = self._opened
        self._opened += 1
        self.written[fd] = self.synced[fd] = 0
        return fd

    def write(self, fd: int, data: bytes | memoryview) -> None:
        super().write(fd, data)
        self.written[fd] += len(data)

    def writev(self, fd: int, parts: list[bytes]) -> None:
        super().writev(fd, parts)
        self.written[fd] += sum(map(len, parts))

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        self.synced[fd] = self.written[fd]

    def drop_cache(self, fd: int, offset: int, length: int) -> None:
        drop = (self._file_no[fd], offset, length)
        if offset + length > self.synced[fd]:
            self.unsynced_drops.append(drop)
        self.drops.append(drop)
        super().drop_cache(fd, offset, length)


def folder(path: Path) -> Path:
    path.mkdir(exist_ok=True)
    return path


async def write(d: Path, count: int, fio: OsFileIO, **kw: Any) -> None:
    j = jr.Journal(folder(d), fio, asyncio.get_running_loop(), lambda tokens, pos: None, lambda err: None,
                   prealloc_bytes=STEP, drop_cache_bytes=STEP, **kw)
    try:
        for i in range(count):
            await asyncio.wait_for(j.submit(jr.encode_adds([i.to_bytes(8, "big") + bytes(RECORD)]), i), 5)
    finally:
        j.close()


def test_drops_are_whole_pages_below_the_synced_end_in_steps() -> None:
    drops = PageDrops(STEP)
    assert drops.after_sync(STEP - 1) is None  # less than a step synced
    assert drops.after_sync(STEP + 100) == (0, STEP)  # the page holding the end stays
    assert drops.after_sync(STEP + STEP // 2) is None
    assert drops.after_sync(2 * STEP + 5000) == (STEP, STEP + PAGE_BYTES)
    drops.restart()  # a new file
    assert drops.after_sync(STEP) == (0, STEP)
    assert PageDrops(0).after_sync(10 * STEP) is None


async def test_the_journal_drops_what_it_synced_and_only_that(tmp_path: Path) -> None:
    fio = Recording()
    await write(tmp_path, 400, fio, sync_inline_when_idle=False)  # about 400 KiB in one file
    (fd,) = fio.written
    assert fio.drops and not fio.unsynced_drops
    offsets = [(off, length) for _, off, length in fio.drops]
    assert offsets[0][0] == 0
    assert all(a + la == b for (a, la), (b, _) in itertools.pairwise(offsets))  # contiguous, no gaps
    assert all(off % PAGE_BYTES == 0 and length % PAGE_BYTES == 0 for off, length in offsets)
    dropped_to = offsets[-1][0] + offsets[-1][1]
    assert fio.written[fd] - STEP - PAGE_BYTES < dropped_to <= fio.written[fd]
    assert len(list(jr.replay_journal(tmp_path, OsFileIO(), jr.JournalPosition(0, 0)))) == 400


async def test_drops_go_on_across_files_and_skip_inline_writes(tmp_path: Path) -> None:
    """Each file's drops start at its beginning; a lone record written inline (on the loop)
    drops nothing (negative control: the same records through the thread do drop)."""
    fio = Recording()
    await write(tmp_path / "rotating", 600, fio, file_bytes_max=256 * 1024, sync_inline_when_idle=False)
    files = {n for n, _, _ in fio.drops}
    assert len(files) >= 2 and not fio.unsynced_drops
    assert all(any(f == n and off == 0 for f, off, _ in fio.drops) for n in files)
    inline = Recording()
    await write(tmp_path / "inline", 200, inline, sync_inline_when_idle=True)  # one record at a time
    threaded = Recording()
    await write(tmp_path / "threaded", 200, threaded, sync_inline_when_idle=False)
    assert inline.drops == [] and threaded.drops


async def test_a_step_of_zero_keeps_the_pages(tmp_path: Path) -> None:
    fio = Recording()
    j = jr.Journal(tmp_path, fio, asyncio.get_running_loop(), lambda tokens, pos: None, lambda err: None,
                   drop_cache_bytes=0, sync_inline_when_idle=False)
    try:
        for i in range(400):
            await asyncio.wait_for(j.submit(jr.encode_adds([os.urandom(RECORD)]), i), 5)
    finally:
        j.close()
    assert sum(fio.written.values()) > 4 * STEP and fio.drops == []
