"""R9 at rest in entry logs and the index: a flipped bit is never served as valid."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from test_storage_range_reads import flip_in_entry_log

from scriba.bookie import entry_log as el
from scriba.bookie.storage import open_storage
from scriba.bookie.storage_api import AddOp, StorageConfig
from scriba.entry import Crc32cDigest, pack_entry
from scriba.errors import CorruptEntryError, NoSuchEntryError
from scriba.testing.diskfaults import flip_bit, flip_random_bits

KEY = b"k" * 32
DIGEST = Crc32cDigest()
ENTRIES = 200


def op(entry_id: int) -> AddOp:
    payload = random.Random(entry_id).randbytes(180)
    return AddOp(1, entry_id, KEY, pack_entry(DIGEST, 1, entry_id, entry_id - 1, 0, payload))


def config(root: Path) -> StorageConfig:
    return StorageConfig(root / "journal", root / "ledgers", checkpoint_interval_s=3600)


@pytest.fixture
async def flushed(tmp_path: Path) -> Path:
    """A storage dir whose entries all sit in entry logs + index (journal trimmed)."""
    root = tmp_path / "img"
    s = await open_storage(config(root))
    for b in range(0, ENTRIES, 20):
        await s.add_batch([op(i) for i in range(b, b + 20)])
    await s.close()  # close checkpoints: entries move to the entry log
    return root


async def read_all(root: Path, rounds: int) -> tuple[int, int]:
    """(valid reads, corrupt reads); fails if any read returns bytes that differ."""
    s = await open_storage(config(root))
    good = bad = 0
    try:
        for _ in range(rounds):
            for i in range(ENTRIES):
                try:
                    data = s.read_entry(1, i)
                except CorruptEntryError:
                    bad += 1
                    continue
                assert data == op(i).entry, f"entry {i} served corrupt bytes as valid"
                good += 1
    finally:
        await s.close()
    return good, bad


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_entry_log_bit_flips_never_served(flushed: Path, seed: int) -> None:
    logs = sorted((flushed / "ledgers" / "entrylogs").glob("*" + el.SUFFIX))
    assert logs and logs[0].stat().st_size > ENTRIES * 180
    offsets = flip_random_bits(logs[0], 25, random.Random(seed), start=el.FILE_HEADER_SIZE)
    good, bad = await read_all(flushed, rounds=50)  # 10,000 reads
    assert good + bad == ENTRIES * 50
    assert bad > 0, f"flips at {offsets} went unnoticed"


async def test_every_byte_of_one_record_is_covered(flushed: Path, tmp_path: Path) -> None:
    log, (_, offset, n) = await flip_in_entry_log(flushed, 1, 7, -1)  # (where it is; flips nothing)
    for pos in range(offset, offset + el.REC_HEADER_SIZE + n, 7):
        d = tmp_path / f"b{pos}"
        shutil.copytree(flushed, d)
        flip_bit(d / "ledgers" / "entrylogs" / log.name, pos, pos % 8)
        s = await open_storage(config(d))
        try:
            with pytest.raises(CorruptEntryError):
                s.read_entry(1, 7)
            assert s.read_entry(1, 8) == op(8).entry
        finally:
            await s.close()
        shutil.rmtree(d)


@pytest.mark.parametrize("byte", [3, 6, 10, 11, 14, 15])  # log id, offset (high, low), length
async def test_index_value_flip_detected(tmp_path: Path, byte: int) -> None:
    """A single-entry index value (entries written out of order are indexed one by one)."""
    root = tmp_path / "img"
    s = await open_storage(config(root))
    try:
        for b in range(0, ENTRIES, 20):
            await s.add_batch([op(i) for i in range(b + 19, b - 1, -1)])  # each batch backwards
        await s.checkpoint()
        loc, run_key = s._index.locate(1, 42) or ((0, 0, 0), b"")
    finally:
        await s.close()
    assert run_key is None, "entry 42 was expected out of any run"
    from scriba.bookie.entry_log import LOC

    value = LOC.pack(*loc)
    data_file = root / "ledgers" / "index" / "data.mdb"
    blob = data_file.read_bytes()
    hits = [i for i in range(len(blob)) if blob.startswith(value, i)]
    assert hits, "index value not found in the LMDB file"
    for i in hits:
        flip_bit(data_file, i + byte, byte % 8)
    s = await open_storage(config(root))
    try:
        with pytest.raises(CorruptEntryError):
            s.read_entry(1, 42)
        assert s.read_entry(1, 41) == op(41).entry
        with pytest.raises(NoSuchEntryError):
            s.read_entry(1, ENTRIES + 5)
    finally:
        await s.close()


@pytest.mark.parametrize("byte", [0, 3, 4, 7, 8, 15, 16, 23, 24, 27])  # log, count, offset, stride, crc
async def test_index_run_flip_detected(flushed: Path, byte: int) -> None:
    """A run value (entries flushed in order share one): any flip fails the whole run."""
    s = await open_storage(config(flushed))
    try:
        got = s._index.locate(1, 42)
        assert got is not None and got[1] is not None, "entry 42 was expected in a run"
        with s._index._env.begin(db=s._index._runs) as txn:
            value = bytes(txn.get(got[1]))
        first = s._index.locate(1, 0)
        assert first is not None and first[1] == got[1]  # one run holds them all
    finally:
        await s.close()
    data_file = flushed / "ledgers" / "index" / "data.mdb"
    blob = data_file.read_bytes()
    hits = [i for i in range(len(blob)) if blob.startswith(value, i)]
    assert hits, "run value not found in the LMDB file"
    for i in hits:
        flip_bit(data_file, i + byte, byte % 8)
    good, bad = await read_all(flushed, rounds=1)
    assert (good, bad) == (0, ENTRIES)  # every entry of the run refused, none served wrong


async def test_index_state_flip_refuses_to_open(flushed: Path) -> None:
    data_file = flushed / "ledgers" / "index" / "data.mdb"
    blob = data_file.read_bytes()
    # the ledger state value ends with the master key then its crc
    hits = [i for i in range(len(blob)) if blob.startswith(KEY, i)]
    assert hits
    for i in hits:
        flip_bit(data_file, i + 5, 0)
    with pytest.raises(CorruptEntryError, match="ledger 1 state"):
        await open_storage(config(flushed))


async def test_entries_re_added_after_a_corrupt_run_are_served(flushed: Path) -> None:
    """Re-replication writes entries whose run record was found corrupt: they get their
    own records and read back intact; the corrupt run is kept (not overwritten by a
    shorter one), so the others stay refused as corrupt instead of turning "missing"."""
    s = await open_storage(config(flushed))
    try:
        got = s._index.locate(1, 0)
        assert got is not None and got[1] is not None
        with s._index._env.begin(db=s._index._runs) as txn:
            value = bytes(txn.get(got[1]))
    finally:
        await s.close()
    data_file = flushed / "ledgers" / "index" / "data.mdb"
    blob = data_file.read_bytes()
    for i in [i for i in range(len(blob)) if blob.startswith(value, i)]:
        flip_bit(data_file, i + 9, 1)  # the record offset
    s = await open_storage(config(flushed))
    try:
        with pytest.raises(CorruptEntryError):
            s.read_entry(1, 5)
        assert await s.add_batch([op(i) for i in range(50)]) == [0] * 50  # a part of the run
        await s.checkpoint()
    finally:
        await s.close()
    good, bad = await read_all(flushed, rounds=1)  # the rest: still refused, never "missing"
    assert (good, bad) == (50, ENTRIES - 50)
