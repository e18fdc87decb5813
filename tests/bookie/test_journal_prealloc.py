"""The journal's preallocation: files grown ahead of their records, and what replay makes of the zeros."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import Any

from scriba.bookie import journal as jr
from scriba.bookie.fileio import OsFileIO

STEP = 64 * 1024  # preallocation step used here


class FailingExtend(OsFileIO):
    """Growing a file fails (as a file system that refuses it might); records still write."""

    def __init__(self) -> None:
        super().__init__()
        self.fills = 0

    def extend(self, fd: int, size: int) -> None:
        self.fills += 1
        raise OSError(errno.EFBIG, "file too large (injected)")


def record(i: int, size: int = 1000) -> bytes:
    return jr.encode_adds([i.to_bytes(8, "big") + bytes(size)])


def bodies(records: list[bytes]) -> list[bytes]:
    return [r[jr.REC_HEADER_SIZE:] for r in records]


async def write(d: Path, records: list[bytes], fio: OsFileIO | None = None, **kw: Any) -> None:
    """Journal ``records`` into ``d`` (made already) and stop: its files stay as left."""
    j = jr.Journal(d, fio or OsFileIO(), asyncio.get_running_loop(), lambda tokens, pos: None,
                   lambda err: None, prealloc_bytes=STEP, **kw)
    try:
        for i, rec in enumerate(records):
            await asyncio.wait_for(j.submit(rec, i), 5)
    finally:
        j.close()


def replay(d: Path) -> list[bytes]:
    return [body for _, body, _ in jr.replay_journal(d, OsFileIO(), jr.JournalPosition(0, 0))]


def sizes(d: Path) -> list[int]:
    return [p.stat().st_size for _, p in jr.journal_files(d)]


def folder(path: Path) -> Path:
    path.mkdir()
    return path


def pad_and_copy(d: Path, bad: Path) -> int:
    """Append zeros to ``d``'s first file (as a bookie that stopped leaves its last one);
    copy ``d`` to ``bad`` with one byte of those zeros set. The first file's record end."""
    (_, first), *_ = jr.journal_files(d)
    size = first.stat().st_size
    with first.open("ab") as f:
        f.write(bytes(STEP))
    for _, p in jr.journal_files(d):
        (bad / p.name).write_bytes(p.read_bytes())
    with (bad / first.name).open("r+b") as f:
        f.seek(size + 100)
        f.write(b"\x01")
    return size


async def test_a_journal_file_is_laid_out_ahead_of_its_records(tmp_path: Path) -> None:
    d, k = folder(tmp_path / "j"), folder(tmp_path / "k")
    records = [record(i) for i in range(40)]  # about 40 KiB: within the first step
    await write(d, records)
    assert sizes(d) == [STEP]  # the writes did not grow the file
    await write(k, [record(i) for i in range(100)])  # about 100 KiB: one more step
    assert sizes(k) == [2 * STEP]
    assert replay(d) == bodies(records)
    ends = jr.FILE_HEADER_SIZE + sum(map(len, records))
    assert sizes(d) == [ends]  # replay cut the unused zeros off, quietly: no file set aside
    assert not list(d.glob("*.discarded"))


async def test_a_file_left_for_the_next_keeps_its_records_only(tmp_path: Path) -> None:
    d = folder(tmp_path / "j")
    records = [record(i) for i in range(30)]
    await write(d, records, file_bytes_max=8 * 1024)
    files = sizes(d)
    assert len(files) > 2
    assert all(size < 8 * 1024 for size in files[:-1])  # cut to its records at rotation
    assert replay(d) == bodies(records)


async def test_zeros_end_a_file_and_replay_goes_on_with_the_next(tmp_path: Path) -> None:
    """A file whose records end in zeros only ends there; anything else there is corrupt.
    (Negative control: one byte that is not zero in those zeros sets the later files aside.)"""
    d, bad = folder(tmp_path / "j"), folder(tmp_path / "bad")
    records = [record(i) for i in range(30)]
    await write(d, records, file_bytes_max=8 * 1024)
    size = pad_and_copy(d, bad)

    assert replay(d) == bodies(records)
    assert sizes(d)[0] == size and not list(d.glob("*.discarded"))
    kept = replay(bad)
    assert len(kept) < len(records) and kept == bodies(records[: len(kept)])
    assert list(bad.glob("*.discarded"))


async def test_a_failed_preallocation_falls_back_to_appending(tmp_path: Path) -> None:
    d = folder(tmp_path / "j")
    fio = FailingExtend()
    records = [record(i) for i in range(100)]
    await write(d, records, fio=fio)
    assert fio.fills == 1  # tried once for the file, then appended
    assert sizes(d) == [jr.FILE_HEADER_SIZE + sum(map(len, records))]
    assert replay(d) == bodies(records)
