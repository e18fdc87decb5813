"""Re-replication rate and its effect on a concurrent writer (in-process bookies).

    .venv/bin/python benchmarks/bench_autorecovery.py [--ledgers N] [--entries M] [--size B]
        [--entries-per-s R] [--writer-s S]

Bookies are ``scriba.testing.sim.StorageTransport``'s in-memory storages on ``memory://``
(no processes, no disk: this measures the worker's own cost per entry — reads, digest
checks, recovery adds, the CAS — not a network or a journal). N closed ledgers of M
entries of B bytes on E=3/W=3/A=2; one bookie is lost; one worker repairs them.

Part 1: the copy rate (entries/s and MB/s) of one unthrottled worker.
Part 2: a writer appending for ``--writer-s`` seconds alone (the baseline), then while a
worker repairs (throttled to ``--entries-per-s``), same run; prints both rates and their
ratio. Figures are relative and noisy on a shared machine; the real-process figure comes
from the R13 test's timings.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

from scriba.autorecovery.config import AutorecoveryConfig
from scriba.autorecovery.records import Mark, Reason, UnderReplicated, underreplicated_key
from scriba.autorecovery.worker import ReplicationWorker
from scriba.client import Client
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta import connect
from scriba.meta.records import bookie_key
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


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--ledgers", type=int, default=20)
    p.add_argument("--entries", type=int, default=1000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--entries-per-s", type=float, default=5000)
    p.add_argument("--writer-s", type=float, default=3.0)
    asyncio.run(main(p.parse_args()))
