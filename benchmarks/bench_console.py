"""The console's own cost: a ledgers page over many ledgers, and its memory over a run.

    .venv/bin/python benchmarks/bench_console.py [--ledgers 10000] [--seconds 20]

N ledger records on ``memory://`` (no bookies: this measures the console — its mirror,
decoding, sorting, paging and rendering — not a store). The console runs in-process; an
HTTP client asks, in the same run, for ``/api/status`` (the baseline: a trivial answer)
and for ledger pages (HTML and JSON, first page and a middle one; the first request
decodes every record, later ones use the cache). Prints milliseconds per request and
the ratio to the baseline. Then it asks for pages in a loop for ``--seconds`` seconds
while ledgers are created and deleted, and prints the process's RSS at the start and
the end of that loop (flat means no growth with time). Figures are noisy on a shared
machine.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
import uuid

import aiohttp

from scriba.console.cli import Console, ConsoleConfig
from scriba.meta import connect
from scriba.meta.records import LedgerMetadata, ledger_key


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


async def _time(http: aiohttp.ClientSession, url: str, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        async with http.get(url) as reply:
            await reply.read()
            assert reply.status == 200, (url, reply.status)
    return (time.perf_counter() - start) / n * 1000


async def main(ledgers: int, seconds: float) -> None:
    uri = f"memory://bench-console-{uuid.uuid4().hex[:8]}"
    store = await connect(uri)
    for lid in range(1, ledgers + 1):
        md = LedgerMetadata(lid, 3, 2, 2, ((0, ("b1", "b2", "b3")),))
        await store.create(ledger_key(lid), md.to_bytes())
    console = Console(ConsoleConfig(uri, "127.0.0.1:0"))
    url = await console.start()
    await console.mirror.wait_synced(60)
    async with aiohttp.ClientSession() as http:
        first_ms = await _time(http, url + "ledgers", 1)
        base = await _time(http, url + "api/status", 50)
        rows = {
            "/ledgers (HTML, page 1)": await _time(http, url + "ledgers", 10),
            "/ledgers?page=100 (HTML)": await _time(http, url + "ledgers?page=100", 10),
            "/api/ledgers?page=100": await _time(http, url + "api/ledgers?page=100", 10),
            "/api/ledgers?q=777 (search)": await _time(http, url + "api/ledgers?q=777", 10),
        }
        print(f"{ledgers} ledgers; first /ledgers (decodes all): {first_ms:.1f} ms")
        print(f"baseline /api/status: {base:.2f} ms")
        for name, ms in rows.items():
            print(f"{name}: {ms:.1f} ms  ({ms / base:.0f}x baseline)")
        rss_start = _rss_mb()
        end = time.monotonic() + seconds
        next_id = ledgers + 1
        while time.monotonic() < end:
            md = LedgerMetadata(next_id, 3, 2, 2, ((0, ("b1", "b2", "b3")),))
            await store.create(ledger_key(next_id), md.to_bytes())
            await store.delete(ledger_key(next_id - ledgers))
            next_id += 1
            await _time(http, url + "ledgers?page=7", 1)
            await _time(http, url + "", 1)
        print(f"RSS over {seconds:.0f} s of pages with ledgers churning ({next_id - ledgers - 1} created "
              f"and deleted): {rss_start:.1f} MB -> {_rss_mb():.1f} MB")
    await console.stop()
    await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ledgers", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    asyncio.run(main(args.ledgers, args.seconds))
