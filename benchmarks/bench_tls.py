"""Benchmark: the cost of mutual TLS on the client -> bookie path, plaintext and TLS in one run.

One etcd, then two clusters of 3 bookie processes each on their own prefix: one
plaintext, one serving mutual TLS with allow-lists (certificates from a throwaway CA,
ECDSA P-256). ``scriba bench`` (its own process, E3/W3/A2, 1 KiB) runs against each in
turn, alternating, ``--runs`` times (the order flips every round, so neither side always
runs first on a machine whose load drifts); then one append in flight for latency. Prints
the median throughput and p50/p99 of each, the ratios TLS / plaintext of throughput and of
p99 (loaded and one in flight), the throughput loss in percent and whether it meets the
goal of issue #21 (at most 15% loss).

Run: ``.venv/bin/python benchmarks/bench_tls.py [--seconds 5] [--runs 3] [--storage memory] [--json OUT]``.
Not a timed test: the machine has 2 cores shared by every process, so figures vary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from scriba.grpc_runtime import apply_defaults

apply_defaults()

from scriba.embedded.bookie import BookieProcess  # noqa: E402
from scriba.embedded.etcd import EtcdCluster  # noqa: E402
from scriba.testing.pki import TestPki  # noqa: E402
from scriba.tls import TlsConfig  # noqa: E402

GOAL_LOSS_PCT_MAX = 15.0  # issue #21: TLS may cost at most 15% of plaintext throughput


def bench(uri: str, tls: TlsConfig | None, *, seconds: float | None, entries: int | None,
          inflight: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "scriba.cli", "--log-level", "warning", "bench", "--metadata", uri,
            "--ensemble", "3", "--write", "3", "--ack", "2", "--size", "1024", "--inflight", str(inflight),
            "--json", "--quiet"]
    argv += ["--seconds", str(seconds)] if seconds is not None else ["--entries", str(entries)]
    if tls is not None:
        argv += ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--tls-ca", str(tls.ca)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=(seconds or 60) + 120)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"scriba bench on {uri} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout[done.stdout.index("{"):])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--inflight", type=int, default=1000)
    parser.add_argument("--latency-entries", type=int, default=500)
    parser.add_argument("--storage", choices=["disk", "memory"], default="disk")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp:
        base = Path(tmp)
        pki = TestPki.create(base / "pki")
        etcd = EtcdCluster(base / "etcd", 1)
        etcd.start()
        storage = ["--storage", "memory"] if args.storage == "memory" else []
        clusters = {"plain": (None, None), "tls": (pki.server_tls(), pki.client_tls(pki.client))}
        bookies: list[BookieProcess] = []
        try:
            for name, (server, _) in clusters.items():
                for i in range(3):
                    bookies.append(BookieProcess(base / f"{name}-{i}", etcd.uri(name), bookie_id=f"{name}-{i}",
                                                 tls=server, extra_args=storage))
            for b in bookies:
                b.start()
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in clusters}
            for round_no in range(args.runs):
                order = list(clusters.items()) if round_no % 2 == 0 else list(clusters.items())[::-1]
                for name, (_, client) in order:
                    runs[name].append(bench(etcd.uri(name), client, seconds=args.seconds, entries=None,
                                            inflight=args.inflight))
            latency = {name: bench(etcd.uri(name), client, seconds=None, entries=args.latency_entries, inflight=1)
                       for name, (_, client) in clusters.items()}
        finally:
            for b in bookies:
                b.stop()
            etcd.stop()
    summary: dict[str, Any] = {}
    for name in clusters:
        rates = [r["entries_per_s"] for r in runs[name]]
        summary[name] = {"entries_per_s_median": statistics.median(rates), "entries_per_s_min": min(rates),
                         "entries_per_s_max": max(rates),
                         "latency_ms_p99_loaded_median": statistics.median(r["latency_ms_p99"] for r in runs[name]),
                         "latency_ms_p50_one_inflight": latency[name]["latency_ms_p50"],
                         "latency_ms_p99_one_inflight": latency[name]["latency_ms_p99"]}
    plain, tls = summary["plain"], summary["tls"]
    summary["ratio_throughput_tls_over_plain"] = round(tls["entries_per_s_median"] / plain["entries_per_s_median"], 3)
    summary["ratio_p99_loaded_tls_over_plain"] = round(
        tls["latency_ms_p99_loaded_median"] / plain["latency_ms_p99_loaded_median"], 3)
    loss_pct = round(100 * (1 - summary["ratio_throughput_tls_over_plain"]), 1)
    summary["throughput_loss_pct"] = loss_pct
    summary["goal_loss_pct_max"] = GOAL_LOSS_PCT_MAX
    summary["goal_met"] = loss_pct <= GOAL_LOSS_PCT_MAX
    summary["ratio_p99_one_inflight_tls_over_plain"] = round(
        tls["latency_ms_p99_one_inflight"] / plain["latency_ms_p99_one_inflight"], 3)
    summary["settings"] = {"seconds": args.seconds, "runs": args.runs, "inflight": args.inflight,
                           "storage": args.storage}
    print(json.dumps(summary, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
