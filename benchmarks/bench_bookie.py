"""Bookie benchmark (not a test): one bookie process, one load-generator process.

1 KiB adds through the real gRPC protocol (AddStream, batches of 64, many batches in
flight over several streams), durable journal (group commit + fdatasync). Each batch is
one ``AddRun`` (the clients' format: one ledger's entries packed in one bytes field) or,
with ``--format adds``, one ``AddRequest`` per add (the older format). Reports
entries/s, MB/s, p50/p99 add latency (a batch's latency counts for each of its
entries), journal fsyncs/s, and -- in the same run, on the same disk -- the raw
``write + fdatasync`` rate with 64 records per sync (the ceiling a group-committing journal
can reach; the honest ratio) and with one 1 KiB record per sync (the latency floor). Then a paced
run at ``--paced-rate`` adds/s (one add per message) for its p99, next to the disk's own
fdatasync p99.

    .venv/bin/python benchmarks/bench_bookie.py [--seconds 10] [--streams 4] [--inflight 8]
        [--format run|adds]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from scriba.grpc_runtime import apply_defaults

apply_defaults()  # the load generator runs gRPC like the scriba client does (before grpc loads)


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100.0 * len(values)))]


# --- disk baseline -------------------------------------------------------------------
def raw_fdatasync(directory: Path, seconds: float, record_bytes: int = 1024,
                  records_per_sync: int = 1) -> dict[str, float]:
    """``write`` of ``records_per_sync`` records + ``fdatasync``, repeated for ``seconds``."""
    path = directory / "raw-fsync.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    record = b"r" * record_bytes * records_per_sync
    lat: list[float] = []
    try:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            os.write(fd, record)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    total = sum(lat)
    return {
        "syncs": len(lat),
        "syncs_per_s": len(lat) / total if total else 0.0,
        "records_per_s": len(lat) * records_per_sync / total if total else 0.0,
        "p50_ms": percentile(lat, 50) * 1e3,
        "p99_ms": percentile(lat, 99) * 1e3,
    }


# --- load generator (child process) ----------------------------------------------------
async def loadgen(args: argparse.Namespace) -> dict[str, Any]:
    import grpc

    from scriba.entry import HEADER
    from scriba.proto import scriba_pb2 as pb
    from scriba.proto import scriba_pb2_grpc as pb_grpc

    payload = b"p" * (args.size - HEADER.size - 4)
    key = b"k" * 32
    latencies: list[float] = []
    counts = {"ok": 0, "failed": 0}
    paced = args.rate > 0
    batch = 1 if paced else args.batch

    def varint(n: int) -> bytes:
        n &= (1 << 64) - 1
        out = bytearray()
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
        return bytes(out)

    tail = b"\0\0\0\0" + payload  # digest (unchecked by the bookie) + payload
    entry_len = HEADER.size + len(tail)
    key_part = b"\x1a" + varint(len(key)) + key
    entry_prefix = b"\x2a" + varint(entry_len)

    def make_batch(lid: int, first: int) -> bytes:
        """An encoded AddBatch (the same bytes pb.AddBatch would produce, built cheaply)."""
        pack = HEADER.pack
        lid_part = b"\x08" + varint(lid)
        parts = []
        for e in range(first, first + batch):
            body = b"".join((lid_part, b"\x10", varint(e), key_part, entry_prefix,
                             pack(lid, e, e - 1, 0), tail))
            parts.append(b"\x0a" + varint(len(body)) + body)
        return b"".join(parts)

    def make_run_batch(lid: int, first: int) -> bytes:
        """An encoded AddBatch holding one AddRun of ``batch`` entries."""
        pack = HEADER.pack
        blob = b"".join([b"".join((pack(lid, e, e - 1, 0), tail)) for e in range(first, first + batch)])
        run = pb.AddRun(ledger_id=lid, master_key=key, entry_ids=range(first, first + batch),
                        sizes=[entry_len] * batch, entries=blob)
        return pb.AddBatch(runs=[run]).SerializeToString()

    runs = args.format == "run"
    build = make_run_batch if runs else make_batch
    if runs:
        check_run = pb.AddBatch.FromString(build(7, 300)).runs[0]
        assert check_run.entry_ids[0] == 300 and check_run.entries[:8] == (7).to_bytes(8, "big")
    else:
        check = pb.AddBatch.FromString(make_batch(7, 300))
        assert check.adds[0].entry_id == 300 and check.adds[0].entry[:8] == (7).to_bytes(8, "big")

    async def stream(channel: grpc.aio.Channel, lid: int, deadline: float) -> None:
        add_stream = channel.stream_stream(
            "/scriba.v1.Bookie/AddStream",
            request_serializer=None,  # requests are already-encoded AddBatch bytes
            response_deserializer=pb.AddResponseBatch.FromString,
        )
        window = asyncio.Semaphore(1 if paced else args.inflight)
        sent: dict[int, float] = {}
        done = asyncio.Event()

        async def requests():  # type: ignore[no-untyped-def]
            eid = 0
            interval = args.streams / args.rate if paced else 0.0
            next_at = time.perf_counter()
            while time.perf_counter() < deadline:
                if paced:
                    delay = next_at - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    next_at += interval
                else:
                    await window.acquire()
                msg = build(lid, eid)
                sent[eid] = time.perf_counter()
                eid += batch
                yield msg
            done.set()

        call = add_stream(requests())
        async for resp in call:
            # one message may answer several batches (the bookie coalesces ready answers)
            now = time.perf_counter()
            ok = failed = 0
            for rr in resp.runs:
                ids = rr.entry_ids
                if rr.status == 0:
                    ok += len(ids)
                else:
                    failed += len(ids)
                for first in sent.keys() & ids:  # the batches (by first id) this answer ends
                    latencies.append(now - sent.pop(first))
                    if not paced:
                        window.release()
            for r in resp.responses:
                if r.status == 0:
                    ok += 1
                else:
                    failed += 1
                if r.entry_id % batch == 0:
                    t0 = sent.pop(r.entry_id, None)
                    if t0 is not None:
                        latencies.append(now - t0)
                        if not paced:
                            window.release()
            counts["ok"] += ok
            counts["failed"] += failed

    options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    channels = [grpc.aio.insecure_channel(args.address, options=options) for _ in range(args.streams)]
    try:
        # warm-up: connect every channel
        for ch in channels:
            await pb_grpc.BookieStub(ch).GetBookieInfo(pb.BookieInfoRequest(), timeout=10)
        started = time.perf_counter()
        deadline = started + args.seconds
        await asyncio.gather(*(stream(ch, 1000 + i, deadline) for i, ch in enumerate(channels)))
        elapsed = time.perf_counter() - started
    finally:
        for ch in channels:
            await ch.close()
    # each batch latency stands for `batch` adds
    return {
        "entries_ok": counts["ok"],
        "entries_failed": counts["failed"],
        "elapsed_s": elapsed,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "mean_ms": statistics.fmean(latencies) * 1e3 if latencies else float("nan"),
        "batches": len(latencies),
    }


# --- driver ----------------------------------------------------------------------------
def scrape(http_address: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("scriba_storage_"):
            name, _, value = line.partition(" ")
            out[name] = float(value)
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def run_loadgen(address: str, args: argparse.Namespace, *, rate: float, seconds: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--role", "loadgen", "--address", address,
           "--seconds", str(seconds), "--streams", str(args.streams if rate == 0 else 1),
           "--inflight", str(args.inflight), "--batch", str(args.batch), "--size", str(args.size),
           "--rate", str(rate), "--format", args.format]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=seconds + 120)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", default="driver", choices=["driver", "loadgen"])
    parser.add_argument("--address", default="")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--inflight", type=int, default=8, help="batches in flight per stream")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--format", default="run", choices=["run", "adds"],
                        help="one AddRun per batch (the clients' format) or one AddRequest per add")
    parser.add_argument("--rate", type=float, default=0.0, help="loadgen: paced adds/s (0 = open loop)")
    parser.add_argument("--paced-rate", type=float, default=1000.0)
    parser.add_argument("--paced-seconds", type=float, default=5.0)
    parser.add_argument("--baseline-seconds", type=float, default=3.0)
    parser.add_argument("--ceiling-records-per-sync", type=int, default=64,
                        help="records per fdatasync for the disk's group-commit ceiling")
    parser.add_argument("--dir", type=Path, default=None, help="where the bookie's data goes (default: a temp dir)")
    parser.add_argument("--storage", default="disk", choices=["disk", "memory"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    if args.role == "loadgen":
        print(json.dumps(asyncio.run(loadgen(args))))
        return 0

    from scriba.embedded.bookie import BookieProcess

    base = Path(tempfile.mkdtemp(prefix="scriba-bench-", dir=args.dir))
    bookie = BookieProcess(base / "bookie", "memory://bench", bookie_id="bench",
                           extra_args=["--storage", args.storage])
    report: dict[str, Any] = {"dir": str(base), "storage": args.storage}
    try:
        (base / "bookie").mkdir(parents=True)
        report["disk_baseline"] = raw_fdatasync(base, args.baseline_seconds, args.size)
        # The honest ceiling of a group-committing journal: many records per fdatasync.
        report["disk_ceiling"] = raw_fdatasync(base, args.baseline_seconds, args.size,
                                               args.ceiling_records_per_sync)
        bookie.start()
        before = scrape(bookie.http_address)
        cpu_before = cpu_seconds(bookie.pid or 0)
        load = run_loadgen(bookie.address, args, rate=0.0, seconds=args.seconds)
        cpu_used = cpu_seconds(bookie.pid or 0) - cpu_before
        after = scrape(bookie.http_address)
        name = next((n for n in ("scriba_storage_journal_groups_total", "scriba_storage_groups") if n in after), "")
        groups = after.get(name, 0.0) - before.get(name, 0.0)  # one fdatasync per journal group
        elapsed = load["elapsed_s"]
        report["throughput"] = {
            **load,
            "entries_per_s": load["entries_ok"] / elapsed,
            "mb_per_s": load["entries_ok"] * args.size / elapsed / 1e6,
            "fsyncs_per_s": groups / elapsed,
            "entries_per_fsync": load["entries_ok"] / groups if groups else float("nan"),
            "vs_raw_fdatasync": (load["entries_ok"] / elapsed) / report["disk_baseline"]["syncs_per_s"],
            "vs_batched_ceiling": (load["entries_ok"] / elapsed) / report["disk_ceiling"]["records_per_s"],
            "bookie_cpu_us_per_entry": cpu_used / load["entries_ok"] * 1e6 if load["entries_ok"] else float("nan"),
            "bookie_cpu_cores": cpu_used / elapsed,
            "loadavg_1m": os.getloadavg()[0],
        }
        paced = run_loadgen(bookie.address, args, rate=args.paced_rate, seconds=args.paced_seconds)
        report["paced"] = {**paced, "rate": args.paced_rate,
                           "p99_minus_disk_p99_ms": paced["p99_ms"] - report["disk_baseline"]["p99_ms"]}
    finally:
        bookie.stop()
        if bookie.returncode not in (0, None):
            print(bookie.log_tail(), file=sys.stderr)
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        t, d, p = report["throughput"], report["disk_baseline"], report["paced"]
        c = report["disk_ceiling"]
        print(f"bookie benchmark ({args.storage} storage, {args.size} B adds, batches of {args.batch} "
              f"as {'one AddRun' if args.format == 'run' else 'AddRequests'}, "
              f"{args.streams} streams x {args.inflight} in flight, {args.seconds:.0f}s)")
        print(f"  throughput : {t['entries_per_s']:,.0f} entries/s, {t['mb_per_s']:.1f} MB/s, "
              f"failed {t['entries_failed']}")
        print(f"  bookie CPU : {t['bookie_cpu_us_per_entry']:.1f} us/entry ({t['bookie_cpu_cores']:.2f} cores busy; "
              f"one free core would carry ~{1e6 / t['bookie_cpu_us_per_entry']:,.0f} entries/s); "
              f"load average {t['loadavg_1m']:.1f}")
        print(f"  add latency: p50 {t['p50_ms']:.2f} ms, p99 {t['p99_ms']:.2f} ms (per batch of {args.batch})")
        print(f"  fsyncs     : {t['fsyncs_per_s']:,.0f}/s, {t['entries_per_fsync']:.0f} entries per fsync")
        print(f"  disk ceiling: {c['records_per_s']:,.0f} records/s as write+fdatasync of "
              f"{args.ceiling_records_per_sync} records per sync; bookie/ceiling = "
              f"{t['vs_batched_ceiling']:.2f}x (the honest ratio)")
        print(f"  raw disk   : {d['syncs_per_s']:,.0f} write+fdatasync/s (1 record per sync: the latency "
              f"floor), p50 {d['p50_ms']:.2f} ms, p99 {d['p99_ms']:.2f} ms; bookie/one-per-sync = "
              f"{t['vs_raw_fdatasync']:.1f}x (batched vs unbatched: not a like-for-like ratio)")
        print(f"  paced {p['rate']:.0f}/s: p50 {p['p50_ms']:.2f} ms, p99 {p['p99_ms']:.2f} ms "
              f"(disk p99 + {p['p99_minus_disk_p99_ms']:.2f} ms), ok {p['entries_ok']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
