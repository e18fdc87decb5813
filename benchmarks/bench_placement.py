"""Placement cost per call on a 1,000-bookie, 3-region topology (goal: <= 1 ms per call).

Run: ``.venv/bin/python benchmarks/bench_placement.py [--calls N] [--json]``.
Prints, per policy and quorum shape, the mean / p50 / p99 microseconds of
``new_ensemble`` and of ``replace_bookie`` (on the ensembles just created, with the
failed bookie excluded and 5% of the cluster read-only).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from scriba.ids import BookieId
from scriba.placement import BookieNode, Topology, make_policy

CASES: list[tuple[str, int, int, int]] = [
    ("random", 3, 2, 2),
    ("rack-aware", 3, 2, 2),
    ("rack-aware", 5, 3, 2),
    ("zone-aware", 3, 3, 2),
    ("zone-aware", 6, 3, 2),
    ("region-aware", 3, 3, 3),
    ("region-aware", 6, 3, 3),
]


def build_topology(bookies: int = 1000, regions: int = 3, zones: int = 3, racks: int = 8,
                   seed: int = 1) -> Topology:
    rng = random.Random(seed)
    nodes = []
    for i in range(bookies):
        r, z, k = i % regions, (i // regions) % zones, (i // (regions * zones)) % racks
        nodes.append(BookieNode.at(f"bk{i:04d}", f"/region{r}/zone{z}/rack{k}",
                                   writable=rng.random() > 0.05,
                                   free_bytes=rng.randrange(50, 150) << 30))
    return Topology.from_nodes(nodes)


def _stats(samples_s: list[float]) -> dict[str, float]:
    us = sorted(s * 1e6 for s in samples_s)
    return {"mean_us": round(statistics.fmean(us), 1), "p50_us": round(us[len(us) // 2], 1),
            "p99_us": round(us[min(len(us) - 1, int(len(us) * 0.99))], 1)}


def run(calls: int) -> list[dict[str, Any]]:
    topology = build_topology()
    out = []
    for name, e, w, a in CASES:
        policy = make_policy(name, rng=random.Random(7))
        new_t: list[float] = []
        ensembles = []
        cpu0 = time.thread_time()
        for _ in range(calls):
            t0 = time.perf_counter()
            result = policy.new_ensemble(topology, e, w, a)
            new_t.append(time.perf_counter() - t0)
            ensembles.append(result.bookies)
        new_cpu = (time.thread_time() - cpu0) / calls
        rep_t: list[float] = []
        rng = random.Random(3)
        cpu0 = time.thread_time()
        for ensemble in ensembles:
            i = rng.randrange(e)
            t0 = time.perf_counter()
            policy.replace_bookie(topology, ensemble, i, w, a, exclude={BookieId(ensemble[i])})
            rep_t.append(time.perf_counter() - t0)
        rep_cpu = (time.thread_time() - cpu0) / calls
        out.append({"policy": name, "E": e, "W": w, "A": a, "bookies": len(topology),
                    "new_ensemble": {**_stats(new_t), "cpu_mean_us": round(new_cpu * 1e6, 1)},
                    "replace_bookie": {**_stats(rep_t), "cpu_mean_us": round(rep_cpu * 1e6, 1)}})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = run(args.calls)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("wall-clock mean/p50/p99 and CPU mean, microseconds per call")
    print(f"{'policy':<13} {'E/W/A':<7} {'new_ensemble':>30} {'replace_bookie':>32}")
    for row in rows:
        n, r = row["new_ensemble"], row["replace_bookie"]
        print(f"{row['policy']:<13} {row['E']}/{row['W']}/{row['A']:<3} "
              f"{n['mean_us']:>8}/{n['p50_us']:>7}/{n['p99_us']:>7} cpu {n['cpu_mean_us']:>6} "
              f"{r['mean_us']:>9}/{r['p50_us']:>7}/{r['p99_us']:>7} cpu {r['cpu_mean_us']:>6}")


if __name__ == "__main__":
    main()
