"""R8/R9 for the journal: cut at every byte offset of the last records, and bit flips.

Replay must yield exactly the complete, intact records before the cut or the flip, never
a partial or corrupt one, and truncate the file there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scriba.bookie import journal as jr
from scriba.bookie.fileio import OsFileIO
from scriba.bookie.journal_format import _records_in
from scriba.bookie.storage import open_storage
from scriba.bookie.storage_api import AddOp, StorageConfig
from scriba.entry import Crc32cDigest, pack_entry
from scriba.errors import NoSuchEntryError, NoSuchLedgerError
from scriba.testing.diskfaults import flip_bit

KEY = b"k" * 32
DIGEST = Crc32cDigest()
RECORDS = 6


def op(entry_id: int) -> AddOp:
    return AddOp(1, entry_id, KEY, pack_entry(DIGEST, 1, entry_id, entry_id - 1, 0, b"p%d" % entry_id))


def config(root: Path) -> StorageConfig:
    return StorageConfig(root / "journal", root / "ledgers", checkpoint_interval_s=3600)


@pytest.fixture(scope="module")
def journal_image(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[int], list[int]]:
    """A storage dir whose journal holds RECORDS add batches (one entry each), unflushed.

    Returns (root, journal file, end offset of every record, end offsets of ADDS records).
    Each batch is journaled as a master-key record followed by its ADDS record.
    """
    import asyncio

    root = tmp_path_factory.mktemp("image")

    async def build() -> None:
        s = await open_storage(config(root))
        for i in range(RECORDS):
            await s.add_batch([op(i)])
        await s.abandon()

    asyncio.run(build())
    files = jr.journal_files(root / "journal")
    path = files[-1][1]
    fio = OsFileIO()
    fd = fio.open(path, create=False)
    try:
        recs = list(_records_in(fio, fd, files[-1][0], jr.FILE_HEADER_SIZE))
    finally:
        fio.close(fd)
    assert [t for t, _, _ in recs] == [jr.MASTER_KEY, jr.ADDS] * RECORDS
    image = path.read_bytes()  # the records, then the zeros preallocated after them
    assert len(image) == config(root).journal_prealloc_bytes
    assert image.count(0, recs[-1][2]) == len(image) - recs[-1][2]
    os.truncate(path, recs[-1][2])  # the tests below cut the records themselves
    ends = [end for _, _, end in recs]
    adds_ends = [end for t, _, end in recs if t == jr.ADDS]
    return root, path.relative_to(root), ends, adds_ends


def entries_from_records(adds_ends: list[int], cut: int) -> int:
    """How many entries are in complete ADDS records below ``cut``."""
    return sum(1 for e in adds_ends if e <= cut)


@pytest.mark.parametrize("zeros", [0, 4096], ids=["appended", "preallocated"])
def test_replay_journal_at_every_cut(
    journal_image: tuple[Path, Path, list[int], list[int]], tmp_path: Path, zeros: int
) -> None:
    """``zeros``: the file goes on with that many zero bytes after the cut, as a
    preallocated file does: a torn record before them is cut all the same."""
    root, rel, ends, _ = journal_image
    start = jr.FILE_HEADER_SIZE
    image = (root / rel).read_bytes()
    for cut in range(start, len(image) + 1):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        (d / rel.name).write_bytes(image[:cut] + bytes(zeros))
        got = list(jr.replay_journal(d, OsFileIO(), jr.JournalPosition(int(rel.stem, 16), start)))
        complete = [e for e in ends if e <= cut]
        assert [p.offset for _, _, p in got] == complete, cut
        assert (d / rel.name).stat().st_size == (complete[-1] if complete else start)


async def test_storage_reopen_at_every_cut_of_last_records(
    journal_image: tuple[Path, Path, list[int], list[int]], tmp_path: Path
) -> None:
    root, rel, ends, adds_ends = journal_image
    first_cut = ends[-5]  # every offset of the last four records (two batches)
    for cut in range(first_cut, ends[-1] + 1):
        d = tmp_path / f"c{cut}"
        shutil.copytree(root, d)
        os.truncate(d / rel, cut)
        s = await open_storage(config(d))
        try:
            n = entries_from_records(adds_ends, cut)
            assert s.lac_state(1).last_entry_id == n - 1, cut
            for i in range(n):
                assert s.read_entry(1, i) == op(i).entry
            for i in range(n, RECORDS):
                with pytest.raises(NoSuchEntryError):
                    s.read_entry(1, i)
        finally:
            await s.close()
        shutil.rmtree(d)


async def test_bit_flip_anywhere_in_a_record_drops_it_and_later_ones(
    journal_image: tuple[Path, Path, list[int], list[int]], tmp_path: Path
) -> None:
    root, rel, ends, adds_ends = journal_image
    target = 2  # the ADDS record of entry 2 (and, separately, the key record before it)
    hi = adds_ends[target]
    lo = ends[ends.index(hi) - 2]  # from the start of its key record
    for offset in range(lo, hi):
        d = tmp_path / f"f{offset}"
        shutil.copytree(root, d)
        flip_bit(d / rel, offset, offset % 8)
        s = await open_storage(config(d))
        try:
            for i in range(target):
                assert s.read_entry(1, i) == op(i).entry
            for i in range(target, RECORDS):
                with pytest.raises(NoSuchEntryError):
                    s.read_entry(1, i)
        finally:
            await s.close()
        shutil.rmtree(d)


async def test_flip_in_master_key_record_loses_the_ledger_not_the_bookie(
    journal_image: tuple[Path, Path, list[int], list[int]], tmp_path: Path
) -> None:
    root, rel, ends, _ = journal_image
    d = tmp_path / "k"
    shutil.copytree(root, d)
    flip_bit(d / rel, ends[0] - 3, 1)
    s = await open_storage(config(d))
    try:
        with pytest.raises(NoSuchLedgerError):
            s.read_entry(1, 0)
        assert s.ledger_ids() == []
        assert any(p.name.endswith(".jnl") for p in (d / "journal").iterdir())
    finally:
        await s.close()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.integers(1, 5))
def test_replay_never_crashes_on_garbage(garbage: bytes, rtype: int) -> None:
    """Whatever follows the valid records (random bytes, or a checksummed but malformed
    body), replay stops cleanly before it and truncates there."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        good = jr.encode_fence(7)
        framed = jr.frame(bytes([rtype]) + garbage)
        for tail in (garbage, framed):
            path = jr.file_name(d, 1)
            path.write_bytes(jr.FILE_HEADER.pack(jr.MAGIC, jr.VERSION, 1) + good + tail)
            got = list(jr.replay_journal(d, OsFileIO(), jr.JournalPosition(1, jr.FILE_HEADER_SIZE)))
            assert got[0][0] == jr.FENCE
            for t, body, _ in got[1:]:  # anything accepted must decode
                if t == jr.ADDS:
                    jr.decode_adds(body)
            for p in d.iterdir():
                p.unlink()
