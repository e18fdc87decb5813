"""Entry-log GC benchmark: disk given back after deletion, and writers while compacting.

    .venv/bin/python benchmarks/bench_compaction.py [--dir DIR] [--ledgers N] [--entries M]
        [--keep-fraction F] [--rate-mib R] [--writer-batches B]

Part 1, space: N ledgers of M 1 KiB entries written interleaved (every entry log holds
every ledger), then all but ``--keep-fraction`` of them deleted. Prints the entry logs'
bytes before and after deletion, after a major pass (live ratio under 0.8: copy the
survivors, remove the logs) and the time it took, then the same with every ledger deleted
(dead logs only: no copying).

Part 2, throughput: three fresh storages get the same backlog of mostly dead logs; on
each one writer appends batches of 64 durable 1 KiB entries (add_batch + a checkpoint
every 16 batches): alone (the baseline), while a compaction pass throttled to
``--rate-mib`` MiB/s runs, and while an unthrottled pass runs (the writer's rate is taken
over the pass's run). Prints each rate and its ratio to the baseline, and the pass's time. One process, one disk: the
figures are relative (and noisy on a shared machine).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from scriba.bookie.compaction import Throttle
from scriba.bookie.storage import DiskLedgerStorage, open_storage
from scriba.bookie.storage_api import AddOp, StorageConfig
from scriba.entry import Crc32cDigest, pack_entry

KEY = b"k" * 32
DIGEST = Crc32cDigest()
PAYLOAD = bytes(range(256)) * 4


def entry(lid: int, eid: int) -> bytes:
    return pack_entry(DIGEST, lid, eid, eid - 1, 0, PAYLOAD[: 1024 - 36])


def log_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "ledgers" / "entrylogs").glob("*.elog"))


def config(root: Path) -> StorageConfig:
    return StorageConfig(root / "journal", root / "ledgers", checkpoint_interval_s=3600,
                         entry_log_file_bytes_max=8 * 1024 * 1024)


async def fill(s: DiskLedgerStorage, ledgers: range, entries: int, per_flush: int = 16) -> None:
    for first in range(0, entries, per_flush):
        ops = [AddOp(lid, e, KEY, entry(lid, e)) for lid in ledgers
               for e in range(first, min(first + per_flush, entries))]
        await s.add_batch(ops)
        await s.checkpoint()  # one flush per round: ledgers interleaved in every log


async def space(root: Path, ledgers: int, entries: int, keep_fraction: float) -> dict[str, Any]:
    s = await open_storage(config(root))
    try:
        ids = range(1, ledgers + 1)
        await fill(s, ids, entries)
        full = log_bytes(root)
        keep = max(1, int(ledgers * keep_fraction))
        await s.delete_ledgers(list(ids)[keep:])
        after_delete = log_bytes(root)
        t0 = time.perf_counter()
        result = await s.compact(0.8)
        major_s = time.perf_counter() - t0
        after_major = log_bytes(root)
        await s.delete_ledgers(list(ids)[:keep])
        t0 = time.perf_counter()
        dead = await s.compact(0.0)
        dead_s = time.perf_counter() - t0
        return {
            "full": full, "after_delete": after_delete, "after_major": after_major,
            "major_s": major_s, "copied": result.bytes_copied, "logs_compacted": result.logs_compacted,
            "after_all": log_bytes(root), "dead_s": dead_s, "logs_removed": dead.logs_removed,
        }
    finally:
        await s.close()


async def writer(s: DiskLedgerStorage, lid: int, batches: int) -> list[float]:
    """When each batch of 64 entries was acknowledged (perf_counter)."""
    done: list[float] = []
    for b in range(batches):
        await s.add_batch([AddOp(lid, b * 64 + i, KEY, entry(lid, b * 64 + i)) for i in range(64)])
        done.append(time.perf_counter())
        if b % 16 == 15:
            await s.checkpoint()
    return done


async def throughput_phase(root: Path, ledgers: int, entries: int, rate_mib: float | None,
                           batches: int) -> dict[str, Any]:
    """One phase on its own storage: the same mostly dead backlog, then the writer, with a
    compaction pass at ``rate_mib`` (0: unthrottled) running meanwhile, or none (None)."""
    s = await open_storage(config(root))
    try:
        ids = range(1, 1 + ledgers)
        await fill(s, ids, entries)
        await s.delete_ledgers(list(ids)[1:])
        backlog = s.stats()["entry_log_bytes"]
        ended: list[float] = []
        compaction = None
        start = time.perf_counter()
        if rate_mib is not None:
            throttle = Throttle(rate_mib * 1024 * 1024, 0, asyncio.get_running_loop().time)
            compaction = asyncio.ensure_future(s.compact(0.8, throttle=throttle))
            compaction.add_done_callback(lambda _: ended.append(time.perf_counter()))
        done = await writer(s, ledgers + 1, batches)
        end = ended[0] if ended else done[-1]  # the writer's rate while the pass ran
        during = sum(1 for t in done if t <= end)
        out = {"rate": during * 64 / (end - start), "backlog": backlog, "pass_s": end - start,
               "scanned": s.stats()["compaction_pass_scanned_bytes"], "finished": bool(ended)}
        if compaction is not None:
            await compaction
        return out
    finally:
        await s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="a dir on the disk to measure")
    ap.add_argument("--ledgers", type=int, default=100)
    ap.add_argument("--entries", type=int, default=400, help="1 KiB entries per ledger")
    ap.add_argument("--keep-fraction", type=float, default=0.05)
    ap.add_argument("--rate-mib", type=float, default=64.0, help="throttled pass, MiB/s scanned")
    ap.add_argument("--writer-batches", type=int, default=400)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        r = asyncio.run(space(Path(d) / "space", args.ledgers, args.entries, args.keep_fraction))
        mib = 1024 * 1024
        print(f"entry logs: {r['full'] / mib:.1f} MiB written; {r['after_delete'] / mib:.1f} MiB after "
              f"deleting {1 - args.keep_fraction:.0%} of the ledgers (deletion alone gives nothing back)")
        print(f"major pass: {r['after_major'] / mib:.2f} MiB left in {r['major_s']:.2f} s "
              f"({r['logs_compacted']} logs compacted, {r['copied'] / mib:.2f} MiB copied)")
        print(f"everything deleted, dead-log pass: {r['after_all']} B left in {r['dead_s'] * 1e3:.0f} ms "
              f"({r['logs_removed']} logs removed)")
        t = {
            name: asyncio.run(throughput_phase(Path(d) / name, args.ledgers, args.entries // 2, rate,
                                               args.writer_batches))
            for name, rate in (("alone", None), ("throttled", args.rate_mib), ("unthrottled", 0.0))
        }
        base = t["alone"]["rate"]
        print(f"writer alone: {base:,.0f} entries/s (baseline; backlog {t['alone']['backlog'] / mib:.1f} MiB, "
              f"95%+ dead)")
        for name in ("throttled", "unthrottled"):
            label = f"{args.rate_mib:g} MiB/s" if name == "throttled" else "an unthrottled"
            r = t[name]
            how = f"in {r['pass_s']:.2f} s" if r["finished"] else "meanwhile (unfinished)"
            print(f"writer while {label} compaction pass runs: {r['rate']:,.0f} entries/s = "
                  f"{r['rate'] / base:.2f}x baseline; the pass scanned {r['scanned'] / mib:.1f} MiB {how}")

if __name__ == "__main__":
    main()
