"""R10/R11 and crashes through the fault-injecting file layer (and a real full tmpfs).

- fsync EIO / write EIO: no add is acknowledged after the error; the storage is read-only
  for good and says why; reads of acknowledged entries keep working.
- ENOSPC (injected, and a real size-capped tmpfs): read-only, reads work, nothing
  acknowledged is lost; writable again once usage drops under the low-water mark.
- Crash (drop bytes not fsynced, torn at 512 B / 4 KiB): every acknowledged entry is
  readable with identical bytes after reopening. Negative control: with fsync skipped
  the same check finds losses.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from scriba.bookie.fileio import OsFileIO, default_fileio
from scriba.bookie.storage import DiskLedgerStorage, open_storage
from scriba.bookie.storage_api import AddOp, StorageConfig
from scriba.entry import Crc32cDigest, pack_entry
from scriba.errors import NoSuchEntryError, NoSuchLedgerError, Status, StorageError
from scriba.testing.diskfaults import FaultyFileIO
from scriba.testing.waiting import eventually

KEY = b"k" * 32
DIGEST = Crc32cDigest()


def op(ledger_id: int, entry_id: int, size: int = 200) -> AddOp:
    payload = (b"%d/%d;" % (ledger_id, entry_id) * (size // 4 + 1))[:size]
    return AddOp(ledger_id, entry_id, KEY, pack_entry(DIGEST, ledger_id, entry_id, entry_id - 1, 0, payload))


def config(root: Path, **kw: object) -> StorageConfig:
    return StorageConfig(root / "journal", root / "ledgers", checkpoint_interval_s=3600, **kw)  # type: ignore[arg-type]


class Load:
    """Concurrent writers of 8-entry batches. Each batch's statuses are recorded with whether
    it was *submitted* after a failure had already been answered to some writer."""

    def __init__(self, storage: DiskLedgerStorage, writers: int = 8, batches: int = 40) -> None:
        self.storage = storage
        self.writers = writers
        self.batches = batches
        self.acked: dict[tuple[int, int], bytes] = {}
        self.completions: list[tuple[bool, Status]] = []  # (submitted after a failure, status)
        self.failure_seen = False

    async def writer(self, lid: int) -> None:
        for b in range(self.batches):
            ops = [op(lid, b * 8 + i) for i in range(8)]
            after_failure = self.failure_seen
            statuses = await self.storage.add_batch(ops)
            for o, st in zip(ops, statuses, strict=True):
                self.completions.append((after_failure, st))
                if st == Status.OK:
                    self.acked[(o.ledger_id, o.entry_id)] = o.entry
                else:
                    self.failure_seen = True

    async def run(self) -> None:
        await asyncio.gather(*(self.writer(100 + w) for w in range(self.writers)))


def assert_no_ok_after_first_failure(completions: list[tuple[bool, Status]]) -> None:
    """Nothing submitted after a failure was answered is acknowledged (no retried-and-acked
    fsync). Batches already in flight may still complete either way, in any order: one that
    was durable before the failure can resume after a writer that saw the failure."""
    assert any(st != Status.OK for _, st in completions), "the fault never surfaced"
    late = [st for after, st in completions if after]
    assert late, "no batch was submitted after the failure: the check saw nothing"
    assert all(st != Status.OK for st in late), "an add submitted after the error was acked"


@pytest.mark.parametrize("fault", [
    {"fsync_eio_after": 25},
    {"eio_on_write": True},
    {"fsync_eio": True, "faults_max": 1},  # one-shot: the next fdatasync would succeed
    {"eio_on_write": True, "torn_write_bytes": 100, "faults_max": 1},  # a short write, then EIO, once
], ids=["fsync_eio_after", "eio_on_write", "fsync_eio_once", "torn_write_eio_once"])
async def test_disk_error_stops_acks_and_goes_read_only(tmp_path: Path, fault: dict[str, object]) -> None:
    fio = FaultyFileIO()
    s = await open_storage(config(tmp_path), fileio=fio)
    events: list[tuple[bool, str]] = []
    s.add_state_listener(lambda ro, why: events.append((ro, why)))
    try:
        assert await s.add_batch([op(1, 0)]) == [Status.OK]
        fio.set_spec({**fault, "path_contains": ".jnl"})
        load = Load(s)
        await load.run()
        assert_no_ok_after_first_failure(load.completions)
        assert s.read_only and "journal" in s.read_only_reason
        assert events and events[0][0] is True
        assert await s.add_batch([op(1, 1)]) == [Status.STORAGE]
        with pytest.raises(StorageError):
            await s.fence(1, KEY)
        fio.set_spec({})  # the disk "recovers": still no acks (never retried-and-acked)
        assert await s.add_batch([op(1, 2)]) == [Status.STORAGE]
        assert s.read_entry(1, 0) == op(1, 0).entry
        for (lid, eid), data in load.acked.items():
            assert s.read_entry(lid, eid) == data
    finally:
        await s.close()
    s = await open_storage(config(tmp_path))
    try:
        assert not s.read_only
        for (lid, eid), data in load.acked.items():
            assert s.read_entry(lid, eid) == data
    finally:
        await s.close()


async def test_injected_enospc_read_only_then_writable_again(tmp_path: Path) -> None:
    fio = FaultyFileIO()
    s = await open_storage(config(tmp_path, disk_check_interval_s=0.05), fileio=fio)
    try:
        assert await s.add_batch([op(2, 0)]) == [Status.OK]
        fio.set_spec({"enospc": True})
        assert await s.add_batch([op(2, 1)]) == [Status.READ_ONLY]
        assert s.read_only and "disk full" in s.read_only_reason
        assert s.read_entry(2, 0) == op(2, 0).entry
        fio.set_spec({})
        await eventually(lambda: not s.read_only, 5.0, what="the storage writable again")  # the periodic usage check clears it
        assert await s.add_batch([op(2, 1)]) == [Status.OK]
    finally:
        await s.close()
    s = await open_storage(config(tmp_path))
    try:
        assert s.read_range(2, 0, 10, 10, 1 << 20) == [op(2, 0).entry, op(2, 1).entry]
    finally:
        await s.close()


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs: scriba.testing.tmpfs when present, else mounted here."""
    try:
        from scriba.testing import tmpfs
    except ImportError:
        tmpfs = None  # type: ignore[assignment]
    if tmpfs is not None:
        reason = tmpfs.unavailable_reason()
        if reason is not None:
            pytest.skip(reason)
        with tmpfs.size_capped_tmpfs(8 * 1024 * 1024, parent=tmp_path) as mnt:
            yield mnt
        return
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


async def test_real_disk_full_on_tmpfs(small_tmpfs: Path) -> None:
    filler = small_tmpfs / "filler"
    filler.write_bytes(b"\0" * (4 * 1024 * 1024))
    cfg = config(small_tmpfs, index_map_size_bytes=1 << 24, disk_check_interval_s=0.05,
                 write_cache_bytes_max=1 << 20)
    s = await open_storage(cfg)
    acked: dict[int, bytes] = {}
    try:
        eid = 0
        for _ in range(400):
            ops = [op(3, eid + i, size=16 * 1024) for i in range(4)]
            statuses = await s.add_batch(ops)
            for o, st in zip(ops, statuses, strict=True):
                if st == Status.OK:
                    acked[o.entry_id] = o.entry
            eid += 4
            if any(st != Status.OK for st in statuses):
                break
        assert s.read_only, "never went read-only on a full disk"
        assert Status.STORAGE not in statuses, "disk full must not count as a disk failure"
        assert len(acked) > 10
        for e, data in acked.items():  # reads keep working
            assert s.read_entry(3, e) == data
        filler.unlink()
        await eventually(lambda: not s.read_only, 5.0, what="the storage writable again")
        assert await s.add_batch([op(3, eid + 100)]) == [Status.OK]
        acked[eid + 100] = op(3, eid + 100).entry
    finally:
        await s.close()
    s = await open_storage(cfg)
    try:
        for e, data in acked.items():
            assert s.read_entry(3, e) == data
    finally:
        await s.close()


async def run_until_crash(s: DiskLedgerStorage, fio: FaultyFileIO, ack_target: int) -> tuple[dict[tuple[int, int], bytes], dict[str, int]]:
    """Run a load, 'crash' once ``ack_target`` entries are acked: (acked, crash point)."""
    load = Load(s, writers=6, batches=400)
    task = asyncio.ensure_future(load.run())
    await eventually(lambda: len(load.acked) >= ack_target or task.done(), 30.0,
                     what=f"{ack_target} entries acknowledged (or the load ended)")
    acked = dict(load.acked)  # first the acks, then the durable sizes: point covers acks
    point = fio.crash_point()
    # let the writers put bytes past the crash point: those are what the crash drops
    await eventually(lambda: any(os.path.getsize(p) > n for p, n in point.items()
                                 if os.path.exists(p)) or task.done(), 10.0,
                     what="bytes written past the crash point (or the load ended)")
    await s.abandon()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return acked, point


@pytest.mark.parametrize(("tear", "seed"), [(None, 1), (512, 2), (4096, 3), (512, 4)])
async def test_crash_drops_unsynced_bytes_but_no_ack(tmp_path: Path, tear: int | None, seed: int) -> None:
    fio = FaultyFileIO()
    s = await open_storage(config(tmp_path), fileio=fio)
    await s.add_batch([op(9, i) for i in range(50)])
    await s.checkpoint()  # some entries in entry logs + index, the rest only in the journal
    acked, point = await run_until_crash(s, fio, 500 + 100 * seed)
    dropped = fio.simulate_crash(tear_bytes=tear, seed=seed, point=point)
    assert dropped, "nothing was in flight at the crash point"
    s = await open_storage(config(tmp_path), fileio=OsFileIO())
    try:
        assert s.read_range(9, 0, 49, 100, 1 << 20) == [op(9, i).entry for i in range(50)]
        for (lid, eid), data in acked.items():
            assert s.read_entry(lid, eid) == data, (lid, eid, dropped)
    finally:
        await s.close()


async def test_negative_control_ack_before_fsync_loses_entries(tmp_path: Path) -> None:
    fio = FaultyFileIO({"skip_fsync": True, "path_contains": ".jnl"})
    s = await open_storage(config(tmp_path), fileio=fio)
    acked, point = await run_until_crash(s, fio, 200)
    fio.simulate_crash(point=point)
    s = await open_storage(config(tmp_path), fileio=OsFileIO())
    try:
        lost = 0
        for (lid, eid), data in acked.items():
            try:
                lost += s.read_entry(lid, eid) != data
            except (NoSuchEntryError, NoSuchLedgerError):
                lost += 1
        assert lost > 0, "the crash check cannot see losses: the test proves nothing"
    finally:
        await s.close()


def test_env_selects_fault_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCRIBA_DISK_FAULTS", raising=False)
    assert type(default_fileio()) is OsFileIO
    monkeypatch.setenv("SCRIBA_DISK_FAULTS", '{"fsync_eio_after": 1}')
    fio = default_fileio()
    assert isinstance(fio, FaultyFileIO)
    fd = fio.open(tmp_path / "f")
    try:
        fio.write(fd, b"x")
        fio.fdatasync(fd)
        with pytest.raises(OSError, match="injected fsync_eio"):
            fio.fdatasync(fd)
    finally:
        fio.close(fd)
    control = tmp_path / "control.json"
    control.write_text("{}")
    monkeypatch.setenv("SCRIBA_DISK_FAULTS", f"@{control}")
    fio = default_fileio()
    fd = fio.open(tmp_path / "g")
    try:
        fio.write(fd, b"y")
        control.write_text('{"eio_on_write": true}')
        os.utime(control, ns=(1, 1))  # a new mtime even within the clock's granularity
        with pytest.raises(OSError, match="injected write_eio"):
            fio.write(fd, b"z")
    finally:
        fio.close(fd)


async def test_usage_threshold_hysteresis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import collections
    import shutil as real_shutil

    from scriba.bookie import storage as storage_mod

    Usage = collections.namedtuple("Usage", "total used free")
    used = {"fraction": 0.5}
    checked = {"times": 0}
    real = real_shutil.disk_usage

    def fake_usage(path: object) -> Usage:
        checked["times"] += 1
        total = 1000 * 1000
        u = int(total * used["fraction"])
        return Usage(total, u, total - u) if str(path).startswith(str(tmp_path)) else real(path)  # type: ignore[arg-type]

    monkeypatch.setattr(storage_mod.shutil, "disk_usage", fake_usage)
    s = await open_storage(config(tmp_path, disk_check_interval_s=0.02))
    events: list[tuple[bool, str]] = []
    s.add_state_listener(lambda ro, why: events.append((ro, why)))
    try:
        assert await s.add_batch([op(5, 0)]) == [Status.OK]
        used["fraction"] = 0.97
        await eventually(lambda: s.read_only, 5.0, what="the storage read-only")
        assert "disk usage" in s.read_only_reason
        assert await s.add_batch([op(5, 1)]) == [Status.READ_ONLY]
        assert s.read_entry(5, 0) == op(5, 0).entry
        used["fraction"] = 0.92  # between the low-water mark and the threshold: stays
        checks = s.stats()["read_only"]
        seen = checked["times"]  # several disk checks run (asserting nothing changes)
        await eventually(lambda: checked["times"] >= seen + 5, 5.0, what="five more disk checks ran")
        assert s.read_only and checks == 1
        used["fraction"] = 0.5
        await eventually(lambda: not s.read_only, 5.0, what="the storage writable again")
        assert await s.add_batch([op(5, 1)]) == [Status.OK]
        assert [ro for ro, _ in events] == [True, False]
        free, total = s.disk_usage()
        assert (free, total) == (500_000, 1_000_000)
    finally:
        await s.close()


CHILD = r"""
import asyncio, sys
from pathlib import Path
from scriba.bookie.storage import open_storage
from scriba.bookie.storage_api import AddOp, StorageConfig
from scriba.entry import Crc32cDigest, pack_entry

root = Path(sys.argv[1])
digest = Crc32cDigest()

async def writer(s, lid):
    for b in range(100000):
        ops = [AddOp(lid, b * 8 + i, b"k" * 32,
                     pack_entry(digest, lid, b * 8 + i, -1, 0, b"%d/%d" % (lid, b * 8 + i) * 20))
               for i in range(8)]
        st = await s.add_batch(ops)
        if all(x == 0 for x in st):
            sys.stdout.write(f"ACK {lid} {b * 8}\n")
            sys.stdout.flush()

async def main():
    s = await open_storage(StorageConfig(root / "journal", root / "ledgers",
                                         write_cache_bytes_max=256 * 1024))
    await asyncio.gather(*(writer(s, lid) for lid in (1, 2, 3, 4)))

asyncio.run(main())
"""


@pytest.mark.parametrize("tear", [None, 4096])
async def test_sigkill_child_then_drop_unsynced_bytes(tmp_path: Path, tear: int | None) -> None:
    import json
    import signal
    import sys

    from scriba.testing.diskfaults import apply_crash_state

    state = tmp_path / "crash_state.json"
    env = {**os.environ, "SCRIBA_DISK_FAULTS": json.dumps({"crash_state": str(state)})}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(tmp_path), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )
    acked: list[tuple[int, int]] = []
    try:
        assert proc.stdout is not None
        while len(acked) < 400:
            line = await asyncio.wait_for(proc.stdout.readline(), 30.0)
            assert line, "child exited early"
            if not line.startswith(b"ACK "):
                continue  # log lines
            lid, first = map(int, line.split()[1:])
            acked += [(lid, first + i) for i in range(8)]
    finally:
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 30.0)
    dropped = apply_crash_state(state, tear_bytes=tear, seed=7)
    s = await open_storage(config(tmp_path), fileio=OsFileIO())
    try:
        for lid, eid in acked:
            data = s.read_entry(lid, eid)
            assert data == pack_entry(DIGEST, lid, eid, -1, 0, b"%d/%d" % (lid, eid) * 20)
    finally:
        await s.close()
    assert isinstance(dropped, dict)


async def test_ledger_key_survives_a_failed_first_record(tmp_path: Path) -> None:
    fio = FaultyFileIO()
    s = await open_storage(config(tmp_path, disk_check_interval_s=0.02), fileio=fio)
    fio.set_spec({"enospc": True})
    assert await s.add_batch([op(30, 0)]) == [Status.READ_ONLY]  # the ledger's first record
    fio.set_spec({})
    await eventually(lambda: not s.read_only, 5.0, what="the storage writable again")
    assert await s.add_batch([op(30, 1)]) == [Status.OK]
    await s.abandon()  # replay from the journal alone
    s = await open_storage(config(tmp_path))
    try:
        assert s.ledger_master_key(30) == KEY
        assert s.read_entry(30, 1) == op(30, 1).entry
        assert await s.add_batch([op(30, 2)]) == [Status.OK]
    finally:
        await s.close()


async def test_entry_log_fsync_error_fails_the_storage(tmp_path: Path) -> None:
    fio = FaultyFileIO()
    s = await open_storage(config(tmp_path), fileio=fio)
    try:
        assert await s.add_batch([op(60, i) for i in range(10)]) == [Status.OK] * 10
        fio.set_spec({"fsync_eio": True, "path_contains": ".elog"})
        await s.checkpoint()
        assert s.read_only and "checkpoint failed" in s.read_only_reason
        assert await s.add_batch([op(60, 10)]) == [Status.STORAGE]
        assert s.read_range(60, 0, 9, 100, 1 << 20) == [op(60, i).entry for i in range(10)]
    finally:
        await s.close()
    s = await open_storage(config(tmp_path))  # the journal still holds every acked entry
    try:
        assert s.read_range(60, 0, 10, 100, 1 << 20) == [op(60, i).entry for i in range(10)]
    finally:
        await s.close()
