"""Benchmark: the cost of mutual TLS on the client -> bookie path, plaintext and TLS in one run.

One etcd, then two clusters of 3 bookie processes each on their own prefix: one
plaintext, one serving mutual TLS with allow-lists (certificates from a throwaway CA,
ECDSA P-256). ``scriba bench`` (its own process, E3/W3/A2, 1 KiB) runs against each in
turn, alternating, ``--runs`` times (the order flips every round, so neither side always
runs first on a machine whose load drifts); then one append in flight for latency. Prints
the median throughput and p50/p99 of each, the ratios TLS / plaintext of throughput and of
p99 (loaded and one in flight), the throughput loss in percent and whether it meets the
goal of issue #21 (at most 15% loss), and where the CPU goes: the client's and the three
bookies' CPU time per confirmed entry on each side (steadier than rates on a busy
machine; TLS's cost is the difference).

The floor: TLS cannot cost less than sealing each entry once per bookie at the client
and opening it once at each bookie. ``cipher_floor`` measures that in this process with
the same certificates and the cipher the handshake picks (``ssl.SSLObject`` over memory
BIOs: no sockets, no asyncio), sealing 64 KiB writes of 1 KiB entries and opening them,
and states the throughput loss that CPU alone would cause were the plaintext run bound
by CPU (``floor_loss_pct``: floor / (plaintext CPU per entry + floor)).

``paired_rounds``: the same figures round by round (each round runs both sides back to
back), their median and spread, and how many rounds met the goal. Use ``--runs 10`` or
more for it: the medians of each side above carry the drift between rounds, a round's
ratio mostly does not.

``--also-sslproto``: a third cluster whose bookies and client run TLS on asyncio's
``sslproto`` (``SCRIBA_TLS_TRANSPORT=asyncio``) instead of ``scriba.tls_socket``, in the
same rounds; ``sslproto_paired_rounds`` and ``tls_socket_vs_sslproto`` compare them.

Run: ``.venv/bin/python benchmarks/bench_tls.py [--seconds 5] [--runs 3] [--storage memory] [--also-sslproto] [--json OUT]``.
Not a timed test: the machine has 2 cores shared by every process, so figures vary.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from proc_cpu import pids_cpu_s

from scriba.grpc_runtime import apply_defaults

apply_defaults()

from scriba.embedded.bookie import BookieProcess  # noqa: E402
from scriba.embedded.etcd import EtcdCluster  # noqa: E402
from scriba.testing.pki import TestPki  # noqa: E402
from scriba.tls import TlsConfig  # noqa: E402

GOAL_LOSS_PCT_MAX = 15.0  # issue #21: TLS may cost at most 15% of plaintext throughput
REPLICAS = 3  # each entry is sealed once per bookie of the write quorum (E3/W3)
SSLPROTO_ENV = {"SCRIBA_TLS_TRANSPORT": "asyncio"}  # the --also-sslproto cluster's bookies and client


def cipher_floor(pki: TestPki, *, entry_bytes: int = 1024, write_bytes: int = 64 * 1024,
                 total_bytes: int = 64 * 1024 * 1024) -> dict[str, Any]:
    """CPU microseconds to seal and to open one entry on one TLS link (docstring above)."""
    client = pki.client_tls(pki.client).load().client_ssl_context().wrap_bio(
        c_in := ssl.MemoryBIO(), c_out := ssl.MemoryBIO(), server_hostname="localhost")
    server = pki.server_tls().load().server_ssl_context().wrap_bio(
        s_in := ssl.MemoryBIO(), s_out := ssl.MemoryBIO(), server_side=True)
    for _ in range(10):  # the handshake, in memory
        for side, out, peer_in in ((client, c_out, s_in), (server, s_out, c_in)):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
            peer_in.write(out.read())
    plain = b"\x5a" * write_bytes
    seal_s = open_s = 0.0
    for _ in range(total_bytes // (16 * write_bytes)):  # 16 writes (1 MiB) at a time: no memory growth
        t0 = time.process_time()
        sealed = []
        for _ in range(16):
            client.write(plain)
            sealed.append(c_out.read())
        t1 = time.process_time()
        for record in sealed:
            s_in.write(record)
            try:
                while server.read(256 * 1024):
                    pass
            except ssl.SSLWantReadError:
                pass
        seal_s += t1 - t0
        open_s += time.process_time() - t1
    entries = total_bytes / entry_bytes
    cipher = client.cipher()
    return {"cipher": cipher[0] if cipher else "", "seal_us_per_entry": round(1e6 * seal_s / entries, 3),
            "open_us_per_entry": round(1e6 * open_s / entries, 3)}


def bench(uri: str, tls: TlsConfig | None, *, seconds: float | None, entries: int | None,
          inflight: int, bookie_pids: list[int], env: dict[str, str] | None = None) -> dict[str, Any]:
    """One ``scriba bench`` run; its JSON, plus ``bookie_cpu_us_per_entry`` (the CPU the
    cluster's bookies spent during the run, per confirmed entry)."""
    argv = [sys.executable, "-m", "scriba.cli", "--log-level", "warning", "bench", "--metadata", uri,
            "--ensemble", "3", "--write", "3", "--ack", "2", "--size", "1024", "--inflight", str(inflight),
            "--json", "--quiet"]
    argv += ["--seconds", str(seconds)] if seconds is not None else ["--entries", str(entries)]
    if tls is not None:
        argv += ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--tls-ca", str(tls.ca)]
    cpu_before_s = pids_cpu_s(bookie_pids)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=(seconds or 60) + 120,
                          env={**os.environ, **env} if env else None)
    bookie_cpu_s = pids_cpu_s(bookie_pids) - cpu_before_s  # includes the client's set-up (ledger create)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"scriba bench on {uri} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout[done.stdout.index("{"):])
    result["bookie_cpu_us_per_entry"] = round(1e6 * bookie_cpu_s / max(1, result["entries"]), 2)
    return result


def cpu(run: dict[str, Any]) -> float:
    """The CPU per confirmed entry of one run: the client's and its bookies'."""
    return float(run["client_cpu_us_per_entry"] + run["bookie_cpu_us_per_entry"])


def paired_rounds(plain: list[dict[str, Any]], tls: list[dict[str, Any]]) -> dict[str, Any]:
    """TLS's cost round by round: each round ran both sides back to back, so a round's
    ratio is free of the drift between rounds that the medians of each side carry (the
    machine's load moves more between rounds than within one). Per round: the
    throughput loss in percent, the CPU per entry that TLS added (client + bookies), and
    the loss that added CPU predicts were the run bound by CPU (added / (plain + added))."""
    loss = [100 * (1 - t["entries_per_s"] / p["entries_per_s"]) for p, t in zip(plain, tls, strict=True)]
    added = [cpu(t) - cpu(p) for p, t in zip(plain, tls, strict=True)]
    cpu_loss = [100 * a / cpu(t) for a, t in zip(added, tls, strict=True)]

    def spread(values: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(values), 1), "min": round(min(values), 1),
                "max": round(max(values), 1)}

    return {"rounds": len(loss), "throughput_loss_pct": spread(loss),
            "rounds_within_goal": sum(x <= GOAL_LOSS_PCT_MAX for x in loss),
            "cpu_us_per_entry_added": spread(added), "cpu_loss_pct": spread(cpu_loss),
            "per_round_loss_pct": [round(x, 1) for x in loss]}


def tls_socket_vs_sslproto(plain: list[dict[str, Any]], socket_runs: list[dict[str, Any]],
                           sslproto_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Round by round: throughput on ``scriba.tls_socket`` over throughput on ``sslproto``,
    and the CPU per entry each added to plaintext (client + bookies)."""
    rate = [s["entries_per_s"] / a["entries_per_s"] for s, a in zip(socket_runs, sslproto_runs, strict=True)]
    added_socket = [cpu(s) - cpu(p) for p, s in zip(plain, socket_runs, strict=True)]
    added_sslproto = [cpu(a) - cpu(p) for p, a in zip(plain, sslproto_runs, strict=True)]
    return {"throughput_ratio_median": round(statistics.median(rate), 3),
            "throughput_ratio_per_round": [round(x, 3) for x in rate],
            "cpu_us_per_entry_added_median": {"tls_socket": round(statistics.median(added_socket), 2),
                                              "sslproto": round(statistics.median(added_sslproto), 2)}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--inflight", type=int, default=1000)
    parser.add_argument("--latency-entries", type=int, default=500)
    parser.add_argument("--storage", choices=["disk", "memory"], default="disk")
    parser.add_argument("--also-sslproto", action="store_true",
                        help="a third cluster on asyncio's sslproto (SCRIBA_TLS_TRANSPORT=asyncio)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp:
        base = Path(tmp)
        pki = TestPki.create(base / "pki")
        floor = cipher_floor(pki)
        etcd = EtcdCluster(base / "etcd", 1)
        etcd.start()
        storage = ["--storage", "memory"] if args.storage == "memory" else []
        clusters = {"plain": (None, None), "tls": (pki.server_tls(), pki.client_tls(pki.client))}
        if args.also_sslproto:
            clusters["sslproto"] = clusters["tls"]
        envs = {name: SSLPROTO_ENV if name == "sslproto" else None for name in clusters}
        bookies: list[BookieProcess] = []
        try:
            for name, (server, _) in clusters.items():
                for i in range(3):
                    bookies.append(BookieProcess(base / f"{name}-{i}", etcd.uri(name), bookie_id=f"{name}-{i}",
                                                 tls=server, extra_args=storage, env=envs[name]))
            for b in bookies:
                b.start()
            pids = {name: [b.pid for b in bookies if b.bookie_id.startswith(name) and b.pid is not None]
                    for name in clusters}
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in clusters}
            for round_no in range(args.runs):
                order = list(clusters.items()) if round_no % 2 == 0 else list(clusters.items())[::-1]
                for name, (_, client) in order:
                    runs[name].append(bench(etcd.uri(name), client, seconds=args.seconds, entries=None,
                                            inflight=args.inflight, bookie_pids=pids[name], env=envs[name]))
            latency = {name: bench(etcd.uri(name), client, seconds=None, entries=args.latency_entries, inflight=1,
                                   bookie_pids=pids[name], env=envs[name])
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
                         "client_cpu_us_per_entry_median": statistics.median(
                             r["client_cpu_us_per_entry"] for r in runs[name]),
                         "bookies_cpu_us_per_entry_median": statistics.median(
                             r["bookie_cpu_us_per_entry"] for r in runs[name]),
                         "adds_per_message_median": statistics.median(r["adds_per_message"] for r in runs[name]),
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
    summary["cpu_us_per_entry_added_by_tls"] = {
        "client": round(tls["client_cpu_us_per_entry_median"] - plain["client_cpu_us_per_entry_median"], 2),
        "bookies": round(tls["bookies_cpu_us_per_entry_median"] - plain["bookies_cpu_us_per_entry_median"], 2)}
    floor_us = REPLICAS * (floor["seal_us_per_entry"] + floor["open_us_per_entry"])
    plain_us = plain["client_cpu_us_per_entry_median"] + plain["bookies_cpu_us_per_entry_median"]
    summary["cipher_floor"] = {**floor, "cpu_us_per_entry": round(floor_us, 2),
                               "plain_cpu_us_per_entry": round(plain_us, 2),
                               "floor_loss_pct": round(100 * floor_us / (plain_us + floor_us), 1)}
    summary["paired_rounds"] = paired_rounds(runs["plain"], runs["tls"])
    if "sslproto" in summary:
        summary["sslproto_paired_rounds"] = paired_rounds(runs["plain"], runs["sslproto"])
        summary["tls_socket_vs_sslproto"] = tls_socket_vs_sslproto(runs["plain"], runs["tls"], runs["sslproto"])
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
