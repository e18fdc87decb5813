"""Soak (not a test): write for minutes while a random bookie is SIGKILLed every interval.

A real etcd and 4 bookie processes (E3/W3/A2, one spare); one writer appends 1 KiB entries
with many in flight, rolling to a new ledger every ``--ledger-entries``; a killer SIGKILLs
a random bookie every ``--kill-every-s`` and restarts it (same id, dirs and port) at once.
At the end every ledger is read back and the acked-set checker must find nothing lost and
nothing invented. Prints the figures and the bookies' and the client's memory.

    .venv/bin/python benchmarks/soak_bookie_kills.py --minutes 8 --kill-every-s 60
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

from scriba.grpc_runtime import apply_defaults

apply_defaults()

from scriba.client import Client, ClientConfig  # noqa: E402
from scriba.testing.checkers.acked_set import check_acked_set  # noqa: E402
from scriba.testing.cluster import LocalCluster  # noqa: E402

PASSWORD = b"soak"


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


async def killer(cluster: LocalCluster, every_s: float, stop: asyncio.Event, kills: list[str]) -> None:
    rng = random.Random(23)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every_s)
            return
        except TimeoutError:
            pass
        bookie = cluster.bookies[rng.randrange(len(cluster.bookies))]
        await asyncio.to_thread(bookie.kill)
        kills.append(bookie.bookie_id)
        await asyncio.to_thread(bookie.start, 60.0)


async def soak(uri: str, cluster: LocalCluster, args: argparse.Namespace) -> int:
    payload = bytes(1024)
    acked: dict[tuple[int, int], bytes] = {}
    attempted: list[tuple[tuple[int, int], bytes]] = []
    failures: list[str] = []
    ledgers: list[int] = []
    kills: list[str] = []
    stop = asyncio.Event()
    config = ClientConfig(add_timeout_s=5.0)
    async with Client.connect(uri, config=config) as client:
        kill_task = asyncio.create_task(killer(cluster, args.kill_every_s, stop, kills))
        deadline = time.monotonic() + args.minutes * 60
        try:
            while time.monotonic() < deadline and not failures:
                w = await client.create_ledger(3, 3, 2, password=PASSWORD)
                ledgers.append(int(w.ledger_id))
                written = 0
                while written < args.ledger_entries and time.monotonic() < deadline:
                    n = min(args.window, args.ledger_entries - written)
                    data = [hashlib.blake2b(b"%d:%d" % (w.ledger_id, written + i), digest_size=16).digest()
                            + payload[16:] for i in range(n)]
                    futures = [w.append_async(d) for d in data]
                    results = await asyncio.gather(*futures, return_exceptions=True)
                    for d, r in zip(data, results, strict=True):
                        if isinstance(r, BaseException):
                            failures.append(f"{type(r).__name__}: {r}")
                        else:
                            acked[(int(w.ledger_id), int(r))] = d[:16]  # its digest prefix names it
                            attempted.append(((int(w.ledger_id), int(r)), d[:16]))
                    written += n
                    if failures:
                        break
                await w.close()
        finally:
            stop.set()
            await kill_task
        read: list[tuple[tuple[int, int], bytes]] = []
        bad_tails = 0
        for lid in ledgers:
            r = await client.open_ledger(lid, password=PASSWORD, recovery=False)
            if r.metadata.last_entry_id >= 0:
                async for e in r.read(0, r.metadata.last_entry_id):
                    read.append(((lid, int(e.entry_id)), e.payload[:16]))
                    bad_tails += e.payload[16:] != payload[16:]
    result = check_acked_set(attempted=attempted, acknowledged=list(acked.items()), read=read)
    bookie_rss = [rss_mb(cluster.bookies[i].pid or 0) for i in range(len(cluster.bookies))]
    client_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"soak: {args.minutes} min, {len(acked):,} entries confirmed over {len(ledgers)} ledgers, "
          f"{len(kills)} kills ({', '.join(kills)}), failed appends {len(failures)}, "
          f"lost {len(result.lost)}, unexpected {len(result.unexpected)}, bad payload tails {bad_tails}")
    print(f"memory: bookies {', '.join(f'{m:.0f}' for m in bookie_rss)} MB RSS; client max RSS {client_rss:.0f} MB")
    if failures:
        print("first failures:", failures[:3])
    return 0 if result.ok and not failures and not bad_tails else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--kill-every-s", type=float, default=60.0)
    parser.add_argument("--window", type=int, default=2000, help="appends in flight")
    parser.add_argument("--ledger-entries", type=int, default=200_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="scriba-soak-") as tmp, LocalCluster(Path(tmp)) as cluster:
        cluster.bookies.start_bookies(4)
        return asyncio.run(soak(cluster.uri, cluster, args))


if __name__ == "__main__":
    sys.exit(main())
