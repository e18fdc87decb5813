"""Benchmark: Scriba confirmed appends vs etcd puts, same machine, same run.

1. A fresh cluster: a 1-member etcd for metadata and 3 bookie processes; then
   ``scriba bench`` (its own process, like any client) with E3/W3/A2, 1 KiB
   payloads, many appends in flight; then the same with one append in flight
   (latency p50/p99).
2. The baseline: a fresh 3-member etcd with etcd's default timing flags (as a user
   runs it) and the same workload as puts of 1 KiB values through the asyncio Python
   client (``aetcd``) connected to the leader only (no follower forwarding), at the
   same concurrency as Scriba and at its own best setting, then one in flight.
3. Each throughput setting runs ``--runs`` times; prints median, min and max, and two
   ratios: at the same concurrency, and each system at its best setting.
4. The data path (issue 20): every Scriba figure is taken over each ``--transport``
   (``binary`` and ``grpc`` by default, same bookies, same run) and for each
   ``--ledgers`` count (1, 4, 64: adds of many ledgers share messages, journal records
   and fsyncs), with the client's and each bookie's CPU per confirmed append beside the
   throughput, one-append-in-flight p50/p99 beside ``write + fdatasync`` p50/p99 measured
   on the bookies' disk in the same run, and the ratios binary/gRPC and N ledgers/1.
   Each one-in-flight run (the writer's, then the bare transport's) starts once the
   bookies have been idle for a second (``settle``): right after a throughput run they
   are still flushing its writes, which the first of them alone would measure.

Run: ``.venv/bin/python benchmarks/bench_client.py [--seconds 10] [--runs 3] [--json OUT]``
(``--skip-etcd`` for the Scriba side only; ``--transport binary`` for one wire;
``--append-api future`` to append through ``append_async``, a future per append, instead
of ``append_callback``: compare the client's CPU per append of both).
Not a timed test: the machine has 2 cores shared by every process, so figures vary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scriba.grpc_runtime import apply_defaults

apply_defaults()  # the etcd baseline's Python client and the bare transport run gRPC like scriba does

from bench_bookie import raw_fdatasync  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from scriba.embedded.bookie import BookieProcess  # noqa: E402
from scriba.embedded.etcd import EtcdCluster  # noqa: E402

VALUE_BYTES = 1024


def run_scriba_bench(uri: str, *, seconds: float | None, entries: int | None, inflight: int, ledgers: int,
                     batch_entries: int = 512, transport: str = "binary",
                     append_api: str = "callback") -> dict[str, Any]:
    argv = [sys.executable, "-m", "scriba.cli", "--log-level", "warning", "bench", "--metadata", uri,
            "--ensemble", "3", "--write", "3", "--ack", "2", "--size", str(VALUE_BYTES),
            "--inflight", str(inflight), "--ledgers", str(ledgers), "--json", "--quiet",
            "--batch-entries", str(batch_entries), "--transport", transport, "--append-api", append_api]
    argv += ["--seconds", str(seconds)] if seconds is not None else ["--entries", str(entries)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=(seconds or 60) + 120)
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise RuntimeError(f"scriba bench failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout[done.stdout.index("{"):])
    return result


def _cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 when unknown)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _written_bytes(pid: int | None) -> int:
    """Bytes process ``pid`` has caused to be written to storage so far (0 when unknown)."""
    if pid is None:
        return 0
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def settle(bookies: list[BookieProcess], *, quiet_s: float = 1.0, timeout_s: float = 30.0) -> float:
    """Wait until the bookies have been idle for ``quiet_s`` (less than 1 MiB written and
    at most 2 clock ticks of CPU each per 0.25 s), at most ``timeout_s``; returns the
    seconds waited. A throughput run leaves each bookie flushing its write cache (tens of
    MB to its entry log and index, seconds of disk and CPU) after its client has gone: a
    one-in-flight run started then measures that flush, not the append path."""
    t0 = time.monotonic()
    quiet_since: float | None = None
    prev: list[tuple[int, float]] | None = None
    while (now := time.monotonic()) - t0 < timeout_s:
        cur = [(_written_bytes(b.pid), _cpu_s(b.pid)) for b in bookies]
        if prev is not None and all(w - pw < 1 << 20 and c - pc <= 2 / os.sysconf("SC_CLK_TCK")
                                    for (w, c), (pw, pc) in zip(cur, prev, strict=True)):
            quiet_since = quiet_since if quiet_since is not None else now
            if now - quiet_since >= quiet_s:
                break
        else:
            quiet_since = None
        prev = cur
        time.sleep(0.25)
    return time.monotonic() - t0


def measured(bookies: list[BookieProcess], bench: Any) -> dict[str, Any]:
    """``bench()``'s result with each bookie's CPU per confirmed entry (us) beside it."""
    before = [_cpu_s(b.pid) for b in bookies]
    result: dict[str, Any] = bench()
    entries = max(1, int(result.get("entries", 0)))
    result["bookie_cpu_us_per_entry"] = [
        round((_cpu_s(b.pid) - t0) / entries * 1e6, 1) for b, t0 in zip(bookies, before, strict=True)]
    return result


def scriba_side(base: Path, *, seconds: float, inflights: list[int], runs: int, ledgers: list[int],
                latency_entries: int, batch_entries: int, transports: list[str],
                append_api: str = "callback") -> dict[str, Any]:
    etcd = EtcdCluster(base / "meta-etcd", 1)
    etcd.start()
    uri = etcd.uri("bench")
    bookies = [BookieProcess(base / f"bookie-{i}", uri, bookie_id=f"bookie-{i}") for i in range(3)]
    out: dict[str, Any] = {}
    try:
        for b in bookies:
            b.start()
        out["fdatasync"] = raw_fdatasync(base, 2.0, record_bytes=4096)
        for transport in transports:
            throughput = {
                f"{n}x{nl}": [measured(bookies, lambda n=n, nl=nl, transport=transport: run_scriba_bench(
                    uri, seconds=seconds, entries=None, inflight=n, ledgers=nl, batch_entries=batch_entries,
                    transport=transport, append_api=append_api)) for _ in range(runs)]
                for n in inflights for nl in ledgers
            }
            settle(bookies)
            latency = run_scriba_bench(uri, seconds=None, entries=latency_entries, inflight=1, ledgers=1,
                                       transport=transport, append_api=append_api)
            settle(bookies)
            floor = asyncio.run(transport_latency(bookies, latency_entries, transport))
            out[transport] = {"throughput": throughput, "one_in_flight": latency, "transport_one_in_flight": floor}
    finally:
        for b in bookies:
            b.stop()
        etcd.stop()
    return out


async def transport_latency(bookies: list[BookieProcess], count: int, wire: str) -> dict[str, Any]:
    """The floor under an append: one packed entry to 3 bookies through the bare
    transport, waiting for 2 acks (no client core, no metadata)."""
    from scriba.client.binary_transport import BinaryTransport
    from scriba.client.grpc_transport import GrpcBookieTransport
    from scriba.entry import Crc32cDigest, master_key, pack_entry
    from scriba.ids import BookieId, EntryId, LedgerId

    by_id = {b.bookie_id: b for b in bookies}
    transport = (
        GrpcBookieTransport(lambda b: by_id[b].address) if wire == "grpc"
        else BinaryTransport(lambda b: by_id[b].address, resolve_binary=lambda b: by_id[b].binary_address)
    )
    digest, key, loop = Crc32cDigest(), master_key(b"floor"), asyncio.get_running_loop()
    latencies: list[float] = []
    ledger_id = LedgerId((1 << 62) + int(time.time() * 1000) % (1 << 30))
    ids = [BookieId(b) for b in by_id]
    try:
        for e in range(count):
            done: asyncio.Future[None] = loop.create_future()
            acks = [0]

            def on_responses(b: BookieId, lid: int, eids: list[int], status: Any, done: Any = done, acks: Any = acks) -> None:
                acks[0] += len(eids)
                if acks[0] >= min(2, len(ids)) and not done.done():
                    done.set_result(None)

            data = pack_entry(digest, ledger_id, e, e - 1, 0, b"v" * VALUE_BYTES)
            t0 = time.perf_counter()
            transport.add_entry(ids, ledger_id, EntryId(e), key, data, on_responses)
            await asyncio.wait_for(done, 10)
            latencies.append((time.perf_counter() - t0) * 1000)
    finally:
        await transport.close()
    return {"latency_ms_p50": round(_pct(latencies, 0.50), 3), "latency_ms_p99": round(_pct(latencies, 0.99), 3)}


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


async def etcd_leader(endpoints: list[tuple[str, int]]) -> tuple[str, int]:
    """The endpoint of the current leader (a user's best client writes to it directly)."""
    import aetcd

    async with aetcd.Client(host=endpoints[0][0], port=endpoints[0][1], timeout=10) as client:
        status = await client.status()
    urls = set(status.leader.client_urls) if status.leader is not None else set()
    for host, port in endpoints:
        if f"http://{host}:{port}" in urls:
            return host, port
    raise RuntimeError(f"no endpoint of {endpoints} leads (leader urls {sorted(urls)})")


async def etcd_puts(endpoint: tuple[str, int], *, seconds: float | None, count: int | None,
                    inflight: int) -> dict[str, Any]:
    """Puts of 1 KiB values through one client to one member (the leader), ``inflight`` at once."""
    import aetcd

    value = b"v" * VALUE_BYTES
    latencies: list[float] = []
    issued = 0
    stop_at = time.monotonic() + seconds if seconds is not None else float("inf")
    async with aetcd.Client(host=endpoint[0], port=endpoint[1], timeout=10) as client:

        async def worker(w: int) -> None:
            nonlocal issued
            while time.monotonic() < stop_at and (count is None or issued < count):
                n = issued
                issued += 1
                t0 = time.perf_counter()
                await client.put(f"bench/{w}/{n}".encode(), value)
                latencies.append((time.perf_counter() - t0) * 1000)

        t0 = time.monotonic()
        await asyncio.gather(*(worker(w) for w in range(inflight)))
        elapsed = time.monotonic() - t0
    return {
        "puts": len(latencies),
        "seconds": round(elapsed, 3),
        "puts_per_s": round(len(latencies) / elapsed, 1),
        "latency_ms_p50": round(_pct(latencies, 0.50), 3),
        "latency_ms_p99": round(_pct(latencies, 0.99), 3),
        "inflight": inflight,
    }


def etcd_side(base: Path, *, seconds: float, inflights: list[int], runs: int,
              latency_entries: int) -> dict[str, Any]:
    """A 3-member etcd with etcd's default timing flags, leader-only client, as a user runs it."""
    etcd = EtcdCluster(base / "baseline-etcd", 3, fast_election=False)
    etcd.start()
    try:
        leader = asyncio.run(etcd_leader(etcd.endpoints))
        throughput = {
            n: [asyncio.run(etcd_puts(leader, seconds=seconds, count=None, inflight=n))
                for _ in range(runs)]
            for n in inflights
        }
        latency = asyncio.run(etcd_puts(leader, seconds=None, count=latency_entries, inflight=1))
    finally:
        etcd.stop()
    return {"throughput": throughput, "one_in_flight": latency, "leader": f"{leader[0]}:{leader[1]}"}


def spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": ordered[len(ordered) // 2], "min": ordered[0], "max": ordered[-1]}


def _fmt(sp: dict[str, float], unit: str) -> str:
    return f"{sp['median']:,.0f} {unit} (min {sp['min']:,.0f}, max {sp['max']:,.0f})"


def _cpu(results: list[dict[str, Any]]) -> str:
    """Median client and per-bookie CPU per confirmed append (us) over runs."""
    client = sorted(r.get("client_cpu_us_per_entry", 0.0) for r in results)[len(results) // 2]
    per_bookie = [sorted(r["bookie_cpu_us_per_entry"][i] for r in results)[len(results) // 2]
                  for i in range(len(results[0]["bookie_cpu_us_per_entry"]))]
    return f"CPU/append: client {client:.0f} us, bookies {', '.join(f'{v:.0f}' for v in per_bookie)} us"


def report_scriba(scriba: dict[str, Any], transports: list[str], runs: int) -> dict[str, dict[str, Any]]:
    """Print each transport's figures and the ratios; returns the median rates by transport and setting."""
    sync = scriba["fdatasync"]
    print(f"fdatasync 4 KiB on the bookies' disk, same run: p50 {sync['p50_ms']:.3f} ms p99 {sync['p99_ms']:.3f} ms")
    rates: dict[str, dict[str, Any]] = {}
    for t in transports:
        side = scriba[t]
        rates[t] = {k: spread([r["entries_per_s"] for r in rs]) for k, rs in side["throughput"].items()}
        for k, sp in rates[t].items():
            n, nl = k.split("x")
            print(f"scriba {t} E3/W3/A2 1 KiB, {n} in flight, {nl} ledger(s), {runs} runs: {_fmt(sp, 'appends/s')}; "
                  f"{_cpu(side['throughput'][k])}")
        lat, floor = side["one_in_flight"], side["transport_one_in_flight"]
        print(f"scriba {t} one in flight: p50 {lat['latency_ms_p50']} ms p99 {lat['latency_ms_p99']} ms "
              f"(fdatasync p50 {sync['p50_ms']:.3f} p99 {sync['p99_ms']:.3f}); bare transport (2 of 3 acks): "
              f"p50 {floor['latency_ms_p50']} ms p99 {floor['latency_ms_p99']} ms")
        for k, sp in rates[t].items():
            n, nl = k.split("x")
            one = rates[t].get(f"{n}x1")
            if nl != "1" and one:
                print(f"scriba {t} {nl} ledgers / 1 ledger at {n} in flight: {sp['median'] / one['median']:.2f}x")
    if len(transports) == 2:
        a, b = transports
        for k in rates[a]:
            print(f"ratio {b}/{a} throughput {k.replace('x', ' in flight x ')} ledger(s): "
                  f"{rates[b][k]['median'] / rates[a][k]['median']:.2f}x")
        la, lb = scriba[a]["one_in_flight"], scriba[b]["one_in_flight"]
        print(f"ratio {b}/{a} one-in-flight p50: {lb['latency_ms_p50'] / la['latency_ms_p50']:.2f}x, "
              f"p99: {lb['latency_ms_p99'] / la['latency_ms_p99']:.2f}x")
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="per throughput run")
    parser.add_argument("--runs", type=int, default=3, help="throughput runs per setting (median, min, max)")
    parser.add_argument("--inflight", type=int, default=2000, help="Scriba's best setting")
    parser.add_argument("--same-inflight", type=int, default=256,
                        help="the concurrency both systems run at for the same-concurrency ratio")
    parser.add_argument("--etcd-inflight", type=int, nargs="+", default=[256, 1024],
                        help="etcd settings tried; the best is etcd's best setting")
    parser.add_argument("--ledgers", type=int, nargs="+", default=[1, 4, 64],
                        help="ledger counts the throughput runs spread their appends over")
    parser.add_argument("--transport", nargs="+", choices=["grpc", "binary"], default=["grpc", "binary"])
    parser.add_argument("--skip-etcd", action="store_true", help="Scriba only (no etcd baseline)")
    parser.add_argument("--latency-entries", type=int, default=2000)
    parser.add_argument("--batch-entries", type=int, default=512, help="adds per message per bookie")
    parser.add_argument("--append-api", choices=["callback", "future"], default="callback",
                        help="the writer API scriba bench appends through (append_callback or append_async)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    ledgers = sorted(set(args.ledgers) | {1})
    etcd_inflights = sorted(set(args.etcd_inflight) | {args.same_inflight})
    with tempfile.TemporaryDirectory(prefix="scriba-bench-") as tmp:
        base = Path(tmp)
        scriba = scriba_side(base, seconds=args.seconds, inflights=sorted({args.inflight, args.same_inflight}),
                             runs=args.runs, ledgers=ledgers, latency_entries=args.latency_entries,
                             batch_entries=args.batch_entries, transports=args.transport,
                             append_api=args.append_api)
        etcd = None if args.skip_etcd else etcd_side(base, seconds=args.seconds, inflights=etcd_inflights,
                                                     runs=args.runs, latency_entries=args.latency_entries)
    rates = report_scriba(scriba, args.transport, args.runs)
    report: dict[str, Any] = {"scriba": scriba, "etcd": etcd}
    if etcd is not None:
        best_t = args.transport[-1]
        s_rates = {int(k.split("x")[0]): sp for k, sp in rates[best_t].items() if k.endswith("x1")}
        e_rates = {n: spread([r["puts_per_s"] for r in rs]) for n, rs in etcd["throughput"].items()}
        for n, sp in sorted(e_rates.items()):
            print(f"etcd x3 (default flags, leader-only client) 1 KiB puts, {n} in flight, {args.runs} runs: "
                  f"{_fmt(sp, 'puts/s')}")
        same = s_rates[args.same_inflight]["median"] / e_rates[args.same_inflight]["median"]
        e_best_n = max(e_rates, key=lambda n: e_rates[n]["median"])
        best = s_rates[args.inflight]["median"] / e_rates[e_best_n]["median"]
        print(f"ratio scriba ({best_t})/etcd at the same concurrency ({args.same_inflight} in flight): {same:.2f}x")
        print(f"ratio scriba ({best_t})/etcd at each one's best setting ({args.inflight} vs {e_best_n} in flight): "
              f"{best:.2f}x")
        s_lat, e_lat = scriba[best_t]["one_in_flight"], etcd["one_in_flight"]
        print(f"one in flight: scriba ({best_t}) p50 {s_lat['latency_ms_p50']} ms p99 {s_lat['latency_ms_p99']} ms; "
              f"etcd (leader) p50 {e_lat['latency_ms_p50']} ms p99 {e_lat['latency_ms_p99']} ms")
        report.update(ratio_same_concurrency=same, ratio_best_setting=best)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
