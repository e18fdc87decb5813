"""DiskLedgerStorage.read_range a stretch at a time: write-cache runs, index runs read
with one pread, single entries, and the bounds; an entry corrupt at rest ends a range
after the good ones before it (R9: corrupt bytes are never served)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from scriba.bookie import entry_log as el
from scriba.bookie.entry_log import Location
from scriba.bookie.storage import open_storage
from scriba.bookie.storage_api import AddOp, StorageConfig
from scriba.entry import Crc32cDigest, pack_entry
from scriba.errors import CorruptEntryError, NoSuchEntryError, NoSuchLedgerError
from scriba.testing.diskfaults import flip_bit, flip_random_bits

KEY = b"k" * 32
DIGEST = Crc32cDigest()


def op(ledger_id: int, entry_id: int, size: int | None = None) -> AddOp:
    rng = random.Random(ledger_id * 100_003 + entry_id)
    payload = rng.randbytes(size if size is not None else rng.randrange(0, 300))
    return AddOp(ledger_id, entry_id, KEY, pack_entry(DIGEST, ledger_id, entry_id, entry_id - 1, 0, payload))


def config(root: Path) -> StorageConfig:
    return StorageConfig(root / "journal", root / "ledgers", checkpoint_interval_s=3600)


async def flip_in_entry_log(root: Path, ledger_id: int, entry_id: int, at: int, bit: int = 0) -> tuple[Path, Location]:
    """Flip one bit of a stored entry's record in its entry log (``at``: from the record's
    start; the storage under ``root`` must be closed). The log's path and the location."""
    s = await open_storage(config(root))
    try:
        loc = s._index.get(ledger_id, entry_id)
    finally:
        await s.close()
    assert loc is not None, f"entry {entry_id} was expected in an entry log"
    log = root / "ledgers" / "entrylogs" / f"{loc[0]:08x}{el.SUFFIX}"
    if at >= 0:
        flip_bit(log, loc[1] + at, bit)
    return log, loc


async def test_a_range_crosses_entry_logs_singles_and_the_write_cache(tmp_path: Path) -> None:
    s = await open_storage(config(tmp_path))
    try:
        await s.add_batch([op(1, i) for i in range(0, 300)])  # one index run, after the checkpoint
        await s.add_batch([op(1, i) for i in range(310, 299, -1)])  # backwards: out of any run
        await s.checkpoint()
        await s.add_batch([op(1, i) for i in range(311, 400)])  # still in the write cache
        assert s._index.span(1, 0, 1000) is not None and s._index.span(1, 305, 10) is None
        assert s._index.locate(1, 305) is not None and s._index.get(1, 311) is None
        want = [op(1, i).entry for i in range(400)]
        assert s.read_range(1, 0, 399, 1000, 1 << 30) == want
        assert s.read_range(1, 290, 320, 1000, 1 << 30) == want[290:321]
        # entry bounds and byte bounds cut inside any stretch, never below one entry
        for first in (0, 295, 305, 350):
            for count in (1, 3, 17, 200):
                assert s.read_range(1, first, 399, count, 1 << 30) == want[first : first + count]
            for nbytes in (1, 500, 4000):
                got = s.read_range(1, first, 399, 1000, nbytes)
                assert got == want[first : first + len(got)] and len(got) >= 1
                assert len(got) == 1 or sum(map(len, got)) <= nbytes
                if first + len(got) < 400:
                    assert sum(map(len, got)) + len(want[first + len(got)]) > nbytes
        assert s.read_range(1, 390, 1000, 1000, 1 << 30) == want[390:]
        with pytest.raises(NoSuchEntryError):
            s.read_range(1, 400, 410, 10, 1 << 30)
        with pytest.raises(NoSuchLedgerError):
            s.read_range(2, 0, 10, 10, 1 << 30)
    finally:
        await s.close()


async def test_a_range_stops_at_a_gap(tmp_path: Path) -> None:
    s = await open_storage(config(tmp_path))
    try:
        await s.add_batch([op(3, i) for i in [*range(0, 20), *range(25, 40)]])
        await s.checkpoint()
        assert s.read_range(3, 0, 39, 100, 1 << 30) == [op(3, i).entry for i in range(20)]
        assert s.read_range(3, 25, 39, 100, 1 << 30) == [op(3, i).entry for i in range(25, 40)]
    finally:
        await s.close()


@pytest.fixture
async def flushed(tmp_path: Path) -> Path:
    """200 entries of ledger 1 in one entry log and one index run (journal trimmed)."""
    root = tmp_path / "img"
    s = await open_storage(config(root))
    await s.add_batch([op(1, i, size=180) for i in range(200)])
    await s.close()
    return root


async def test_a_corrupt_record_ends_the_range_before_it(flushed: Path) -> None:
    await flip_in_entry_log(flushed, 1, 57, el.REC_HEADER_SIZE + 40, 3)  # in entry 57's payload
    want = [op(1, i, size=180).entry for i in range(200)]
    s = await open_storage(config(flushed))
    try:
        assert s.read_range(1, 0, 199, 1000, 1 << 30) == want[:57]
        with pytest.raises(CorruptEntryError, match="entry 57"):
            s.read_range(1, 57, 199, 1000, 1 << 30)
        assert s.read_range(1, 58, 199, 1000, 1 << 30) == want[58:]
    finally:
        await s.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_bit_flips_in_an_entry_log_are_never_served_by_range_reads(flushed: Path, seed: int) -> None:
    """R9 for range reads: reading on after each refused entry covers the ledger; every
    entry served equals the one written; the flips are noticed."""
    log = sorted((flushed / "ledgers" / "entrylogs").glob("*" + el.SUFFIX))[0]
    flip_random_bits(log, 12, random.Random(seed), start=el.FILE_HEADER_SIZE)
    want = [op(1, i, size=180).entry for i in range(200)]
    rng = random.Random(seed)
    s = await open_storage(config(flushed))
    try:
        refused = 0
        for _ in range(30):
            next_id = rng.randrange(200)
            while next_id < 200:
                try:
                    got = s.read_range(1, next_id, 199, rng.choice([1, 7, 64, 1000]), 1 << 30)
                except CorruptEntryError:
                    refused += 1
                    next_id += 1
                    continue
                assert got == want[next_id : next_id + len(got)], f"corrupt bytes served from {next_id}"
                next_id += len(got)
        assert refused > 0
    finally:
        await s.close()
