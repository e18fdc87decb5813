"""Benchmark: the journal's preallocation, on and off in the same run (issue #13's commit path).

Three processes (three bookies' journals on one file system, as in the sandbox and the RSM
benchmarks) each run a real ``scriba.bookie.journal.Journal`` and submit one 1 KiB ADDS
record at a time, each awaited until durable (the idle path: write + ``fdatasync`` on the
loop, as a lone add takes). Rounds alternate ``prealloc_bytes=0`` (every group's write
grows the file, so every sync also commits a size change) and the default (the file grown
ahead of its records), which side goes first flipping each round. Prints each round's p50,
p90, p99 of submit -> durable over the three processes, then the medians and the ratios
preallocated / not.

Run: ``.venv/bin/python benchmarks/bench_journal_prealloc.py [--records 1500] [--rounds 4] [--dir DIR]``.
Not a timed test: the disk and 2 shared cores vary; compare the two sides of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from scriba.bookie import journal as jr
from scriba.bookie.fileio import OsFileIO
from scriba.bookie.storage_api import StorageConfig
from scriba.client.bench import percentile

PROCESSES = 3
DEFAULT_PREALLOC = StorageConfig(Path("j"), Path("l")).journal_prealloc_bytes


async def _submit_all(d: Path, prealloc: int, records: int, barrier: Any) -> list[float]:
    journal = jr.Journal(d, OsFileIO(), asyncio.get_running_loop(), lambda tokens, pos: None,
                         lambda err: None, prealloc_bytes=prealloc)
    record = jr.encode_adds([bytes(1024)])
    out: list[float] = []
    try:
        barrier.wait()
        for i in range(records):
            t0 = time.perf_counter()
            await journal.submit(record, i)
            out.append((time.perf_counter() - t0) * 1000)
    finally:
        journal.close()
    return out


def _worker(d: str, prealloc: int, records: int, barrier: Any, results: Any) -> None:
    results.put(asyncio.run(_submit_all(Path(d), prealloc, records, barrier)))


def one_side(base: Path, prealloc: int, records: int) -> dict[str, float]:
    barrier = mp.Barrier(PROCESSES)
    results: Any = mp.Queue()
    dirs = [Path(tempfile.mkdtemp(prefix=f"j{prealloc}-", dir=base)) for _ in range(PROCESSES)]
    procs = [mp.Process(target=_worker, args=(str(d), prealloc, records, barrier, results)) for d in dirs]
    for p in procs:
        p.start()
    latencies = sorted(ms for _ in procs for ms in results.get(timeout=600))
    for p in procs:
        p.join(timeout=60)
    return {"p50": round(percentile(latencies, 0.50), 3), "p90": round(percentile(latencies, 0.90), 3),
            "p99": round(percentile(latencies, 0.99), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--records", type=int, default=1500, help="per process and round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--dir", type=Path, default=None, help="a dir on the disk to measure")
    args = ap.parse_args()
    sides = {"appending": 0, "preallocated": DEFAULT_PREALLOC}
    rounds: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
    with tempfile.TemporaryDirectory(prefix="bench-jprealloc-", dir=args.dir) as tmp:
        for i in range(args.rounds):
            for name in (sides if i % 2 == 0 else reversed(list(sides))):
                rounds[name].append(one_side(Path(tmp), sides[name], args.records))
                print(i, name, rounds[name][-1], flush=True)
    medians = {k: {q: round(statistics.median(r[q] for r in v), 3) for q in ("p50", "p90", "p99")}
               for k, v in rounds.items()}
    ratios = {q: [round(b[q] / a[q], 3) for a, b in zip(rounds["appending"], rounds["preallocated"], strict=True)]
              for q in ("p50", "p99")}
    print(json.dumps({"processes": PROCESSES, "records_per_process": args.records, "medians_ms": medians,
                      "preallocated_over_appending_per_round": ratios}, indent=1))


if __name__ == "__main__":
    main()
