"""Benchmark: one round trip of the RSM replica service (``scriba.rsm.peer``), a
``PeerClient`` calling a ``ReplicaServer`` in the same process over loopback TCP, one call
in flight: p50/p99 µs and CPU µs per call, for a handler that answers at once (a status,
a sequential read: answered inside the read that brought it) and one that waits one loop
turn (as a proposal waits for its append).

With ``--base REF`` the same measurement also runs on that git ref's code (exported as
``ab_tail.export`` does, put first on ``PYTHONPATH`` of a child process), alternating with
this tree's for ``--rounds`` rounds, and prints the medians and base over head. Not a timed
test: on 2 shared cores figures vary; only ratios of one session compare.

Run: ``.venv/bin/python benchmarks/bench_rsm_peer.py [--calls 5000] [--base main --rounds 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


async def measure(calls: int) -> dict[str, dict[str, float]]:
    from scriba.embedded.process import free_port
    from scriba.rsm import wire
    from scriba.rsm.peer import PeerClient, ReplicaServer

    async def handler(op: wire.Op, flags: int, body: bytes) -> bytes:
        if body == b"wait":
            await asyncio.sleep(0)
        return b"ok"

    address = f"127.0.0.1:{free_port()}"
    server = ReplicaServer(address, handler, 16)
    await server.start()
    client = PeerClient(address)
    out: dict[str, dict[str, float]] = {}
    try:
        for kind in ("at_once", "wait"):
            body = kind.encode() if kind == "wait" else b"now"
            for _ in range(500):  # warm up
                await client.call(wire.Op.STATUS, body, 5.0)
            latencies: list[float] = []
            cpu0 = time.process_time()
            for _ in range(calls):
                t0 = time.perf_counter()
                await client.call(wire.Op.STATUS, body, 5.0)
                latencies.append(time.perf_counter() - t0)
            cpu = time.process_time() - cpu0
            latencies.sort()
            out[kind] = {"p50_us": round(latencies[len(latencies) // 2] * 1e6, 1),
                         "p99_us": round(latencies[int(len(latencies) * 0.99)] * 1e6, 1),
                         "cpu_us_per_call": round(cpu / calls * 1e6, 1)}
    finally:
        await client.close()
        await server.close()
    return out


def child(pythonpath: str, calls: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": pythonpath + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, __file__, "--calls", str(calls), "--json-only"], env=env,
                          capture_output=True, text=True, timeout=600, check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--base", help="a git ref to compare against (alternating rounds)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.json_only or args.base is None:
        print(json.dumps(asyncio.run(measure(args.calls))))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ab_tail import export

    runs: dict[str, list[dict[str, Any]]] = {"head": [], "base": []}
    with tempfile.TemporaryDirectory(prefix="bench-rsm-peer-") as tmp:
        base_pkg = str(export(args.base, Path(tmp)) / "pkg")
        for i in range(args.rounds):
            for side in ("base", "head") if i % 2 == 0 else ("head", "base"):
                runs[side].append(child(base_pkg if side == "base" else "", args.calls))
    doc: dict[str, Any] = {"base": args.base, "rounds": runs, "note": "2 shared cores: figures are noisy"}
    for kind in ("at_once", "wait"):
        for q in ("p50_us", "p99_us", "cpu_us_per_call"):
            head = statistics.median(r[kind][q] for r in runs["head"])
            base = statistics.median(r[kind][q] for r in runs["base"])
            doc[f"{kind}_{q}"] = {"head": head, "base": base, "base_over_head": round(base / head, 2)}
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
