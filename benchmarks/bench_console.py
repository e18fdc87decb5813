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

    .venv/bin/python benchmarks/bench_console.py --memory-minutes 10 [--ledgers 10000]

The memory run: a real etcd holding N ledger records and ``scriba console`` as its own
process (as an operator runs it); for the given minutes pages of every kind are fetched in
a loop (cluster, ledger pages and searches, a ledger's page, streams, RSM, recovery, geo,
the JSON API) while a ledger is created and one deleted per round, and the console's RSS
(``/proc/PID/status`` VmRSS) is sampled every ``--sample-every`` seconds. Prints each
sample, then the RSS after the first minute (warm), at the end and at its highest, and the
growth over the second half of the run, per minute and per 1,000 ledgers created and
deleted (flat is ~0 for both; the second does not depend on how fast a busy machine let
the rounds go).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp

from scriba.console.cli import Console, ConsoleConfig
from scriba.meta import connect
from scriba.meta.records import LedgerMetadata, ledger_key
from scriba.meta.store import MetadataStore


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
        await store.create(ledger_key(lid), _ledger(lid).to_bytes())
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
        worst = max([first_ms, *rows.values()])
        print(f"goal, a page over {ledgers} ledgers under 1 s (paged): {'met' if worst < 1000 else 'NOT met'} "
              f"(slowest {worst:.0f} ms, the first request included)")
        rss_start = _rss_mb()
        end = time.monotonic() + seconds
        next_id = ledgers + 1
        while time.monotonic() < end:
            await store.create(ledger_key(next_id), _ledger(next_id).to_bytes())
            await store.delete(ledger_key(next_id - ledgers))
            next_id += 1
            await _time(http, url + "ledgers?page=7", 1)
            await _time(http, url + "", 1)
        print(f"RSS over {seconds:.0f} s of pages with ledgers churning ({next_id - ledgers - 1} created "
              f"and deleted): {rss_start:.1f} MB -> {_rss_mb():.1f} MB")
    await console.stop()
    await store.close()


def _vm_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def _populate(store: MetadataStore, first: int, count: int, concurrency: int = 64) -> None:
    for start in range(first, first + count, concurrency):
        await asyncio.gather(*(store.create(ledger_key(lid), _ledger(lid).to_bytes())
                               for lid in range(start, min(start + concurrency, first + count))))


def _ledger(lid: int) -> LedgerMetadata:
    return LedgerMetadata(lid, 3, 2, 2, ((0, ("b1", "b2", "b3")),))


async def memory_run(ledgers: int, minutes: float, sample_every_s: float) -> None:
    from scriba.embedded.etcd import EtcdCluster
    from scriba.embedded.sandbox_children import start_console

    with tempfile.TemporaryDirectory(prefix="bench-console-") as tmp:
        base = Path(tmp)
        etcd = EtcdCluster(base / "etcd", 1)
        etcd.start()
        child = None
        try:
            uri = etcd.uri("benchconsole")
            store = await connect(uri)
            started = time.perf_counter()
            await _populate(store, 1, ledgers)
            print(f"{ledgers} ledger records in etcd in {time.perf_counter() - started:.1f} s")
            child, url = start_console(uri, "127.0.0.1:0", base)
            pid = child.pid
            samples: list[tuple[float, float, int]] = []  # (s since start, RSS MB, rounds so far)
            rounds = pages = 0
            next_id = ledgers + 1
            async with aiohttp.ClientSession() as http:
                t0 = time.monotonic()
                await _wait_synced(http, url, 120.0)
                print(f"console synced {time.monotonic() - t0:.1f} s after it listened", flush=True)
                t0 = next_sample = time.monotonic()
                end = t0 + minutes * 60
                page_s = store_s = 0.0  # since the last sample: time in page fetches, in etcd writes
                page_n = 0
                while (now := time.monotonic()) < end:
                    if now >= next_sample:
                        samples.append((now - t0, _vm_rss_mb(pid), rounds))
                        mean_ms = page_s / page_n * 1000 if page_n else 0.0
                        print(f"t={now - t0:6.0f} s  console RSS {samples[-1][1]:7.1f} MB  pages {pages}  "
                              f"page mean {mean_ms:6.1f} ms  etcd writes {store_s:5.1f} s", flush=True)
                        page_s = store_s = 0.0
                        page_n = 0
                        next_sample += sample_every_s
                    store_s_round, page_s_round = await churn_round(store, http, url, next_id, ledgers)
                    store_s += store_s_round
                    page_s += page_s_round
                    next_id += 1
                    page_n += len(PAGES) + 1
                    pages += len(PAGES) + 1
                    rounds += 1
            samples.append((time.monotonic() - t0, _vm_rss_mb(pid), rounds))
            _report_memory(samples, rounds, pages)
            await store.close()
        finally:
            if child is not None:
                child.terminate()  # our own child, by its handle
                child.wait(timeout=30)
                if child.stdout is not None:
                    child.stdout.close()
            etcd.stop()


PAGES = ("", "ledgers", "api/ledgers?page=50&per_page=100", "ledgers?q=77", "ledgers?state=CLOSED&page=3",
         "streams", "rsm", "recovery", "geo", "api/cluster", "api/bookies", "api/streams", "api/rsm")
"""What one round of the memory run fetches, besides one ledger's page."""


async def churn_round(store: MetadataStore, http: aiohttp.ClientSession, url: str, next_id: int,
                      ledgers: int) -> tuple[float, float]:
    """One round of the memory run: ledger ``next_id`` created, ``next_id - ledgers`` deleted, then
    a ledger's page and every page of :data:`PAGES` fetched. Returns (s in etcd writes, s in pages)."""
    started = time.monotonic()
    await store.create(ledger_key(next_id), _ledger(next_id).to_bytes())
    await store.delete(ledger_key(next_id - ledgers))
    store_s = time.monotonic() - started
    started = time.monotonic()
    await _time(http, url + f"ledgers/{next_id - ledgers // 2}", 1)
    for path in PAGES:
        await _time(http, url + path, 1)
    return store_s, time.monotonic() - started


async def _wait_synced(http: aiohttp.ClientSession, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async with http.get(url + "api/status") as reply:
            if (await reply.json())["synced"]:
                return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"the console at {url} did not sync within {timeout_s} s")


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x (0 when x does not vary)."""
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


def _report_memory(samples: list[tuple[float, float, int]], rounds: int, pages: int) -> None:
    duration = samples[-1][0]
    warm = next((rss for t, rss, _ in samples if t >= 60), samples[0][1])
    half = [s for s in samples if s[0] >= duration / 2]
    per_min = per_1000 = 0.0
    if len(half) >= 2:  # over the second half: MB per minute, MB per 1,000 ledgers churned
        per_min = _slope([(t, rss) for t, rss, _ in half]) * 60
        per_1000 = _slope([(n, rss) for _, rss, n in half]) * 1000
    print(f"memory run: {duration / 60:.1f} min, {rounds} rounds ({pages} pages, {rounds} ledgers created and "
          f"deleted); console RSS first {samples[0][1]:.1f} MB, warm (1 min) {warm:.1f} MB, "
          f"end {samples[-1][1]:.1f} MB, max {max(rss for _, rss, _ in samples):.1f} MB; "
          f"second-half trend {per_min:+.2f} MB/min, {per_1000:+.2f} MB per 1000 ledgers churned")

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ledgers", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--memory-minutes", type=float, default=0.0,
                        help="run the memory run instead: the console as a process, its RSS sampled")
    parser.add_argument("--sample-every", type=float, default=10.0, help="memory run: seconds between RSS samples")
    args = parser.parse_args()
    if args.memory_minutes > 0:
        asyncio.run(memory_run(args.ledgers, args.memory_minutes, args.sample_every))
    else:
        asyncio.run(main(args.ledgers, args.seconds))
