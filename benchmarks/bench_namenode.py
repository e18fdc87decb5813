"""Benchmark: the namenode example over WebHDFS, each figure beside its baseline in the same run.

Cluster: a 1-member etcd, 3 bookie processes (zones z1-z3, journal with group commit and
fdatasync), 3 namenode processes (``python -m scriba.examples.namenode serve``), driven
from this process over HTTP (aiohttp, like any WebHDFS client):

1. namespace operations/s: ``--concurrency`` clients, each repeating MKDIRS, CREATE of
   an empty file (WebHDFS's two steps) and RENAME of it, through the active. Baseline:
   GETFILESTATUS answered locally (``scriba_consistency=sequential``) at the same
   concurrency — the HTTP and JSON floor of this server with no edit log.
2. file write and read MB/s: one ``--file-mb`` file through CREATE and OPEN. Baseline:
   the same bytes written to and read from one ledger with the client library directly
   (E3/W3/A2, the same 256 KiB entries), the floor under the WebHDFS data path.
3. fail-over: the active SIGKILLed -> the first MKDIRS confirmed through a standby, over
   ``--trials`` trials (metadata session 2 s, as in the tests); the killed namenode
   restarts before the next trial. Graceful fail-over: the leadership transfer that
   ``haadmin -failover`` asks for (``POST /scriba/ha/transfer``) -> the first MKDIRS
   confirmed by the target. No baseline: these are times, not rates.
4. checkpoint of ``--inodes`` inodes (in-process, no I/O): fsimage time and size, and
   restore time. Baseline: ``json.dumps``/``json.loads`` of a flat list of the same
   number of small dicts.

Run: ``.venv/bin/python benchmarks/bench_namenode.py [--seconds 10] [--concurrency 16]
[--file-mb 64] [--trials 5] [--inodes 1000000] [--json OUT]``.
Not a timed test: 2 cores shared by every process here; figures vary from run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from scriba.embedded.process import free_port

PREFIX = "/webhdfs/v1"
ENTRY_BYTES = 256 * 1024
NAMENODE_CONFIG = {"campaign_backoff_s": 0.1, "suspended_grace_s": 0.5, "propose_timeout_s": 20.0,
                   "snapshot_every_commands": 200_000}


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


class Namenodes:
    def __init__(self, uri: str, base: Path) -> None:
        self.uri, self.base = uri, base
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.urls: dict[str, str] = {}

    def start(self, rid: str) -> None:
        port = self.urls[rid].rsplit(":", 1)[1] if rid in self.urls else str(free_port())
        cmd = [sys.executable, "-m", "scriba.examples.namenode", "serve", "--metadata", self.uri, "--id", rid,
               "--listen", f"127.0.0.1:{port}", "--rsm-listen", f"127.0.0.1:{free_port()}", "--namespace", "bench",
               "--session-timeout-s", "2", "--rsm-config", json.dumps(NAMENODE_CONFIG)]
        with open(self.base / f"{rid}.log", "ab") as log:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log)
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        proc.stdout.close()
        if not line.startswith("READY"):
            raise RuntimeError(f"namenode {rid} did not start (exit {proc.poll()}); log {self.base / rid}.log")
        self.procs[rid], self.urls[rid] = proc, line.split()[1]

    async def active(self, http: aiohttp.ClientSession) -> str:
        while True:
            for rid, url in self.urls.items():
                if self.procs[rid].poll() is not None:
                    continue
                try:
                    async with http.get(f"{url}/scriba/status") as answer:
                        if (await answer.json())["role"] == "active":
                            return rid
                except (aiohttp.ClientError, TimeoutError):
                    continue
            await asyncio.sleep(0.05)

    def kill(self, rid: str) -> None:
        os.kill(self.procs[rid].pid, signal.SIGKILL)
        self.procs[rid].wait()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


async def call(http: aiohttp.ClientSession, method: str, url: str, data: bytes | None = None,
               **params: str) -> dict[str, Any]:
    params.setdefault("user.name", "bench")
    async with http.request(method, url, params=params, allow_redirects=False) as answer:
        if answer.status == 307:
            async with http.request(method, answer.headers["Location"], data=data) as second:
                if second.status >= 300:
                    raise RuntimeError(f"{method} {url}: {second.status} {await second.text()}")
                return {}
        if answer.status >= 300:
            raise RuntimeError(f"{method} {url}: {answer.status} {await answer.text()}")
        return dict(await answer.json()) if answer.content_type == "application/json" else {}


async def timed(worker: Any, concurrency: int, seconds: float) -> tuple[int, list[float]]:
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def loop(i: int) -> None:
        n = 0
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            await worker(i, n)
            latencies.append(time.perf_counter() - t0)
            n += 1

    await asyncio.gather(*(loop(i) for i in range(concurrency)))
    return len(latencies), latencies


async def namespace_ops(http: aiohttp.ClientSession, url: str, args: argparse.Namespace) -> dict[str, Any]:
    base = f"{url}{PREFIX}/ops"

    async def mix(i: int, n: int) -> None:
        kind = n % 3
        if kind == 0:
            await call(http, "PUT", f"{base}/c{i}/d{n}", op="MKDIRS")
        elif kind == 1:
            await call(http, "PUT", f"{base}/c{i}/f{n}", data=b"", op="CREATE")
        else:
            await call(http, "PUT", f"{base}/c{i}/f{n - 1}", op="RENAME", destination=f"/ops/c{i}/r{n - 1}")

    async def stat(i: int, n: int) -> None:
        await call(http, "GET", f"{url}{PREFIX}/ops", op="GETFILESTATUS", scriba_consistency="sequential")

    await call(http, "PUT", f"{url}{PREFIX}/ops", op="MKDIRS")
    ops, lat = await timed(mix, args.concurrency, args.seconds)
    floor, floor_lat = await timed(stat, args.concurrency, args.seconds)
    return {"clients": args.concurrency, "ops_per_s": round(ops / args.seconds),
            "p50_ms": round(pct(lat, 50) * 1000, 2), "p99_ms": round(pct(lat, 99) * 1000, 2),
            "baseline_local_getfilestatus_per_s": round(floor / args.seconds),
            "baseline_p50_ms": round(pct(floor_lat, 50) * 1000, 2),
            "ratio": round(ops / max(1, floor), 3)}


async def file_data(http: aiohttp.ClientSession, url: str, uri: str, args: argparse.Namespace) -> dict[str, Any]:
    from scriba.client import Client

    size = args.file_mb * 1024 * 1024
    data = os.urandom(1024 * 1024) * args.file_mb
    t0 = time.perf_counter()
    await call(http, "PUT", f"{url}{PREFIX}/data/file", data=data, op="CREATE", overwrite="true")
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    async with http.get(f"{url}{PREFIX}/data/file", params={"op": "OPEN", "user.name": "bench"}) as answer:
        got = await answer.read()
    read_s = time.perf_counter() - t0
    assert got == data, "the file read back differs"
    async with Client.connect(uri) as client:  # the baseline: one ledger, the same entries
        t0 = time.perf_counter()
        ledger = await client.create_ledger(3, 3, 2)
        pending = []
        for offset in range(0, size, ENTRY_BYTES):
            pending.append(ledger.append_async(data[offset:offset + ENTRY_BYTES]))
            if len(pending) >= 64:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        await ledger.close()
        raw_write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        reader = await client.open_ledger(ledger.ledger_id, b"", recovery=False)
        n = 0
        async for entry in reader.read(0, reader.last_add_confirmed):
            n += len(entry.payload)
        await reader.close()
        raw_read_s = time.perf_counter() - t0
        assert n == size
        await client.delete_ledger(ledger.ledger_id)
    mb = size / 1e6
    return {"file_mb": args.file_mb, "write_mb_s": round(mb / write_s, 1), "read_mb_s": round(mb / read_s, 1),
            "baseline_ledger_write_mb_s": round(mb / raw_write_s, 1),
            "baseline_ledger_read_mb_s": round(mb / raw_read_s, 1),
            "write_ratio": round(raw_write_s / write_s, 3), "read_ratio": round(raw_read_s / read_s, 3)}


async def failovers(http: aiohttp.ClientSession, nodes: Namenodes, args: argparse.Namespace) -> dict[str, Any]:
    killed: list[float] = []
    graceful: list[float] = []
    for trial in range(args.trials):
        active = await nodes.active(http)
        others = [r for r in nodes.urls if r != active]
        t0 = time.perf_counter()
        nodes.kill(active)
        while True:
            try:
                await call(http, "PUT", f"{nodes.urls[others[trial % 2]]}{PREFIX}/fo/k{trial}", op="MKDIRS")
                break
            except (RuntimeError, aiohttp.ClientError, TimeoutError):
                await asyncio.sleep(0.01)
        killed.append(time.perf_counter() - t0)
        nodes.start(active)
        source = await nodes.active(http)
        target = next(r for r in nodes.urls if r != source)
        t0 = time.perf_counter()
        async with http.post(f"{nodes.urls[source]}/scriba/ha/transfer",  # what haadmin -failover asks
                             params={"to": target, "user.name": "hdfs"}) as answer:
            if answer.status != 200:
                raise RuntimeError(f"transfer {source} -> {target}: {await answer.text()}")
        await call(http, "PUT", f"{nodes.urls[target]}{PREFIX}/fo/g{trial}", op="MKDIRS")
        graceful.append(time.perf_counter() - t0)
    return {"trials": args.trials, "sigkill_p50_s": round(pct(killed, 50), 3),
            "sigkill_max_s": round(max(killed, default=0), 3), "graceful_p50_s": round(pct(graceful, 50), 3),
            "graceful_max_s": round(max(graceful, default=0), 3),
            "note": "SIGKILL: kill -> first MKDIRS confirmed, includes the 2 s metadata session; graceful: "
                    "the transfer haadmin -failover asks for -> first MKDIRS confirmed on the target"}


def checkpoint(inodes: int) -> dict[str, Any]:
    from scriba.examples.namenode import edits as e
    from scriba.examples.namenode.namespace import Namespace

    ns = Namespace()
    per_dir = 1000
    for d in range(max(1, inodes // per_dir)):
        ns.apply(e.Mkdirs(f"/c/d{d}", 0o755, "bench", "supergroup", 1))
        for f in range(per_dir - 1):
            file_id = ns.apply(e.Create(f"/c/d{d}/f{f}", False, 0o644, "bench", "supergroup", 3, 1 << 27, 1))
            ns.apply(e.Complete(f"/c/d{d}/f{f}", file_id["file_id"], 1))
    count = ns.last_inode_id - 16385
    t0 = time.perf_counter()
    image = ns.fsimage()
    save_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = Namespace.from_fsimage(image)
    restore_s = time.perf_counter() - t0
    assert back.digest() == ns.digest()
    flat = [{"id": i, "owner": "bench", "perm": 0o644, "mtime": 1} for i in range(count)]
    t0 = time.perf_counter()
    raw = json.dumps(flat).encode()
    base_save_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    json.loads(raw)
    base_restore_s = time.perf_counter() - t0
    return {"inodes": count, "fsimage_bytes": len(image), "save_s": round(save_s, 2),
            "restore_s": round(restore_s, 2), "baseline_flat_json_save_s": round(base_save_s, 2),
            "baseline_flat_json_restore_s": round(base_restore_s, 2),
            "save_ratio": round(base_save_s / save_s, 3), "restore_ratio": round(base_restore_s / restore_s, 3)}


async def cluster_side(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    from scriba.embedded.etcd import EtcdCluster
    from scriba.testing.cluster import BookieCluster

    etcd = EtcdCluster(base / "etcd", 1)
    etcd.start()
    uri = etcd.uri("bench")
    bookies = BookieCluster(base / "bookies", uri)
    nodes = Namenodes(str(uri), base)
    out: dict[str, Any] = {}
    try:
        for zone in ("z1", "z2", "z3"):
            bookies.add_bookie(zone=zone)
        for rid in ("nn1", "nn2", "nn3"):
            nodes.start(rid)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
            url = nodes.urls[await nodes.active(http)]
            await call(http, "PUT", f"{url}{PREFIX}/", op="SETPERMISSION", permission="777", **{"user.name": "hdfs"})
            out["namespace_ops"] = await namespace_ops(http, url, args)
            out["file_data"] = await file_data(http, url, str(uri), args)
            out["failover"] = await failovers(http, nodes, args)
        return out
    finally:
        nodes.stop_all()
        bookies.stop_all()
        etcd.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--file-mb", type=int, default=64)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--inodes", type=int, default=1_000_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-namenode-") as tmp:
        doc = asyncio.run(cluster_side(args, Path(tmp)))
    doc["checkpoint"] = checkpoint(args.inodes)
    doc["note"] = "2 shared cores: figures are noisy; each ratio is against its baseline in this run"
    print(json.dumps(doc, indent=2))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
