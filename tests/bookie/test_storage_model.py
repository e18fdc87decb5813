"""Property: the disk storage behaves like its in-memory twin, across checkpoints,
clean restarts and crashes that drop every byte not fsynced (everything acknowledged
is durable, so a crash between operations must lose nothing)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scriba.bookie.memory_storage import InMemoryLedgerStorage
from scriba.bookie.storage import DiskLedgerStorage, open_storage
from scriba.bookie.storage_api import AddOp, StorageConfig
from scriba.entry import Crc32cDigest, pack_entry
from scriba.errors import ScribaError
from scriba.testing.diskfaults import FaultyFileIO

KEYS = (b"a" * 32, b"b" * 32)
DIGEST = Crc32cDigest()
LEDGERS = (1, 2, 3)
ENTRIES = range(0, 9)

ledger = st.sampled_from(LEDGERS)
key = st.sampled_from((0, 0, 0, 1))
operation = st.one_of(
    st.tuples(st.just("add"), ledger, st.lists(st.sampled_from(ENTRIES), min_size=1, max_size=4),
              key, st.booleans(), st.integers(0, 3)),
    st.tuples(st.just("fence"), ledger, key),
    st.tuples(st.just("lac"), ledger, st.integers(-1, 8), key),
    st.tuples(st.just("delete"), ledger),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("reopen"), st.booleans()),
    st.tuples(st.just("readonly"), st.booleans()),
)


def entry(lid: int, eid: int, tag: int) -> bytes:
    return pack_entry(DIGEST, lid, eid, eid - 1 - tag, 0, b"%d/%d/%d" % (lid, eid, tag) * 3)


async def outcome(coro: Any) -> Any:
    try:
        return await coro
    except ScribaError as exc:
        return type(exc).__name__


def observe(s: Any) -> dict[int, Any]:
    seen: dict[int, Any] = {}
    for lid in LEDGERS:
        try:
            state = s.lac_state(lid)
        except ScribaError as exc:
            seen[lid] = type(exc).__name__
            continue
        reads: list[Any] = []
        for eid in ENTRIES:
            try:
                reads.append(s.read_entry(lid, eid))
            except ScribaError as exc:
                reads.append(type(exc).__name__)
        seen[lid] = (state, reads)
    return seen


async def run(ops: list[tuple[Any, ...]], root: Path) -> None:
    cfg = StorageConfig(root / "j", root / "l", checkpoint_interval_s=3600,
                        entry_log_file_bytes_max=8192, write_cache_bytes_max=8192)
    twin = InMemoryLedgerStorage()
    fio = FaultyFileIO()  # no faults: it only remembers what was fsynced, for crashes
    disk: DiskLedgerStorage = await open_storage(cfg, fileio=fio)
    try:
        for step, o in enumerate(ops):
            kind = o[0]
            if kind == "add":
                _, lid, eids, k, rec, tag = o
                batch = [AddOp(lid, e, KEYS[k], entry(lid, e, tag), rec) for e in eids]
                assert await disk.add_batch(batch) == await twin.add_batch(batch), (step, o)
            elif kind == "fence":
                _, lid, k = o
                assert await outcome(disk.fence(lid, KEYS[k])) == await outcome(
                    twin.fence(lid, KEYS[k])), (step, o)
            elif kind == "lac":
                _, lid, lac, k = o
                assert await outcome(disk.write_lac(lid, lac, KEYS[k])) == await outcome(
                    twin.write_lac(lid, lac, KEYS[k])), (step, o)
            elif kind == "delete":
                await disk.delete_ledgers([o[1]])
                await twin.delete_ledgers([o[1]])
            elif kind == "checkpoint":
                await disk.checkpoint()
            elif kind == "reopen":
                if o[1]:  # crash: drop every byte not fsynced, torn at 512 B
                    await disk.abandon()
                    fio.simulate_crash(tear_bytes=512, seed=step)
                else:
                    await disk.close()
                fio = FaultyFileIO()
                disk = await open_storage(cfg, fileio=fio)
                await twin.set_read_only(False, "")  # operator read-only is not persisted
            elif kind == "readonly":
                await disk.set_read_only(o[1], "test")
                await twin.set_read_only(o[1], "test")
            assert disk.ledger_ids() == twin.ledger_ids(), (step, o)
            assert observe(disk) == observe(twin), (step, o)
    finally:
        await disk.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operation, min_size=1, max_size=25))
def test_disk_storage_matches_twin(ops: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory(prefix="scriba-model-") as tmp:
        asyncio.run(run(ops, Path(tmp)))
