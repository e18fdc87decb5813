"""Probe (not a benchmark): where the time goes between a ledger append and a tailing
reader's delivery. One etcd, 3 bookie processes; a writer child paces 1k entries/s and
notes send and confirm times; a reader child tails and notes, per entry, when a long
poll first showed a LAC covering it and when it was delivered.

Run: ``.venv/bin/python benchmarks/probe_tail.py [--seconds 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scriba.grpc_runtime import apply_defaults

apply_defaults()

from scriba.log import configure  # noqa: E402

RATE = 1000


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return round(v[min(len(v) - 1, int(q * len(v)))], 3) if v else -1.0


async def writer(uri: str, seconds: float) -> dict[str, Any]:
    from scriba.client import Client

    async with Client.connect(uri) as client:
        w = await client.create_ledger(3, 3, 2)
        print(f"ledger {w.ledger_id}", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        loop = asyncio.get_running_loop()
        sent: dict[int, int] = {}
        confirmed: dict[int, int] = {}
        futures = []
        count = int(seconds * RATE)
        start = loop.time() + 0.05
        for i in range(count):
            delay = start + i / RATE - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            sent[i] = time.monotonic_ns()
            fut = w.append_async(b"L" if i == count - 1 else b"-" * 100)
            fut.add_done_callback(lambda f, i=i: confirmed.__setitem__(i, time.monotonic_ns()))
            futures.append(fut)
        await asyncio.gather(*futures)
        await w.close()
    return {"sent": sent, "confirmed": confirmed}


async def reader(uri: str, ledger_id: int) -> dict[str, Any]:
    from scriba.client import Client

    async with Client.connect(uri) as client:
        r = await client.open_ledger(ledger_id, recovery=False)
        transport = r._transport
        polls: list[tuple[int, int, int]] = []  # (start ns, end ns, lac)
        orig = transport.long_poll_lac

        async def long_poll_lac(*args: Any, **kwargs: Any) -> Any:
            t0 = time.monotonic_ns()
            res = await orig(*args, **kwargs)
            polls.append((t0, time.monotonic_ns(), int(res.lac)))
            return res

        transport.long_poll_lac = long_poll_lac
        print("ready", flush=True)
        delivered: dict[int, int] = {}
        async for entry in r.tail(0):
            delivered[int(entry.entry_id)] = time.monotonic_ns()
            if entry.payload[:1] == b"L":
                break
    return {"delivered": delivered, "polls": polls}


def spawn(mode: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, "--child", mode, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=120)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(err[-3000:])
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def analyse(w: dict[str, Any], r: dict[str, Any]) -> None:
    sent = {int(k): v for k, v in w["sent"].items()}
    conf = {int(k): v for k, v in w["confirmed"].items()}
    deliv = {int(k): v for k, v in r["delivered"].items()}
    polls = sorted(r["polls"], key=lambda p: p[1])
    stage: dict[str, list[float]] = {"confirm": [], "lac_seen": [], "deliver": [], "total": []}
    pi = 0
    for eid in sorted(deliv):
        if eid not in sent:
            continue
        while pi < len(polls) and polls[pi][2] < eid:
            pi += 1
        seen = polls[pi][1] if pi < len(polls) else deliv[eid]
        seen = min(seen, deliv[eid])
        stage["confirm"].append((conf[eid] - sent[eid]) / 1e6)
        stage["lac_seen"].append((seen - conf[eid]) / 1e6)
        stage["deliver"].append((deliv[eid] - seen) / 1e6)
        stage["total"].append((deliv[eid] - sent[eid]) / 1e6)
    for name, values in stage.items():
        print(f"{name:10} p50 {pct(values, 0.5):8.3f}  p90 {pct(values, 0.9):8.3f}  p99 {pct(values, 0.99):8.3f} ms")
    slowest = sorted(((deliv[e] - sent[e]) / 1e6, e) for e in deliv if e in sent)[-3:]
    print("slowest (ms, entry id):", [(round(ms, 1), e) for ms, e in slowest])
    durations = [(p[1] - p[0]) / 1e6 for p in polls]
    print(f"long polls: {len(polls)}, duration p50 {pct(durations, 0.5)} ms")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--child")
    p.add_argument("--uri")
    p.add_argument("--ledger", type=int, default=0)
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args()
    configure(level="warning")
    if args.child == "writer":
        print(json.dumps(asyncio.run(writer(args.uri, args.seconds))), flush=True)
        return
    if args.child == "reader":
        print(json.dumps(asyncio.run(reader(args.uri, args.ledger))), flush=True)
        return
    from scriba.embedded.etcd import EtcdCluster
    from scriba.testing.cluster import BookieCluster

    with tempfile.TemporaryDirectory(prefix="probe-tail-") as tmp:
        etcd = EtcdCluster(Path(tmp) / "etcd", 1)
        etcd.start()
        uri = etcd.uri("probe")
        bookies = BookieCluster(Path(tmp) / "bookies", uri)
        try:
            for zone in ("z1", "z2", "z3"):
                bookies.add_bookie(zone=zone)
            w = spawn("writer", "--uri", uri, "--seconds", str(args.seconds))
            assert w.stdout is not None and w.stdin is not None
            ledger_id = int(w.stdout.readline().split()[1])
            r = spawn("reader", "--uri", uri, "--ledger", str(ledger_id))
            assert r.stdout is not None and r.stdout.readline().strip() == "ready"
            w.stdin.write("go\n")
            w.stdin.flush()
            analyse(result(w), result(r))
        finally:
            bookies.stop_all()
            etcd.stop()


if __name__ == "__main__":
    main()
