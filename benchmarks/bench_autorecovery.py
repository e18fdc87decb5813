"""Re-replication of a bookie holding 1 GiB, and its effect on a concurrent writer.

    .venv/bin/python benchmarks/bench_autorecovery.py [--gib 1] [--size 4096] [--writer-s 10]
        [--metadata etcd|zk] [--entries-per-s 0]
    .venv/bin/python benchmarks/bench_autorecovery.py --in-memory [--ledgers N] [--entries M] ...

Default (real processes, what #19 asks): an etcd (or ZooKeeper) and 3 bookie processes;
``--gib`` of entries of ``--size`` bytes are written to E=3/W=3/A=3 ledgers, so every
bookie holds all of it; a 4th (spare) bookie joins. Then, in the same run:

1. baseline: a writer appends (256 in flight, same entry size) for ``--writer-s`` alone;
2. bookie 0 is SIGKILLed; once its registration is gone, ``scriba autorecovery run``
   (auditor + one worker, delay 0, ``--entries-per-s`` as its throttle) starts, and the
   same writer runs again for ``--writer-s`` (or until the repair ends, if sooner); the
   repair is then awaited (at most ``--repair-timeout-s``) until every ledger is off the
   dead bookie. The writer is bounded in time so a stuck repair cannot fill the disk.

Printed: the copy rate (entries/s and MB/s, from the worker's own /metrics counters,
over the time from its first copied entry to the last ledger moved, and over the
whole repair from the autorecovery start), and the writer's rate alone and during the
repair with their ratio. Figures vary a lot on a shared 2-core machine: every process
(store, 4 bookies, worker, writer) shares the cores.

``--in-memory``: the older mode on ``scriba.testing.sim.StorageTransport``'s in-memory
bookies (no processes, no disk): the worker's own cost per entry only.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scriba.autorecovery.config import AutorecoveryConfig
from scriba.autorecovery.records import Mark, Reason, UnderReplicated, underreplicated_key
from scriba.autorecovery.worker import ReplicationWorker
from scriba.client import Client
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta import connect
from scriba.meta.records import bookie_key
from scriba.testing.cluster import LocalCluster
from scriba.testing.sim import StorageTransport, register_bookies

BOOKIES = [f"bk{i}" for i in range(6)]


async def setup(n: int, m: int, size: int) -> tuple[Client, StorageTransport, BookieId, list[int]]:
    store = await connect(f"memory://bench{uuid.uuid4().hex[:6]}")
    await register_bookies(store, BOOKIES)
    transport = StorageTransport(BOOKIES)
    client = await Client.connect(store.uri, store=store, transport=transport)
    ids = []
    payload = b"x" * size
    for _ in range(n):
        w = await client.create_ledger(3, 3, 2)
        for _ in range(m - 1):
            w.append_async(payload)
        await w.append(payload)
        await w.close()
        ids.append(w.ledger_id)
    victim = BookieId(BOOKIES[0])
    transport.down.add(victim)
    await store.delete(bookie_key(victim))
    for lid in ids:
        md = await client.ledger_metadata(lid)
        if victim in md.current_ensemble:
            await store.create(underreplicated_key(lid), UnderReplicated(
                LedgerId(lid), (Mark(EntryId(0), victim, Reason.LOST),)).to_bytes())
    while victim in client.registry.registrations:
        await asyncio.sleep(0.01)
    return client, transport, victim, ids


async def writer_rate(client: Client, seconds: float, size: int) -> float:
    w = await client.create_ledger(3, 3, 2)
    payload = b"w" * size
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        futs = [w.append_async(payload) for _ in range(64)]
        await asyncio.gather(*futs)
        n += 64
    elapsed = time.perf_counter() - start
    await w.close()
    return n / elapsed


async def main(args: argparse.Namespace) -> None:
    client, transport, _victim, _ids = await setup(args.ledgers, args.entries, args.size)
    worker = ReplicationWorker(client, AutorecoveryConfig())
    start = time.perf_counter()
    await worker.run_once()
    elapsed = time.perf_counter() - start
    copied = sum(o.entries for o in worker.outcomes)
    size = sum(o.bytes for o in worker.outcomes)
    print(f"copy: {copied} entries, {size / 1e6:.1f} MB in {elapsed:.2f} s: "
          f"{copied / elapsed:,.0f} entries/s, {size / 1e6 / elapsed:.1f} MB/s")
    await client.close()
    await transport.close()

    client, transport, _victim, _ids = await setup(args.ledgers, args.entries, args.size)
    alone = await writer_rate(client, args.writer_s, args.size)
    throttled = ReplicationWorker(client, AutorecoveryConfig(entries_per_s=args.entries_per_s))
    stop = asyncio.Event()
    repair = asyncio.create_task(throttled.run(stop))
    during = await writer_rate(client, args.writer_s, args.size)
    stop.set()
    await repair
    print(f"writer alone: {alone:,.0f} entries/s; during a repair at {args.entries_per_s:,.0f} "
          f"entries/s: {during:,.0f} entries/s (ratio {during / alone:.2f}); "
          f"the worker copied {sum(o.entries for o in throttled.outcomes)} entries meanwhile")
    await client.close()
    await transport.close()


# --- real processes: a bookie holding --gib, repaired by `scriba autorecovery run` ------------


def _metric(url: str, name: str) -> float:
    """One counter from a Prometheus text page (0 if absent or unreachable)."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as page:
            text = page.read().decode()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith(name + "_total ") or line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


async def fill(uri: str, total_bytes: int, size: int) -> tuple[int, int]:
    """Write ``total_bytes`` in entries of ``size`` to E=3/W=3/A=3 ledgers; (ledgers, entries)."""
    payload = b"r" * size
    per_ledger = max(1, (64 << 20) // size)  # 64 MiB ledgers
    entries = ledgers = 0
    async with Client.connect(uri) as client:
        while entries * size < total_bytes:
            # A=3: every entry is on all three before it is confirmed. With A=2 a client that
            # exits right after close can leave the last entries on two bookies (as in
            # BookKeeper); the auditor's check then rightly marks the third, which is not
            # the repair measured here.
            w = await client.create_ledger(3, 3, 3, password=b"bench")
            n = min(per_ledger, -(-(total_bytes - entries * size) // size))
            for i in range(n):
                w.append_async(payload)
                if i % 256 == 255:
                    await w.append(payload)
            await w.append(payload)
            await w.close()
            entries += n + 1 + n // 256
            ledgers += 1
    return ledgers, entries


async def writer_for(
    client: Client, size: int, seconds: float, done: Callable[[], bool], *, delete: bool = False
) -> float:
    """Entries/s of one writer, 256 in flight, for ``seconds`` or until ``done()`` (checked per
    batch), whichever comes first: bounded, so a repair that never ends cannot fill the disk.
    ``delete``: delete the ledger after (the baseline's, so the lost bookie holds the fill only)."""
    w = await client.create_ledger(3, 3, 2)
    payload = b"w" * size
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds and not done():
        await asyncio.gather(*(w.append_async(payload) for _ in range(256)))
        n += 256
    elapsed = time.perf_counter() - start
    await w.close()
    if delete:
        await client.delete_ledger(w.ledger_id)
    return n / elapsed


async def repair_phase(uri: str, cluster: LocalCluster, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    from scriba.autorecovery.commands import ledgers_using
    from scriba.embedded.process import ServerProcess, free_port, python_module_argv

    async with Client.connect(uri) as client:
        alone = await writer_for(client, args.size, args.writer_s, lambda: False, delete=True)
        victim = cluster.bookies[0].bookie_id
        held = [md for md in [await client.ledger_metadata(i) for i in await client.list_ledgers()]
                if BookieId(victim) in md.bookies()]
        held_bytes = sum(md.length for md in held)
        cluster.bookies.kill(0)
        while victim in client.registry.registrations:
            await asyncio.sleep(0.05)
        port = free_port()
        metrics = f"http://127.0.0.1:{port}/metrics"
        argv = python_module_argv("scriba.cli", "autorecovery", "--metadata", uri, "run", "--id", "bench",
                                  "--delay-s", "0", "--tick-s", "0.2", "--http", f"127.0.0.1:{port}",
                                  "--entries-per-s", f"{args.entries_per_s:g}")
        worker = ServerProcess("autorecovery bench", argv, base / "autorecovery.log")
        t0 = time.perf_counter()
        worker.start()
        first_copy: list[float] = []
        finished: list[float] = []

        async def watch() -> None:
            while True:
                if not first_copy and _metric(metrics, "scriba_autorecovery_entries_replicated") > 0:
                    first_copy.append(time.perf_counter())
                if not await ledgers_using(client.store, BookieId(victim)):
                    finished.append(time.perf_counter())
                    return
                await asyncio.sleep(0.25)

        watcher = asyncio.create_task(watch())
        try:
            during = await writer_for(client, args.size, args.writer_s, lambda: bool(finished))
            during_s = time.perf_counter() - t0
            await asyncio.wait_for(watcher, args.repair_timeout_s)
            entries = _metric(metrics, "scriba_autorecovery_entries_replicated")
            copied = _metric(metrics, "scriba_autorecovery_bytes_replicated")
        finally:
            watcher.cancel()
            worker.stop()
    whole_s = finished[0] - t0
    copy_s = finished[0] - (first_copy[0] if first_copy else t0)
    return {"ledgers": len(held), "held_bytes": held_bytes, "entries": entries, "bytes": copied,
            "whole_s": whole_s, "copy_s": copy_s, "alone": alone, "during": during,
            "during_s": min(during_s, whole_s)}


def run_processes(args: argparse.Namespace) -> int:
    import tempfile

    from scriba.log import configure

    configure(level="warning")
    total = int(args.gib * (1 << 30))
    with tempfile.TemporaryDirectory(prefix="scriba-bench-ar-") as tmp, \
            LocalCluster(Path(tmp), metadata=args.metadata, prefix="bench") as cluster:
        cluster.bookies.start_bookies(3, extra_args=["--session-timeout-s", "2"])
        t = time.perf_counter()
        ledgers, entries = asyncio.run(fill(cluster.uri, total, args.size))
        fill_s = time.perf_counter() - t
        print(f"filled: {ledgers} ledgers, {entries:,} entries of {args.size} B "
              f"({entries * args.size / 1e6:,.0f} MB) in {fill_s:.1f} s", flush=True)
        cluster.bookies.start_bookies(1, extra_args=["--session-timeout-s", "2"])  # the spare
        r = asyncio.run(repair_phase(cluster.uri, cluster, args, Path(tmp)))
    mb = r["bytes"] / 1e6
    print(f"repair of a bookie holding {r['held_bytes'] / 1e6:,.0f} MB in {r['ledgers']} ledgers "
          f"({args.metadata}, throttle {args.entries_per_s or 'none'}): copied {r['entries']:,.0f} entries, "
          f"{mb:,.0f} MB")
    print(f"  copy rate: {r['entries'] / r['copy_s']:,.0f} entries/s, {mb / r['copy_s']:.1f} MB/s "
          f"(first copy to last ledger moved, {r['copy_s']:.1f} s); whole repair from the worker's start "
          f"{r['whole_s']:.1f} s = {mb / r['whole_s']:.1f} MB/s")
    print(f"  writer ({args.size} B entries, 256 in flight): alone {r['alone']:,.0f} entries/s; during the "
          f"repair (its first {r['during_s']:.1f} s) {r['during']:,.0f} entries/s; ratio {r['during'] / r['alone']:.2f}")
    print("  (a shared 2-core machine: store, 4 bookies, worker and writer share the cores)")
    return 0 if r["bytes"] >= r["held_bytes"] else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--in-memory", action="store_true", help="the in-process mode (no processes, no disk)")
    p.add_argument("--gib", type=float, default=1.0, help="data the lost bookie holds (processes mode)")
    p.add_argument("--metadata", default="etcd", choices=["etcd", "zk"])
    p.add_argument("--ledgers", type=int, default=20, help="in-memory mode")
    p.add_argument("--entries", type=int, default=1000, help="in-memory mode")
    p.add_argument("--size", type=int, default=None, help="entry size (default 4096; in-memory: 1024)")
    p.add_argument("--entries-per-s", type=float, default=None,
                   help="the worker's throttle (processes default 0: none; in-memory: 5000)")
    p.add_argument("--writer-s", type=float, default=None,
                   help="writer seconds, alone and during the repair (default 10; in-memory 3)")
    p.add_argument("--repair-timeout-s", type=float, default=900.0, help="give up on a repair after this long")
    a = p.parse_args()
    if a.in_memory:
        a.size = a.size or 1024
        a.entries_per_s = 5000.0 if a.entries_per_s is None else a.entries_per_s
        a.writer_s = a.writer_s or 3.0
        asyncio.run(main(a))
    else:
        a.size = a.size or 4096
        a.entries_per_s = a.entries_per_s or 0.0
        a.writer_s = a.writer_s or 10.0
        raise SystemExit(run_processes(a))
