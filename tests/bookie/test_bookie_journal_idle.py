"""The journal's idle path: a lone record is synced on the loop itself; load still groups."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from scriba.bookie import journal as jr
from scriba.bookie.fileio import OsFileIO


class SlowSyncIO(OsFileIO):
    """fdatasync takes ``delay_s`` longer (a stalled disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.delay_s = 0.0
        self.sync_threads: list[str] = []

    def fdatasync(self, fd: int) -> None:
        import threading

        self.sync_threads.append(threading.current_thread().name)
        if self.delay_s:
            time.sleep(self.delay_s)  # the disk being slow, not synchronisation
        super().fdatasync(fd)


def open_journal(tmp_path: Path, fio: OsFileIO, durable: list[list[Any]], **kw: Any) -> jr.Journal:
    (tmp_path / "j").mkdir(exist_ok=True)
    return jr.Journal(tmp_path / "j", fio, asyncio.get_running_loop(),
                      lambda tokens, pos: durable.append(tokens), lambda err: None, **kw)


def journal_bytes(tmp_path: Path) -> bytes:
    return b"".join(p.read_bytes() for _, p in jr.journal_files(tmp_path / "j"))


async def test_a_lone_record_is_written_and_synced_before_submit_returns(tmp_path: Path) -> None:
    fio = SlowSyncIO()
    durable: list[list[Any]] = []
    j = open_journal(tmp_path, fio, durable)
    try:
        record = jr.frame(b"\x04" + bytes(16))
        assert record not in journal_bytes(tmp_path)
        fio.sync_threads.clear()
        fut = j.submit(record, "t1")
        assert record in journal_bytes(tmp_path)  # written on the spot ...
        assert fio.sync_threads == [fio_thread()]  # ... and synced on the loop's thread
        assert fut.done() and durable == [["t1"]]  # settled before submit returned: no loop turn
        await asyncio.wait_for(fut, 5)
    finally:
        j.close()


async def test_one_record_a_turn_takes_the_idle_path_the_rest_of_that_turn_queue(tmp_path: Path) -> None:
    """A burst read at once still shares syncs, and a caller submitting in a loop yields."""
    fio = SlowSyncIO()
    durable: list[list[Any]] = []
    j = open_journal(tmp_path, fio, durable)
    try:
        fio.sync_threads.clear()
        first = j.submit(jr.frame(b"\x04" + bytes(16)), "a")
        assert first.done() and durable == [["a"]]  # the journal is idle again now ...
        rest = [j.submit(jr.frame(b"\x04" + bytes(16)), t) for t in ("b", "c")]
        assert not any(f.done() for f in rest)  # ... yet the same turn's next records queue
        await asyncio.wait_for(asyncio.gather(*rest), 5)
        assert fio.sync_threads[0] == fio_thread()
        assert fio.sync_threads[1:] and set(fio.sync_threads[1:]) == {"scriba-journal"}
        assert [t for g in durable for t in g] == ["a", "b", "c"]
        for token in range(50):  # a later turn: the idle path again (once a sync was fast)
            later = j.submit(jr.frame(b"\x04" + bytes(16)), token)
            if later.done():
                break
            await asyncio.wait_for(later, 5)
        assert later.done() and durable[-1] == [token]
    finally:
        j.close()


def fio_thread() -> str:
    import threading

    return threading.current_thread().name


async def test_concurrent_records_go_through_the_writer_thread_in_groups(tmp_path: Path) -> None:
    fio = SlowSyncIO()
    fio.delay_s = 0.001  # a first group on the thread lets the rest pile up behind it
    durable: list[list[Any]] = []
    j = open_journal(tmp_path, fio, durable)
    try:
        futs = [j.submit(jr.frame(b"\x04" + i.to_bytes(16, "big")), i) for i in range(200)]
        await asyncio.wait_for(asyncio.gather(*futs), 10)
        order = [t for group in durable for t in group]
        assert order == list(range(200))  # journal order, every record once
        assert j.groups < 50, f"{j.groups} groups for 200 concurrent records"
        assert fio.sync_threads.count("scriba-journal") >= j.groups - 1
    finally:
        j.close()


async def test_after_a_slow_sync_lone_records_use_the_thread_until_the_disk_is_fast(tmp_path: Path) -> None:
    fio = SlowSyncIO()
    durable: list[list[Any]] = []
    j = open_journal(tmp_path, fio, durable)
    try:
        fio.delay_s = 2 * jr.INLINE_SYNC_S_MAX
        await asyncio.wait_for(j.submit(jr.frame(b"\x04" + bytes(16)), 1), 5)  # inline, but slow
        fio.sync_threads.clear()
        fio.delay_s = 0.0
        await asyncio.wait_for(j.submit(jr.frame(b"\x04" + bytes(16)), 2), 5)
        assert fio.sync_threads == ["scriba-journal"]  # the stall moved writes off the loop
        # fast again: back on the loop (a real sync can itself be slow on a busy machine,
        # so allow a bounded number of tries)
        for token in range(3, 53):
            fio.sync_threads.clear()
            await asyncio.wait_for(j.submit(jr.frame(b"\x04" + bytes(16)), token), 5)
            if fio.sync_threads == [fio_thread()]:
                break
        assert fio.sync_threads == [fio_thread()], "lone records never came back to the loop"
        assert [t for g in durable for t in g] == list(range(1, token + 1))
    finally:
        j.close()


async def test_the_idle_path_can_be_turned_off(tmp_path: Path) -> None:
    fio = SlowSyncIO()
    durable: list[list[Any]] = []
    j = open_journal(tmp_path, fio, durable, sync_inline_when_idle=False)
    try:
        fio.sync_threads.clear()
        await asyncio.wait_for(j.submit(jr.frame(b"\x04" + bytes(16)), 1), 5)
        assert fio.sync_threads == ["scriba-journal"]
    finally:
        j.close()
