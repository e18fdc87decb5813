"""Benchmark: catch-up reads of a closed ledger against the same ledger's append rate.

1. A fresh cluster: a 1-member etcd for metadata and 3 bookie processes.
2. Per payload size (default 100 B and 1 KiB): one client appends ``--entries``
   entries to a new E3/W3/A2 ledger (``--inflight`` in flight) and closes it -- the
   append rate is the baseline; then it opens the ledger and reads it from entry 0 to
   the end with one reader (``LedgerReader.read``), once right after the appends ("hot":
   the newest entries from the bookies' write caches, the rest from entry logs once the
   cache was flushed), and, with ``--cold``, once more after every bookie was restarted
   (a graceful stop checkpoints the cache: every entry comes from the entry logs,
   through the page cache).
3. Each read is taken with the packed range answers (``ReadRangeRequest.packed``, the
   default) and, with ``--modes packed,entries,old``, in the same run with the per-entry
   answers an old client asks for ("entries"), and with those and the read defaults
   clients had before packed reads ("old": 512 entries outstanding, 128 per range read;
   the bookie's storage reads a range a stretch at a time in every mode).

Prints entries/s and MB/s of payload per phase, the ratio read/append, and the CPU time
the reader and the bookies spent per entry read (steadier than rates when the machine is
busy).

Run: ``.venv/bin/python benchmarks/bench_reads.py [--entries 200000] [--sizes 100,1024]
[--modes packed,entries,old] [--cold] [--json OUT]``.
Not a timed test: the machine has 2 cores shared by every process, so figures vary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
from scriba.log import configure  # noqa: E402

PASSWORD = b"scriba-bench-reads"
MODES = ("packed", "entries", "old")


async def _client(uri: str, mode: str) -> tuple[Any, Any]:
    from scriba.client import Client, ClientConfig
    from scriba.client.grpc_transport import GrpcBookieTransport
    from scriba.client.read_core import ReadConfig
    from scriba.client.transport import TransportConfig

    holder: list[Any] = []
    transport = GrpcBookieTransport(
        lambda b: holder[0].registry.address(b), TransportConfig(packed_reads=mode == "packed")
    )
    config = ClientConfig(read=ReadConfig(entries_window=512, batch_entries_max=128)) if mode == "old" else None
    client = await Client.connect(uri, transport=transport, config=config)
    holder.append(client)
    return client, transport


async def append_phase(uri: str, *, entries: int, size: int, inflight: int) -> dict[str, Any]:
    """Append ``entries`` payloads of ``size`` bytes to a new ledger; its id and rate."""
    client, transport = await _client(uri, "packed")
    try:
        writer = await client.create_ledger(3, 3, 2, password=PASSWORD)
        payload = b"r" * size
        window = asyncio.Semaphore(inflight)
        failures: list[BaseException] = []

        def done(fut: asyncio.Future[Any]) -> None:
            window.release()
            if not fut.cancelled() and fut.exception() is not None:
                failures.append(fut.exception())  # type: ignore[arg-type]

        t0 = time.perf_counter()
        for _ in range(entries):
            await window.acquire()
            if failures:
                raise failures[0]
            writer.append_async(payload).add_done_callback(done)
        for _ in range(inflight):
            await window.acquire()
        elapsed = time.perf_counter() - t0
        if failures:
            raise failures[0]
        await writer.close()
        return {"ledger_id": int(writer.ledger_id), **_rates(entries, size, elapsed)}
    finally:
        await client.close()
        await transport.close()


async def read_phase(
    uri: str, ledger_id: int, *, mode: str, size: int, expected: int, pids: list[int]
) -> dict[str, Any]:
    """Read the whole closed ledger once with one reader; check count and sizes. Also the
    CPU time the reader and the bookies spent per entry (steadier than rates on a busy
    machine)."""
    client, transport = await _client(uri, mode)
    try:
        reader = await client.open_ledger(ledger_id, PASSWORD)
        count = 0
        nbytes = 0
        bookies_cpu = pids_cpu_s(pids)
        cpu = time.process_time()
        t0 = time.perf_counter()
        async for entry in reader.read(0):
            count += 1
            nbytes += len(entry.payload)
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu
        bookies_cpu = pids_cpu_s(pids) - bookies_cpu
        if count != expected or nbytes != expected * size:
            raise RuntimeError(f"read {count} entries / {nbytes} bytes, expected {expected} of {size} B")
        return {
            **_rates(count, size, elapsed),
            "reader_cpu_us_per_entry": round(cpu / count * 1e6, 2),
            "bookies_cpu_us_per_entry": round(bookies_cpu / count * 1e6, 2),
        }
    finally:
        await client.close()
        await transport.close()


def _rates(count: int, size: int, elapsed: float) -> dict[str, Any]:
    return {
        "entries": count,
        "seconds": round(elapsed, 3),
        "entries_per_s": round(count / elapsed, 1),
        "mb_per_s": round(count * size / elapsed / 1e6, 2),
    }


async def run(base: Path, *, entries: int, sizes: list[int], modes: list[str], inflight: int,
              cold: bool) -> dict[str, Any]:
    etcd = EtcdCluster(base / "etcd", 1)
    await asyncio.to_thread(etcd.start)
    uri = etcd.uri("bench-reads")
    bookies = [BookieProcess(base / f"bookie-{i}", uri, bookie_id=f"bookie-{i}") for i in range(3)]
    results: dict[str, Any] = {}
    try:
        for b in bookies:
            await asyncio.to_thread(b.start)
        ledgers: dict[int, int] = {}
        for size in sizes:
            appended = await append_phase(uri, entries=entries, size=size, inflight=inflight)
            ledgers[size] = appended["ledger_id"]
            results[f"{size}B"] = {"append": appended}
            for mode in modes:
                results[f"{size}B"][f"read_hot_{mode}"] = await read_phase(
                    uri, appended["ledger_id"], mode=mode, size=size, expected=entries, pids=_pids(bookies))
        if cold:
            for b in bookies:
                await asyncio.to_thread(b.restart)
            for size in sizes:
                for mode in modes:
                    results[f"{size}B"][f"read_cold_{mode}"] = await read_phase(
                        uri, ledgers[size], mode=mode, size=size, expected=entries, pids=_pids(bookies))
    finally:
        for b in bookies:
            b.stop()
        etcd.stop()
    return results


def _pids(bookies: list[BookieProcess]) -> list[int]:
    return [b.pid for b in bookies if b.pid is not None]


def report(results: dict[str, Any]) -> None:
    for size, phases in results.items():
        append = phases["append"]
        print(f"{size}: append {append['entries_per_s']:,.0f} entries/s ({append['mb_per_s']} MB/s)")
        for name, r in phases.items():
            if name == "append":
                continue
            ratio = r["entries_per_s"] / append["entries_per_s"] if append["entries_per_s"] else float("inf")
            print(f"  {name:18s} {r['entries_per_s']:>10,.0f} entries/s {r['mb_per_s']:>7} MB/s"
                  f"  read/append {ratio:.2f}x  CPU us/entry: reader {r['reader_cpu_us_per_entry']}"
                  f" bookies {r['bookies_cpu_us_per_entry']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=200_000, help="entries per ledger")
    parser.add_argument("--sizes", default="100,1024", help="payload sizes in bytes, comma-separated")
    parser.add_argument("--modes", default="packed", help=f"read answers to measure: {','.join(MODES)}")
    parser.add_argument("--inflight", type=int, default=2000, help="appends in flight")
    parser.add_argument("--cold", action="store_true", help="also read after restarting every bookie")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    configure(level="warning", stream=sys.stderr)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    if args.entries < 1 or not sizes or any(s < 0 for s in sizes) or any(m not in MODES for m in modes):
        parser.error(f"need --entries >= 1, sizes >= 0 and modes among {MODES}")
    with tempfile.TemporaryDirectory(prefix="scriba-bench-reads-") as tmp:
        results = asyncio.run(run(Path(tmp), entries=args.entries, sizes=sizes, modes=modes,
                                  inflight=args.inflight, cold=args.cold))
    report(results)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
