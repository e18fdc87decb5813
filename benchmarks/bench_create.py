"""Benchmark: ledger create+close per second with 1 and with 64 concurrent creators.

For each metadata store (a real 1-member etcd, a real standalone ZooKeeper): start it
and 3 bookie processes with the launcher (``scriba.testing.cluster.LocalCluster``),
connect one client, then run two phases of ``--seconds`` each: 1 creator, then
``--creators`` (64) concurrent creators, each looping ``create_ledger(3, 3, 2)`` +
``close()``. Empty ledgers, so only the metadata path is measured: id allocation,
the ledger record's create, and the close's compare-and-set.

``zk-plain`` is the ZooKeeper store with write coalescing off (one request per write,
as before ``scriba.meta.zk_multi``): the before/after baseline in the same run.

Printed per store: create+close/s, p50/p99 latency, the client process's CPU per
create+close (all its threads: kazoo's included; the least noisy figure on a busy machine), time-outs and other errors, and a
summary with the 1-creator figure beside the many-creator one and their ratio; the ids
of both phases (two clients) are checked to be unique (exit status 1 if not). The
baseline is the 1-creator phase of the same run: concurrency should multiply the rate,
not divide it.

Run: ``.venv/bin/python benchmarks/bench_create.py [--seconds 10] [--creators 64]
[--stores etcd,zk,zk-plain] [--json OUT]``.
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

import scriba.meta.zk_multi as zk_multi
from scriba.client.bench import percentile
from scriba.client.client import Client
from scriba.errors import DeadlineExceededError, ScribaError
from scriba.log import configure
from scriba.testing.cluster import LocalCluster

BOOKIES = 3
ops_max_default = zk_multi.BATCH_OPS_MAX


async def create_close(uri: str, *, creators: int, seconds: float, warmup: int) -> dict[str, Any]:
    """``creators`` tasks creating and closing ledgers for ``seconds`` on one client."""
    async with Client.connect(uri) as client:
        for _ in range(warmup):  # connections, registry and the first id range
            await (await client.create_ledger(3, 3, 2)).close()
        latencies_ms: list[float] = []
        ids: list[int] = []
        timeouts = errors = 0
        stop_at = time.monotonic() + seconds

        async def creator() -> None:
            nonlocal timeouts, errors
            while time.monotonic() < stop_at:
                t0 = time.perf_counter()
                try:
                    writer = await client.create_ledger(3, 3, 2)
                    await writer.close()
                except DeadlineExceededError:
                    timeouts += 1
                    continue
                except ScribaError:
                    errors += 1
                    continue
                latencies_ms.append((time.perf_counter() - t0) * 1000)
                ids.append(writer.ledger_id)

        t0, cpu0 = time.monotonic(), time.process_time()
        await asyncio.gather(*(creator() for _ in range(creators)))
        elapsed_s, cpu_s = time.monotonic() - t0, time.process_time() - cpu0
    latencies_ms.sort()
    return {
        "creators": creators,
        "ledgers": len(latencies_ms),
        "seconds": round(elapsed_s, 3),
        "per_s": round(len(latencies_ms) / elapsed_s, 1),
        "latency_ms_p50": round(percentile(latencies_ms, 0.50), 2),
        "latency_ms_p99": round(percentile(latencies_ms, 0.99), 2),
        "cpu_us_per_ledger": round(cpu_s / max(1, len(latencies_ms)) * 1e6),  # this process, all threads
        "timeouts": timeouts,
        "errors": errors,
        "ids": ids,
    }


def run_store(kind: str, base: Path, *, seconds: float, creators: int, warmup: int) -> dict[str, Any]:
    # zk-plain: every store opened from here on sends one request per write (the baseline)
    zk_multi.BATCH_OPS_MAX = 1 if kind == "zk-plain" else ops_max_default
    metadata = "zk" if kind == "zk-plain" else kind
    with LocalCluster(base / kind, metadata=metadata, prefix="bench") as cluster:
        cluster.bookies.start_bookies(BOOKIES)
        one = asyncio.run(create_close(cluster.uri, creators=1, seconds=seconds, warmup=warmup))
        many = asyncio.run(create_close(cluster.uri, creators=creators, seconds=seconds, warmup=warmup))
    ids = one.pop("ids") + many.pop("ids")  # two clients, one after the other
    return {
        "one": one,
        "many": many,
        "ratio": round(many["per_s"] / one["per_s"], 2) if one["per_s"] else None,
        "ids_unique": len(set(ids)) == len(ids),
    }


def _line(kind: str, r: dict[str, Any]) -> str:
    return (
        f"{kind:5} {r['creators']:3} creators: {r['per_s']:8,.0f} create+close/s  p50 {r['latency_ms_p50']:7.2f} ms"
        f"  p99 {r['latency_ms_p99']:8.2f} ms  client CPU {r['cpu_us_per_ledger']:5} us/ledger"
        f"  ledgers {r['ledgers']:6}  time-outs {r['timeouts']}  errors {r['errors']}"
    )


def _summary(kind: str, r: dict[str, Any]) -> str:
    one, many = r["one"], r["many"]
    return (
        f"{kind:5} create+close/s: 1 creator {one['per_s']:,.0f} | {many['creators']} creators "
        f"{many['per_s']:,.0f} ({r['ratio']}x); p99 {one['latency_ms_p99']} ms | {many['latency_ms_p99']} ms; "
        f"time-outs {one['timeouts']} | {many['timeouts']}; ids unique across both clients: {r['ids_unique']}"
    )


def _ratios(results: dict[str, Any]) -> None:
    """ZooKeeper against etcd and against its own baseline, many creators, same run."""
    rate = {kind: r["many"]["per_s"] for kind, r in results.items()}
    for a, b in (("zk", "etcd"), ("zk", "zk-plain"), ("zk-plain", "etcd")):
        if rate.get(a) and rate.get(b):
            print(f"ratio {a} / {b} ({results[a]['many']['creators']} creators): {rate[a] / rate[b]:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--creators", type=int, default=64, help="concurrent creators of the second phase")
    parser.add_argument("--stores", default="etcd,zk,zk-plain",
                        help="metadata stores to run: etcd, zk, zk-plain (zk without write coalescing)")
    parser.add_argument("--warmup", type=int, default=5, help="ledgers created before each phase")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    configure(level="warning")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="scriba-bench-create-") as tmp:
        for kind in [k.strip() for k in args.stores.split(",") if k.strip()]:
            results[kind] = run_store(kind, Path(tmp), seconds=args.seconds, creators=args.creators,
                                      warmup=args.warmup)
            print(_line(kind, results[kind]["one"]))
            print(_line(kind, results[kind]["many"]))
    for kind, r in results.items():
        print(_summary(kind, r))
    _ratios(results)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(r["ids_unique"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
