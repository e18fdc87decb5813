"""Storage micro-benchmark: durable 1 KiB adds through ``add_batch`` vs raw write+fdatasync.

    .venv/bin/python benchmarks/bench_storage.py [--dir DIR] [--entries N] [--inflight K]

Baseline: one 1 KiB record per ``write`` + ``fdatasync`` on the same disk (what a bookie
without group commit could do). Storage: batches of 64 entries, K batches in flight, one
process, journal + write cache + checkpoints as configured by default (the run ends with a
checkpoint, so the flush of every entry is counted). Prints both rates, the ratio, fsyncs,
average group size, add-batch latency percentiles and CPU per entry of each thread (event
loop, flusher, journal writer). ``--with-blob`` hands storage each batch's blob and sizes
as an ``AddRun`` carries them; ``--no-sync-inline`` turns off the journal's idle path.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from scriba.bookie.storage import open_storage
from scriba.bookie.storage_api import AddColumns, AddOp, StorageConfig
from scriba.entry import Crc32cDigest, pack_entry

KEY = b"k" * 32


def thread_cpu() -> dict[int, tuple[float, float]]:
    """User and system CPU seconds of each thread of this process (Linux /proc)."""
    out: dict[int, tuple[float, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        out[int(tid)] = (int(fields[11]) / tick, int(fields[12]) / tick)
    return out


def thread_names() -> dict[int, str]:
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    names[threading.main_thread().native_id or 0] = "event-loop"
    return names


def raw_baseline(path: Path, records: int, per_sync: int = 1) -> tuple[float, float, float]:
    """(records/s, p50 ms, p99 ms) of write(per_sync x 1 KiB) + fdatasync."""
    data = os.urandom(1024 * per_sync)
    records //= per_sync
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    lat: list[float] = []
    try:
        t0 = time.perf_counter()
        for _ in range(records):
            t = time.perf_counter()
            os.write(fd, data)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    lat.sort()
    return records * per_sync / elapsed, lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3


async def storage_run(
    root: Path, entries: int, batch: int, inflight: int, write_cache_mib: int = 64,
    group_wait_ms: float = 1.0, with_blob: bool = False, sync_inline: bool = True,
) -> dict[str, Any]:
    digest = Crc32cDigest()
    payload = os.urandom(1024 - 36)  # 1 KiB packed entries (32 header + 4 digest)
    batches_total = entries // batch
    per_ledger = batches_total // inflight
    # Pre-build the ops: the service builds them from the wire; this measures storage.
    work: list[list[list[AddOp]]] = []
    for w in range(inflight):
        lid = w + 1
        ops = [AddOp(lid, e, KEY, pack_entry(digest, lid, e, e - 1, 0, payload))
               for e in range(per_ledger * batch)]
        work.append([ops[i : i + batch] for i in range(0, len(ops), batch)])
    extra: dict[str, Any] = {"journal_sync_inline_when_idle": sync_inline}
    s = await open_storage(StorageConfig(root / "journal", root / "ledgers",
                                         write_cache_bytes_max=write_cache_mib << 20,
                                         journal_group_wait_ms_max=group_wait_ms, **extra))
    lat: list[float] = []
    failures = 0

    # the service hands storage parallel columns (AddColumns), not AddOp objects
    columns = [[AddColumns.of(b) for b in batches] for batches in work]
    if with_blob:  # as from an AddRun: the entries' blob and sizes come along
        columns = [[AddColumns(c.ledger_ids, c.entry_ids, c.master_keys, c.entries, c.recovery,
                               b"".join(c.entries), [len(e) for e in c.entries]) for c in cols]
                   for cols in columns]

    async def writer(batches: list[AddColumns]) -> None:
        nonlocal failures
        for b in batches:
            t = time.perf_counter()
            statuses = await s.add_columns(b)
            lat.append(time.perf_counter() - t)
            failures += sum(1 for st in statuses if st != 0)

    try:
        t0 = time.perf_counter()
        c0 = time.process_time()
        threads0 = thread_cpu()
        await asyncio.gather(*(writer(b) for b in columns))
        await s.checkpoint()  # the flush of what the run left in the write cache counts too
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
        threads1 = thread_cpu()
        names = thread_names()
        stats = s.journal_stats()
    finally:
        await s.close()
    per_thread: dict[str, tuple[float, float]] = {}
    for tid, (u1, s1) in threads1.items():
        u0, s0 = threads0.get(tid, (0.0, 0.0))
        name = names.get(tid, "other").split("_")[0]
        u, sy = per_thread.get(name, (0.0, 0.0))
        per_thread[name] = (u + u1 - u0, sy + s1 - s0)
    done = per_ledger * batch * inflight
    lat.sort()
    return {
        "entries": done,
        "entries_per_s": done / elapsed,
        "mb_per_s": done * 1024 / elapsed / 1e6,
        "fsyncs": stats["groups"],
        "fsyncs_per_s": stats["groups"] / elapsed,
        "records_per_fsync": stats["records"] / max(1, stats["groups"]),
        "batch_p50_ms": lat[len(lat) // 2] * 1e3,
        "batch_p99_ms": lat[int(len(lat) * 0.99)] * 1e3,
        "batch_mean_ms": statistics.fmean(lat) * 1e3,
        "failures": failures,
        "cpu_s": cpu,
        "entries_per_cpu_s": done / cpu,
        "threads_us_per_entry": {k: (u / done * 1e6, sy / done * 1e6) for k, (u, sy) in per_thread.items()
                                 if u + sy > 0},
    }


async def latency_run(root: Path, adds: int, rate_per_s: float) -> tuple[float, float]:
    """(p50 ms, p99 ms) of single-entry add_batch calls paced at ``rate_per_s``, one writer."""
    digest = Crc32cDigest()
    payload = os.urandom(1024 - 36)
    s = await open_storage(StorageConfig(root / "lat-journal", root / "lat-ledgers"))
    lat: list[float] = []
    try:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for e in range(adds):
            op = AddOp(1, e, KEY, pack_entry(digest, 1, e, e - 1, 0, payload))
            t = time.perf_counter()
            await s.add_batch([op])
            lat.append(time.perf_counter() - t)
            delay = start + (e + 1) / rate_per_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing the load, not synchronisation
    finally:
        await s.close()
    lat.sort()
    return lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="a dir on the disk to measure")
    ap.add_argument("--entries", type=int, default=256_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--inflight", type=int, default=16)
    ap.add_argument("--raw-records", type=int, default=3000)
    ap.add_argument("--write-cache-mib", type=int, default=64)
    ap.add_argument("--group-wait-ms", type=float, default=1.0)
    ap.add_argument("--with-blob", action="store_true",
                    help="hand storage each batch's blob and sizes too (as an AddRun carries them)")
    ap.add_argument("--no-sync-inline", action="store_true",
                    help="journal: never write+sync a lone record on the event loop")
    ap.add_argument("--latency-adds", type=int, default=2000, help="0 to skip")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-storage-") as tmp:
        root = Path(tmp)
        raw_rate, raw_p50, raw_p99 = raw_baseline(root / "raw.bin", args.raw_records)
        print(f"raw write+fdatasync (1 KiB/sync): {raw_rate:,.0f} records/s  "
              f"p50 {raw_p50:.3f} ms  p99 {raw_p99:.3f} ms")
        b_rate, b_p50, b_p99 = raw_baseline(root / "raw.bin", args.raw_records * 64, 64)
        print(f"raw write+fdatasync (64 KiB/sync, the disk's group-commit ceiling): "
              f"{b_rate:,.0f} records/s  p50 {b_p50:.3f} ms  p99 {b_p99:.3f} ms")
        r = asyncio.run(
            storage_run(root, args.entries, args.batch, args.inflight, args.write_cache_mib,
                        args.group_wait_ms, args.with_blob, not args.no_sync_inline)
        )
        print(f"storage add_batch ({args.batch}/batch, {args.inflight} in flight): "
              f"{r['entries_per_s']:,.0f} entries/s  {r['mb_per_s']:.1f} MB/s  "
              f"fsyncs {r['fsyncs']:.0f} ({r['fsyncs_per_s']:,.0f}/s, "
              f"{r['records_per_fsync']:.1f} batches/fsync)  batch p50 {r['batch_p50_ms']:.2f} ms  "
              f"p99 {r['batch_p99_ms']:.2f} ms  failures {r['failures']}")
        print(f"storage CPU: {r['cpu_s']:.2f} s for {r['entries']:,} entries = "
              f"{r['entries_per_cpu_s']:,.0f} entries per CPU-second (all threads; "
              f"the wall rate is lower while other processes share the 2 cores)")
        print("storage CPU per thread (user + sys us/entry): " + ", ".join(
            f"{name} {u:.2f} + {sy:.2f}" for name, (u, sy) in sorted(r["threads_us_per_entry"].items())))
        print(f"ratio storage/ceiling (64 records per fdatasync): {r['entries_per_s'] / b_rate:.2f}x "
              f"(the honest ratio); storage/one-per-sync: {r['entries_per_s'] / raw_rate:.1f}x "
              f"(batched vs unbatched, not like for like)")
        if args.latency_adds:
            p50, p99 = asyncio.run(latency_run(root, args.latency_adds, 1000.0))
            print(f"storage add latency at 1k adds/s (1 entry per add_batch): p50 {p50:.3f} ms  "
                  f"p99 {p99:.3f} ms  (raw fdatasync p99 {raw_p99:.3f} ms)")


if __name__ == "__main__":
    main()
