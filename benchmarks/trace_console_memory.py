"""Where the console's memory goes under churn: tracemalloc snapshots of a console process.

    .venv/bin/python benchmarks/trace_console_memory.py [--ledgers 2000] [--minutes 3]
        [--every 30] [--frames 6] [--out DIR]

The memory run of ``bench_console.py`` (a real etcd with N ledger records; per round one
ledger created and one deleted, then every page fetched), but the console runs in a child
process that traces its allocations (``tracemalloc``, ``--frames`` deep) and, every
``--every`` seconds, collects garbage, dumps a snapshot to ``DIR/snapNNN.pickle`` and logs
its traced size beside its RSS (``DIR/console.log``). At the end it prints those lines
and the allocation sites that grew most between the first snapshot and the last, grouped
by traceback. Traced memory flat while RSS grows points at the allocator or at memory
outside Python's (C libraries); a site that grows by rounds is a leak to chase. Tracing
slows the console several times over: rounds are far fewer than in ``bench_console.py``.

Found with it: the metadata drivers' watches kept their initial state for their whole
life, so every ledger present when the console started stayed in memory after its
deletion (``tests/meta/test_meta_watch_retention.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import aiohttp
from bench_console import _populate, _vm_rss_mb, _wait_synced, churn_round

from scriba.embedded.sandbox_children import start_child, stop_child
from scriba.meta import connect


async def child(uri: str, out: Path, every_s: float, frames: int) -> None:
    from scriba.console.cli import Console, ConsoleConfig
    from scriba.log import configure

    configure()
    tracemalloc.start(frames)
    console = Console(ConsoleConfig(uri, "127.0.0.1:0"))
    print(f"console: {await console.start()}", flush=True)
    started = time.monotonic()
    for n in range(1_000_000):
        await asyncio.sleep(every_s)
        gc.collect()
        tracemalloc.take_snapshot().dump(str(out / f"snap{n:03d}.pickle"))
        traced, _ = tracemalloc.get_traced_memory()
        print(f"snapshot {n}: t={time.monotonic() - started:.0f} s traced {traced / 2**20:.2f} MB "
              f"RSS {_vm_rss_mb(os.getpid()):.1f} MB objects {len(gc.get_objects())}",
              file=sys.stderr, flush=True)


async def parent(ledgers: int, minutes: float, every_s: float, frames: int, out: Path) -> int:
    """Runs the rounds against the traced console; returns how many ran."""
    from scriba.embedded.etcd import EtcdCluster

    with tempfile.TemporaryDirectory(prefix="trace-console-") as tmp:
        etcd = EtcdCluster(Path(tmp) / "etcd", 1)
        etcd.start()
        proc = None
        rounds = 0
        try:
            uri = etcd.uri("traceconsole")
            store = await connect(uri)
            await _populate(store, 1, ledgers)
            argv = [sys.executable, __file__, "--child", uri, "--out", str(out), "--every", str(every_s),
                    "--frames", str(frames)]
            proc, url = start_child(argv, out, "console", lambda line: line.removeprefix("console: ")
                                    if line.startswith("console: ") else None)
            async with aiohttp.ClientSession() as http:
                await _wait_synced(http, url, 300.0)
                end = time.monotonic() + minutes * 60
                while time.monotonic() < end:
                    await churn_round(store, http, url, ledgers + 1 + rounds, ledgers)
                    rounds += 1
            await store.close()
        finally:
            if proc is not None:
                stop_child(proc)  # our own child, by its handle
            etcd.stop()
    return rounds


def report(out: Path, frames: int, top: int = 10) -> None:
    """The child's snapshot lines, then the sites that grew most from the first snapshot to the last."""
    print("".join(line for line in (out / "console.log").read_text().splitlines(keepends=True)
                  if line.startswith("snapshot")), end="")
    snapshots = sorted(out.glob("snap*.pickle"))
    if len(snapshots) < 2:
        print("fewer than two snapshots: run longer")
        return
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    first = tracemalloc.Snapshot.load(str(snapshots[0])).filter_traces(ignore)
    last = tracemalloc.Snapshot.load(str(snapshots[-1])).filter_traces(ignore)
    print(f"grew most from {snapshots[0].name} to {snapshots[-1].name}:")
    for stat in last.compare_to(first, "traceback")[:top]:
        print(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+6d} blocks (now {stat.count})")
        for line in stat.traceback.format(most_recent_first=True)[:2 * frames]:
            print("    " + line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ledgers", type=int, default=2_000)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--every", type=float, default=30.0, help="seconds between snapshots")
    parser.add_argument("--frames", type=int, default=6, help="traceback depth kept per allocation")
    parser.add_argument("--out", type=Path, default=Path("trace-console"), help="snapshots and the console's log")
    parser.add_argument("--child", metavar="URI", help=argparse.SUPPRESS)  # the traced console itself
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(args.child, args.out, args.every, args.frames))
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        for old in [*args.out.glob("snap*.pickle"), args.out / "console.log"]:
            old.unlink(missing_ok=True)
        done = asyncio.run(parent(args.ledgers, args.minutes, args.every, args.frames, args.out))
        print(f"{done} rounds (ledgers created and deleted) over {args.minutes:g} min")
        report(args.out, args.frames)
