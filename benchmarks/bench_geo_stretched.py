"""Benchmark: confirm latency of a stretched cluster's ledger against one inter-region round trip.

Six bookie processes (``scriba.testing.cluster.LocalCluster``, real etcd) in three regions,
two each; the client is taken to run in ``region-1``, and the bookies of ``region-2`` and
``region-3`` are reached through the fault proxy with ``--latency-ms`` each way
(``scriba.embedded.fault_proxy.RegionLatency``, what ``scriba sandbox
--inter-region-latency-ms`` uses). One ledger ``placement="region-aware"``,
``min_regions_for_durability=2``, E=W=4, A=3 (every ack quorum spans two regions, so each
confirmation needs a remote bookie), one append in flight at a time.

The baseline is the same ledger in the same run with the proxies' latency set to 0; the
figure is ``overhead_ms = p50(latency) - p50(0) - 2 * latency_ms`` (what confirming costs
beyond one inter-region round trip; the issue's goal is <= 1.5 ms).

Run: ``.venv/bin/python benchmarks/bench_geo_stretched.py [--latency-ms 5] [--appends 300] [--json]``.
Not a timed test: the machine has 2 cores shared by every process, so figures vary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from scriba.client.bench import percentile
from scriba.client.client import Client
from scriba.embedded.fault_proxy import RegionLatency
from scriba.testing.cluster import LocalCluster

REGIONS = ["region-1", "region-2", "region-3"]


async def confirm_latencies(writer: Any, appends: int) -> list[float]:
    out: list[float] = []
    payload = b"x" * 100
    for _ in range(appends):
        t0 = time.perf_counter()
        await writer.append(payload)
        out.append((time.perf_counter() - t0) * 1000)
    return out


async def measure(uri: str, latency: RegionLatency, latency_ms: int, appends: int) -> dict[str, Any]:
    async with Client.connect(uri, placement="region-aware",
                              placement_options={"min_regions_for_durability": 2}) as client:
        writer = await client.create_ledger(4, 4, 3)
        rows: dict[str, Any] = {"ensemble": list(writer.metadata.current_ensemble)}
        for injected in (0, latency_ms):
            latency.set_latency(injected)
            await confirm_latencies(writer, min(20, appends))  # warm-up at this latency
            ms = sorted(await confirm_latencies(writer, appends))
            rows[f"latency_{injected}ms"] = {"p50_ms": round(percentile(ms, 0.5), 3),
                                             "p99_ms": round(percentile(ms, 0.99), 3)}
        await writer.close()
    base = rows["latency_0ms"]["p50_ms"]
    rows["round_trip_ms"] = 2 * latency_ms
    rows["overhead_ms"] = round(rows[f"latency_{latency_ms}ms"]["p50_ms"] - base - 2 * latency_ms, 3)
    return rows


def run(latency_ms: int, appends: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-geo-") as tmp, LocalCluster(Path(tmp) / "c") as cluster:
        latency = RegionLatency(0, Path(tmp) / "faults-proxy.log")
        latency.start()
        try:
            for i in range(6):
                region = REGIONS[i % 3]
                remote = region != REGIONS[0]
                bookie = cluster.bookies.add_bookie(region=region, zone=f"zone-{i // 3}", start=False,
                                                    extra_args=latency.advertise_args(remote))
                if remote:
                    latency.add_bookie(bookie.bookie_id, bookie.port, bookie.binary_port)
                bookie.start(60.0)
            return asyncio.run(measure(cluster.uri, latency, latency_ms, appends))
        finally:
            latency.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=int, default=5)
    parser.add_argument("--appends", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = run(args.latency_ms, args.appends)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    lat = rows[f"latency_{args.latency_ms}ms"]
    print(f"stretched ledger E4/W4/A3 R2, ensemble {rows['ensemble']}")
    print(f"confirm p50/p99: {rows['latency_0ms']['p50_ms']}/{rows['latency_0ms']['p99_ms']} ms with 0 ms, "
          f"{lat['p50_ms']}/{lat['p99_ms']} ms with {args.latency_ms} ms each way; "
          f"beyond one round trip ({rows['round_trip_ms']} ms): {rows['overhead_ms']} ms (goal <= 1.5 ms)")


if __name__ == "__main__":
    main()
