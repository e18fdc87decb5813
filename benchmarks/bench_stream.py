"""Benchmark: log streams against raw ledger appends, same machine, same run.

1. A fresh cluster: a 1-member etcd for metadata and 3 bookie processes.
2. Baseline: raw ledger appends (``scriba.client.bench.run_bench``: E3/W3/A2, 1 KiB
   payloads, ``--inflight`` in flight), in a child process of its own.
3. Stream appends of 1 KiB and of 100-byte records, ``--inflight`` records in flight
   (``StreamWriter.append_async``, a future per record; the writer packs what is queued
   into record sets), and 100-byte records through ``append_many`` (1,000 a call, the
   same number in flight), each in a child process of its own, the stream's default
   settings (E3/W3/A2).
4. Tail visibility: a writer child appends one 100-byte record every millisecond
   (1k records/s) carrying its ``CLOCK_MONOTONIC`` send time; a reader child tails the
   stream from "latest" and notes when each record arrives (the clock is machine-wide).
   The floor under it, in the same run: the same pace on a bare ledger, read with
   ``LedgerReader.tail``. Each reports the CPU µs per record of its writer, its reader
   and the bookies while the records flowed.
5. Catch-up: a child writes ``--catchup-records`` 100-byte records (default 200,000;
   ``--catchup-records 1000000`` for the issue's figure) and closes the writer; another
   reads the stream from the earliest record to the last.

Every child reports its rate and the CPU time it spent per record (steadier than rates
when the machine is busy). The summary puts each figure beside its goal: 1 KiB stream
appends >= 90% of raw ledger appends (bytes/s); 100-byte records >= 200k records/s;
tail visibility p99 <= 5 ms; catch-up >= 200k records/s.

Run: ``.venv/bin/python benchmarks/bench_stream.py [--seconds 5] [--inflight 2000]
[--catchup-records 1000000] [--parts appends,tail,catchup] [--json OUT]``.
Not a timed test: the machine has 2 cores shared by every process, so figures vary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from proc_cpu import pids_cpu_s

from scriba.grpc_runtime import apply_defaults

apply_defaults()

from scriba.log import configure  # noqa: E402

STREAM = "s"
SENT = struct.Struct("<q")  # a tail record starts with its send time (ns, CLOCK_MONOTONIC)
TAIL_RATE_PER_S = 1000
GOALS = {"stream_1k_vs_raw": 0.9, "stream_100b_records_per_s": 200_000, "tail_p99_ms": 5.0,
         "catchup_records_per_s": 200_000}


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _percentile(values: list[float], fraction: float) -> float:
    from scriba.client.bench import percentile

    return percentile(sorted(values), fraction)


async def _namespace(uri: str, namespace: str) -> tuple[Any, Any]:
    from scriba.client import Client
    from scriba.stream import open_namespace

    client = await Client.connect(uri)
    return client, await open_namespace(client, namespace, create=True)


# --- children ---------------------------------------------------------------------------
async def child_raw(uri: str, size: int, seconds: float, inflight: int) -> dict[str, Any]:
    from scriba.client.bench import BenchConfig, run_bench

    cpu0 = _cpu_s()
    # append_async (a future per append), as the stream's own writer uses and as earlier
    # figures were taken: the ratio compares layers, not append APIs
    config = BenchConfig(uri, seconds=seconds, size_bytes=size, inflight=inflight, append_api="future")
    result = await run_bench(config, progress=False)
    cpu = _cpu_s() - cpu0
    return {"records": result.entries, "seconds": result.seconds, "records_per_s": result.entries_per_s,
            "mb_per_s": result.mb_per_s, "cpu_us_per_record": round(cpu / max(result.entries, 1) * 1e6, 2),
            "failed": result.failed, "first_error": result.first_error}


async def child_appends(uri: str, namespace: str, size: int, seconds: float, inflight: int,
                        batch: int) -> dict[str, Any]:
    """``inflight`` records in flight: one ``append_async`` each, or with ``batch``,
    ``append_many`` calls of ``batch`` records each."""
    client, ns = await _namespace(uri, namespace)
    writer = await ns.open_writer(STREAM, create=True)
    payload = b"x" * size
    records = [payload] * batch
    loop = asyncio.get_running_loop()
    state = {"done": 0, "failed": 0, "outstanding": 0, "stop": False, "error": ""}
    finished = loop.create_future()

    def issue() -> None:
        state["outstanding"] += 1
        if batch:
            loop.create_task(writer.append_many(records)).add_done_callback(on_done)
        else:
            writer.append_async(payload).add_done_callback(on_done)

    def on_done(future: asyncio.Future[Any]) -> None:
        state["outstanding"] -= 1
        if future.cancelled() or future.exception() is not None:
            state["failed"] += 1
            state["stop"] = True
            state["error"] = state["error"] or repr(future.exception())
        else:
            state["done"] += batch or 1
        if not state["stop"]:
            issue()
        elif state["outstanding"] == 0 and not finished.done():
            finished.set_result(None)

    cpu0 = _cpu_s()
    t0 = time.monotonic()
    for _ in range(max(1, inflight // batch) if batch else inflight):
        issue()
    await asyncio.sleep(seconds)
    state["stop"] = True
    await finished
    elapsed = time.monotonic() - t0
    cpu = _cpu_s() - cpu0
    await writer.close()
    segments = len((await ns.info(STREAM)).record.segments)
    await client.close()
    done = int(state["done"])
    return {"records": done, "seconds": round(elapsed, 3), "records_per_s": round(done / elapsed, 1),
            "mb_per_s": round(done * size / elapsed / 1e6, 2), "cpu_us_per_record": round(cpu / max(done, 1) * 1e6, 2),
            "failed": state["failed"], "first_error": state["error"], "segments": segments}


async def paced_appends(append: Callable[[bytes], Awaitable[Any]], seconds: float) -> int:
    """``TAIL_RATE_PER_S`` 100-byte payloads a second, each starting with its send time;
    the last one marked; returns how many once all are confirmed (the CPU spent meanwhile
    in ``CPU_S``)."""
    cpu0 = _cpu_s()
    try:
        return await _paced(append, seconds)
    finally:
        CPU_S[0] = _cpu_s() - cpu0


CPU_S = [0.0]  # the CPU seconds of the last ``paced_appends``


async def _paced(append: Callable[[bytes], Awaitable[Any]], seconds: float) -> int:
    loop = asyncio.get_running_loop()
    count = int(seconds * TAIL_RATE_PER_S)
    futures = []
    start = loop.time() + 0.05
    for i in range(count):
        delay = start + i / TAIL_RATE_PER_S - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)  # the pace: one record a millisecond
        last = b"L" if i == count - 1 else b"-"
        futures.append(append(SENT.pack(time.monotonic_ns()) + last + b"." * 91))
    await asyncio.gather(*futures)
    return count


async def child_tail_writer(uri: str, namespace: str, seconds: float) -> dict[str, Any]:
    client, ns = await _namespace(uri, namespace)
    writer = await ns.open_writer(STREAM)
    count = await paced_appends(writer.append_async, seconds)
    await writer.close()
    await client.close()
    return {"records": count, "cpu_s": CPU_S[0]}


async def child_tail_reader(uri: str, namespace: str) -> dict[str, Any]:
    client, ns = await _namespace(uri, namespace)
    reader = await ns.open_reader(STREAM, "latest")
    print("ready", flush=True)
    cpu0 = _cpu_s()
    latencies_ms: list[float] = []
    async for record in reader:
        seen = time.monotonic_ns()
        (sent,) = SENT.unpack_from(record.payload)
        latencies_ms.append((seen - sent) / 1e6)
        if record.payload[SENT.size:SENT.size + 1] == b"L":
            break
    cpu_s = _cpu_s() - cpu0
    await reader.close()
    await client.close()
    return _latencies(latencies_ms, cpu_s)


def _latencies(latencies_ms: list[float], cpu_s: float) -> dict[str, Any]:
    return {"records": len(latencies_ms), "p50_ms": round(_percentile(latencies_ms, 0.5), 3),
            "p99_ms": round(_percentile(latencies_ms, 0.99), 3), "max_ms": round(max(latencies_ms), 3),
            "cpu_s": cpu_s}


async def child_ledger_tail_writer(uri: str, seconds: float) -> dict[str, Any]:
    """The baseline of the tail run: the same pace of 100-byte entries on a bare ledger."""
    from scriba.client import Client

    async with Client.connect(uri) as client:
        writer = await client.create_ledger(3, 3, 2)
        print(f"ledger {writer.ledger_id}", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # "go": the reader tails it now
        count = await paced_appends(writer.append_async, seconds)
        await writer.close()
    return {"records": count, "cpu_s": CPU_S[0]}


async def child_ledger_tail_reader(uri: str, ledger_id: int) -> dict[str, Any]:
    from scriba.client import Client

    async with Client.connect(uri) as client:
        reader = await client.open_ledger(ledger_id, recovery=False)
        print("ready", flush=True)
        cpu0 = _cpu_s()
        latencies_ms: list[float] = []
        async for entry in reader.tail(0):
            seen = time.monotonic_ns()
            (sent,) = SENT.unpack_from(entry.payload)
            latencies_ms.append((seen - sent) / 1e6)
            if entry.payload[SENT.size:SENT.size + 1] == b"L":
                break
        cpu_s = _cpu_s() - cpu0
    return _latencies(latencies_ms, cpu_s)


async def child_catchup_write(uri: str, namespace: str, records: int) -> dict[str, Any]:
    client, ns = await _namespace(uri, namespace)
    writer = await ns.open_writer(STREAM, create=True)
    payload = b"r" * 100
    chunk = 20_000
    t0 = time.monotonic()
    for first in range(0, records, chunk):
        await writer.append_many([payload] * min(chunk, records - first))
    await writer.close()
    elapsed = time.monotonic() - t0
    await client.close()
    return {"records": records, "records_per_s": round(records / elapsed, 1)}


async def child_catchup_read(uri: str, namespace: str, records: int) -> dict[str, Any]:
    client, ns = await _namespace(uri, namespace)
    cpu0 = _cpu_s()
    t0 = time.monotonic()
    seen = 0
    async with await ns.open_reader(STREAM, "earliest") as reader:
        while seen < records:
            seen += len(await reader.read_batch(65536))
    elapsed = time.monotonic() - t0
    cpu = _cpu_s() - cpu0
    await client.close()
    return {"records": seen, "seconds": round(elapsed, 3), "records_per_s": round(seen / elapsed, 1),
            "mb_per_s": round(seen * 100 / elapsed / 1e6, 2), "cpu_us_per_record": round(cpu / max(seen, 1) * 1e6, 2)}


def run_child(argv: list[str]) -> dict[str, Any]:
    args = _parser().parse_args(argv)
    configure(level="warning")
    modes = {
        "raw": lambda: child_raw(args.metadata, args.size, args.seconds, args.inflight),
        "appends": lambda: child_appends(args.metadata, args.namespace, args.size, args.seconds, args.inflight,
                                         args.batch),
        "tail-writer": lambda: child_tail_writer(args.metadata, args.namespace, args.seconds),
        "tail-reader": lambda: child_tail_reader(args.metadata, args.namespace),
        "ledger-tail-writer": lambda: child_ledger_tail_writer(args.metadata, args.seconds),
        "ledger-tail-reader": lambda: child_ledger_tail_reader(args.metadata, args.records),
        "catchup-write": lambda: child_catchup_write(args.metadata, args.namespace, args.records),
        "catchup-read": lambda: child_catchup_read(args.metadata, args.namespace, args.records),
    }
    result: dict[str, Any] = asyncio.run(modes[args.child]())
    return result


# --- the parent ------------------------------------------------------------------------------
def _spawn(mode: str, uri: str, **options: Any) -> subprocess.Popen[str]:
    argv = [sys.executable, __file__, "--child", mode, "--metadata", uri]
    for name, value in options.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout_s)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{err[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run(child: str, uri: str, timeout_s: float, **options: Any) -> dict[str, Any]:
    return _result(_spawn(child, uri, **options), timeout_s)


def tail_visibility(uri: str, seconds: float, bookie_pids: list[int]) -> dict[str, Any]:
    namespace = f"bench/tail-{uuid.uuid4().hex[:6]}"

    async def create() -> None:
        client, ns = await _namespace(uri, namespace)
        await ns.create_stream(STREAM)
        await client.close()

    asyncio.run(create())
    reader = _spawn("tail-reader", uri, namespace=namespace)
    assert reader.stdout is not None
    if reader.stdout.readline().strip() != "ready":
        raise RuntimeError(f"tail reader did not start: {reader.communicate(timeout=10)[1][-2000:]}")
    bookies0 = pids_cpu_s(bookie_pids)
    written = run("tail-writer", uri, seconds + 120, namespace=namespace, seconds=seconds)
    seen = _result(reader, 120)
    cpu = _cpu_per(written, seen, pids_cpu_s(bookie_pids) - bookies0)
    return {**seen, "written": written["records"], "rate_per_s": TAIL_RATE_PER_S, **cpu}


def _cpu_per(written: dict[str, Any], seen: dict[str, Any], bookies_s: float) -> dict[str, Any]:
    """CPU µs per record while the records flowed, of the writer (pacing and confirming),
    the reader (from its start to the last record) and the 3 bookies: what a tail costs,
    steadier than its latency on a busy machine."""
    n = max(written["records"], 1)
    parts = {"writer": written["cpu_s"], "reader": seen.pop("cpu_s"), "bookies": bookies_s}
    out = {f"{k}_cpu_us_per_record": round(v / n * 1e6) for k, v in parts.items()}
    out["cpu_us_per_record"] = round(sum(parts.values()) / n * 1e6)
    return out


def ledger_tail_visibility(uri: str, seconds: float, bookie_pids: list[int]) -> dict[str, Any]:
    """The same measurement on a bare ledger (``LedgerReader.tail``): the floor under the stream's."""
    writer = subprocess.Popen([sys.executable, __file__, "--child", "ledger-tail-writer", "--metadata", uri,
                               "--seconds", str(seconds)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdin is not None
    ledger_id = int(writer.stdout.readline().split()[1])
    reader = _spawn("ledger-tail-reader", uri, records=ledger_id)
    assert reader.stdout is not None
    if reader.stdout.readline().strip() != "ready":
        raise RuntimeError(f"ledger tail reader did not start: {reader.communicate(timeout=10)[1][-2000:]}")
    bookies0 = pids_cpu_s(bookie_pids)
    writer.stdin.write("go\n")
    writer.stdin.flush()
    written = _result(writer, seconds + 120)
    seen = _result(reader, 120)
    cpu = _cpu_per(written, seen, pids_cpu_s(bookie_pids) - bookies0)
    return {**seen, **cpu}


def main(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    if args.child:
        print(json.dumps(run_child(argv)), flush=True)
        return
    from scriba.embedded.bookie import BookieProcess
    from scriba.embedded.etcd import EtcdCluster

    configure(level="warning")
    results: dict[str, Any] = {"seconds": args.seconds, "inflight": args.inflight}
    with tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp:
        base = Path(tmp)
        etcd = EtcdCluster(base / "etcd", 1)
        etcd.start()
        uri = etcd.uri("bench")
        bookies = [BookieProcess(base / f"bookie-{i}", uri, bookie_id=f"bookie-{i}") for i in range(3)]
        try:
            for b in bookies:
                b.start()
            budget = args.seconds + 180
            common = {"seconds": args.seconds, "inflight": args.inflight}
            parts = set(args.parts.split(","))
            if "appends" in parts:
                results["raw_1k"] = run("raw", uri, budget, size=1024, **common)
                results["stream_1k"] = run("appends", uri, budget, namespace="bench/s1k", size=1024, **common)
                results["stream_100b"] = run("appends", uri, budget, namespace="bench/s100", size=100, **common)
                results["stream_100b_many"] = run("appends", uri, budget, namespace="bench/s100m", size=100,
                                                  batch=1000, **common)
            if "tail" in parts:
                pids = [b.pid for b in bookies if b.pid is not None]
                results["tail"] = tail_visibility(uri, args.seconds, pids)
                results["ledger_tail"] = ledger_tail_visibility(uri, args.seconds, pids)
            if "catchup" in parts:
                results["catchup_write"] = run("catchup-write", uri, 1800, namespace="bench/catchup",
                                               records=args.catchup_records)
                results["catchup_read"] = run("catchup-read", uri, 1800, namespace="bench/catchup",
                                              records=args.catchup_records)
        finally:
            for b in bookies:
                b.stop()
            etcd.stop()
    results["summary"] = summary(results)
    print_summary(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def summary(r: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "raw_1k" in r:
        raw_mb = r["raw_1k"]["mb_per_s"]
        out["stream_1k_vs_raw"] = round(r["stream_1k"]["mb_per_s"] / raw_mb, 3) if raw_mb else None
        out["stream_100b_records_per_s"] = max(r["stream_100b"]["records_per_s"],
                                               r["stream_100b_many"]["records_per_s"])
    if "tail" in r:
        out["tail_p99_ms"] = r["tail"]["p99_ms"]
    if "catchup_read" in r:
        out["catchup_records_per_s"] = r["catchup_read"]["records_per_s"]
    return out


def print_summary(r: dict[str, Any]) -> None:
    for name in ("raw_1k", "stream_1k", "stream_100b", "stream_100b_many", "tail", "ledger_tail", "catchup_write",
                 "catchup_read"):
        if name in r:
            print(f"{name:16} {json.dumps(r[name])}")
    s = r["summary"]
    print("goals (2 shared cores: figures vary run to run):")
    if "stream_1k_vs_raw" in s:
        print(f"  1 KiB stream appends / raw ledger appends (MB/s): {s['stream_1k_vs_raw']}  "
              f"(goal >= {GOALS['stream_1k_vs_raw']})")
        print(f"  100-byte records/s: {s['stream_100b_records_per_s']:,.0f}  "
              f"(goal >= {GOALS['stream_100b_records_per_s']:,})")
    if "tail_p99_ms" in s:
        print(f"  tail visibility p99 at {TAIL_RATE_PER_S}/s: {s['tail_p99_ms']} ms  (goal <= {GOALS['tail_p99_ms']}; "
              f"a bare ledger's tail in the same run: p99 {r['ledger_tail']['p99_ms']} ms)")
    if "catchup_records_per_s" in s:
        print(f"  catch-up records/s: {s['catchup_records_per_s']:,.0f}  (goal >= {GOALS['catchup_records_per_s']:,})")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--seconds", type=float, default=5.0, help="seconds per append and tail run")
    p.add_argument("--inflight", type=int, default=2000, help="appends (records) in flight")
    p.add_argument("--catchup-records", type=int, default=200_000, help="records of the catch-up stream")
    p.add_argument("--parts", default="appends,tail,catchup", help="which runs (comma-separated)")
    p.add_argument("--json", default=None, help="write the results here")
    # child processes
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--metadata", default=None, help=argparse.SUPPRESS)
    p.add_argument("--namespace", default=None, help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, default=1024, help=argparse.SUPPRESS)
    p.add_argument("--records", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
    return p


if __name__ == "__main__":
    main(sys.argv[1:])
