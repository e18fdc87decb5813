"""Benchmark: the journal dropping its synced pages from the page cache, on and off, in one run.

Two clusters of 3 bookie processes on one etcd (their own prefixes): one with the
default (``journal_drop_cache_bytes``, 1 MiB steps), one with it off (``=0``). ``scriba
bench`` (E3/W3/A2, 1 KiB, 1,000 in flight) runs against each in turn, ``--rounds``
times, the order flipping every round. The bookies' data stays between rounds, so the
page cache grows through the run as it does under a steady load: what the drop is for
(``bookie/page_cache.py``). Prints per round the rate, the bookies' CPU per entry and
their system part, then the ratios on / off per round and their medians.

Run: ``.venv/bin/python benchmarks/bench_journal_page_cache.py [--rounds 10] [--seconds 3] [--json OUT]``.
Not a timed test: 2 shared cores, so compare the ratios of one run, not runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench_tls import bench
from proc_cpu import pids_cpu_s

from scriba.embedded.bookie import BookieProcess
from scriba.embedded.etcd import EtcdCluster

SIDES: dict[str, list[str]] = {"drop": [], "keep": ["--storage-option", "journal_drop_cache_bytes=0"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--inflight", type=int, default=1000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in SIDES}
    with tempfile.TemporaryDirectory(prefix="bench-jpc-") as tmp:
        base = Path(tmp)
        etcd = EtcdCluster(base / "etcd", 1)
        etcd.start()
        bookies = {name: [BookieProcess(base / f"{name}-{i}", etcd.uri(name), bookie_id=f"{name}-{i}",
                                        extra_args=extra) for i in range(3)] for name, extra in SIDES.items()}
        try:
            for side in bookies.values():
                for b in side:
                    b.start()
            for round_no in range(args.rounds):
                for name in list(SIDES) if round_no % 2 == 0 else list(SIDES)[::-1]:
                    pids = [b.pid for b in bookies[name] if b.pid is not None]
                    sys_before = pids_cpu_s(pids, system_only=True)
                    run = bench(etcd.uri(name), None, seconds=args.seconds, entries=None,
                                inflight=args.inflight, bookie_pids=pids)
                    row = {"entries_per_s": run["entries_per_s"], "bookie_cpu_us_per_entry": run["bookie_cpu_us_per_entry"],
                           "bookie_system_us_per_entry": round(1e6 * (pids_cpu_s(pids, system_only=True) - sys_before) / run["entries"], 2)}
                    rows[name].append(row)
                    print(f"round {round_no} {name}: {row}", flush=True)
        finally:
            for side in bookies.values():
                for b in side:
                    b.stop()
            etcd.stop()
    summary: dict[str, Any] = {"rounds": rows}
    for key in ("entries_per_s", "bookie_cpu_us_per_entry", "bookie_system_us_per_entry"):
        ratios = [on[key] / off[key] for on, off in zip(rows["drop"], rows["keep"], strict=True) if off[key]]
        summary[f"{key}_ratio_drop_over_keep"] = {"per_round": [round(r, 3) for r in ratios],
                                                  "median": round(statistics.median(ratios), 3)}
    summary["settings"] = {"rounds": args.rounds, "seconds": args.seconds, "inflight": args.inflight}
    print(json.dumps({k: v for k, v in summary.items() if k != "rounds"}, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
