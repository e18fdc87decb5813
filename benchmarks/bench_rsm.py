"""Benchmark: a replicated counter on Scriba's RSM vs the same counter on PySyncObj, same run.

Scriba: a 1-member etcd, 3 bookie processes in zones z1, z2, z3 (journal with group
commit and fdatasync: every command durable on a quorum of 2 of 3 before it is
confirmed), 3 replica **processes** (this file with ``--replica``, one per zone), driven
from this process over the replica service (``RsmClient``), 64-byte commands:

1. many concurrent proposers (``--concurrency``): proposals/s, p50/p99;
2. one proposer: p50/p99;
3. linearizable reads/s through the leader, in the same run: *unpipelined* (each read its
   own ``READ`` request, the client before pipelining) and *pipelined* (``READ_MANY``
   frames; the reads of a frame share one read index) at the same concurrency, and
   pipelined at ``--read-concurrency`` reads in flight. Every read proves leadership by
   the leader's default check (``RsmConfig.leader_read_check``: a fence probe, plain LAC
   reads to its ledger's bookies, shared by the reads waiting at that moment);
4. fail-over: the leader SIGKILLed -> the first confirmed proposal through a client
   that knows every replica, over ``--trials`` trials (the killed replica restarts
   under a new id before the next trial). Replica timings as in the R15 test:
   metadata session 2 s, campaign backoff 0.1 s, SUSPENDED grace 0.5 s.

Baseline: PySyncObj 0.3.x, 3 processes on 127.0.0.1, the same counter as a
``@replicated`` method taking the 64-byte command, its ``FileJournal`` (``journalFile``).
That journal writes each entry into an mmap'd file and never calls ``fsync``/``msync``
on the write path (``FileJournal.flush`` exists but ``SyncObj`` does not call it): a
command survives a process crash, not a power loss. Its load runs inside the leader
process (PySyncObj has no client protocol), with the same number of commands in flight
(callbacks) and then one at a time (``sync=True``); PySyncObj has no linearizable read
(its reads are local), so only writes are compared.

``--reads-only``: the leader's two read checks side by side, same run, same bookies: two
groups of 3 replica processes (``counter-barrier`` with ``leader_read_check="barrier"``,
a barrier append per round, journal fsync on the bookies; ``counter-fence_probe`` with
the fence probe), pipelined linearizable reads at ``--concurrency`` in flight through
each leader, alternating ``--rounds`` times; reads/s per round, the median per mode and
the ratio probe / barrier. No PySyncObj, no fail-over.

Run: ``.venv/bin/pip install pysyncobj`` (benchmark only, not a dependency), then
``.venv/bin/python benchmarks/bench_rsm.py [--seconds 10] [--concurrency 64] [--trials 20] [--json OUT]``.
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
import threading
import time
from pathlib import Path
from typing import Any

from scriba.embedded.process import free_port

COMMAND = b"c" * 64
REPLICA_CONFIG = {"campaign_backoff_s": 0.1, "suspended_grace_s": 0.5, "writer_lock_timeout_s": 60.0,
                  "propose_timeout_s": 20.0, "snapshot_every_commands": 200_000}


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def summary_ms(latencies_s: list[float]) -> dict[str, float]:
    return {"p50_ms": round(pct(latencies_s, 50) * 1000, 2), "p99_ms": round(pct(latencies_s, 99) * 1000, 2)}


# --- a Scriba replica process -------------------------------------------------------------
class CounterMachine:
    def __init__(self) -> None:
        self.count = 0

    def apply(self, command: bytes, position: Any) -> bytes:
        self.count += 1
        return str(self.count).encode()

    def query(self, request: bytes) -> bytes:
        return str(self.count).encode()

    def snapshot(self, out: Any) -> None:
        out.write(str(self.count).encode())

    def restore(self, src: Any) -> None:
        self.count = int(src.read() or b"0")


async def replica_main(uri: str, namespace: str, rid: str, address: str, zone: str, name: str = "counter",
                       read_check: str = "fence_probe") -> int:
    from scriba.client import Client, ClientConfig
    from scriba.log import configure
    from scriba.meta.connect import connect
    from scriba.rsm import ReplicatedStateMachine, RsmConfig

    configure(stream=sys.stderr, level="warning")
    store = await connect(uri, session_timeout_s=2.0)
    client = await Client.connect(uri, store=store, config=ClientConfig(add_timeout_s=5.0, bookie_wait_s=20.0))
    overrides = json.loads(os.environ.get("BENCH_RSM_CONFIG", "{}"))  # probe_rsm.py --ab: RsmConfig fields
    rsm = ReplicatedStateMachine(client, namespace=namespace, name=name, state_machine=CounterMachine(),
                                 replica_id=rid, address=address,
                                 config=RsmConfig(**{**REPLICA_CONFIG, **overrides}, zone=zone,
                                                  leader_read_check=read_check))
    await rsm.start()
    print("READY", flush=True)
    while rsm.error is None:
        await asyncio.sleep(0.2)
    return 3


class Replicas:
    def __init__(self, uri: str, namespace: str, name: str = "counter", read_check: str = "fence_probe", *,
                 script: str = __file__, env: dict[str, str] | None = None) -> None:
        self.uri, self.namespace = uri, namespace
        self.name, self.read_check = name, read_check
        self.script, self.env = script, env  # probe_rsm.py runs its traced replicas through this class
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.addresses: dict[str, str] = {}
        self.generation = 0

    def start(self, slot: int) -> None:
        rid = f"r{slot}g{self.generation}"
        self.generation += 1
        address = f"127.0.0.1:{free_port()}"
        proc = subprocess.Popen([sys.executable, self.script, "--replica", self.uri, self.namespace, rid, address,
                                 f"z{slot + 1}", self.name, self.read_check], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, **self.env} if self.env else None)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "READY" not in line:
            raise RuntimeError(f"replica {rid} did not start (exit {proc.poll()})")
        self.procs[f"s{slot}"] = proc
        self.addresses[f"s{slot}"] = address

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


async def timed_load(call: Any, concurrency: int, seconds: float) -> tuple[int, list[float]]:
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(latencies), latencies


async def read_loads(addresses: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Linearizable reads/s: one READ per read (before pipelining) vs READ_MANY frames."""
    from scriba.rsm.remote import RsmClient

    out: dict[str, Any] = {}
    for name, pipelined, readers in (("unpipelined", False, args.concurrency), ("pipelined", True, args.concurrency),
                                     ("pipelined_many", True, args.read_concurrency)):
        client = RsmClient(addresses, timeout_s=60.0, pipeline_reads=pipelined)
        await client.read(b"get")  # find the leader first
        n, lat = await timed_load(lambda c=client: c.read(b"get"), readers, args.seconds)
        out[name] = {"readers": readers, "reads_per_s": round(n / args.seconds), **summary_ms(lat),
                     "frames": client.read_frames_sent}
        await client.close()
    out["pipelined_vs_unpipelined"] = round(out["pipelined"]["reads_per_s"] / max(1, out["unpipelined"]["reads_per_s"]), 2)
    return out


async def leader_slot(replicas: Replicas) -> str:
    from scriba.rsm.remote import RsmClient

    probe = RsmClient(list(replicas.addresses.values()), timeout_s=5.0)
    try:
        while True:
            for slot, address in replicas.addresses.items():
                try:
                    if (await probe.status(address))["role"] == "leader":
                        return slot
                except Exception:
                    continue
            await asyncio.sleep(0.05)
    finally:
        await probe.close()


async def scriba_side(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    from scriba.embedded.etcd import EtcdCluster
    from scriba.errors import ScribaError
    from scriba.rsm.remote import RsmClient
    from scriba.testing.cluster import BookieCluster

    etcd = EtcdCluster(base / "etcd", 1)
    etcd.start()
    uri = etcd.uri("bench")
    bookies = BookieCluster(base / "bookies", uri)
    replicas = Replicas(uri, "bench")
    out: dict[str, Any] = {"replicas": "3 processes, zones z1-z3", "bookies": "3 processes, zones z1-z3, E3/W3/A2"}
    try:
        for zone in ("z1", "z2", "z3"):
            bookies.add_bookie(zone=zone)
        for slot in range(3):
            replicas.start(slot)
        client = RsmClient(list(replicas.addresses.values()), timeout_s=60.0)
        await client.propose(COMMAND)  # a leader is elected and serving
        n, lat = await timed_load(lambda: client.propose(COMMAND), args.concurrency, args.seconds)
        out["concurrent"] = {"proposers": args.concurrency, "proposals_per_s": round(n / args.seconds),
                             **summary_ms(lat)}
        n, lat = await timed_load(lambda: client.propose(COMMAND), 1, args.seconds)
        out["one_proposer"] = {"proposals_per_s": round(n / args.seconds), **summary_ms(lat)}
        out["linearizable_reads"] = await read_loads(list(replicas.addresses.values()), args)
        await client.close()
        failovers: list[float] = []
        for _ in range(args.trials):
            slot = await leader_slot(replicas)
            others = [a for s, a in replicas.addresses.items() if s != slot]
            proc = replicas.procs[slot]
            t0 = time.perf_counter()
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            fresh = RsmClient(others, timeout_s=60.0, attempt_timeout_s=1.0, retry_pause_s=0.01)
            while True:  # without a session a proposal is not retried by the client: retry here until confirmed
                try:
                    await fresh.propose(COMMAND)
                    break
                except ScribaError:
                    await asyncio.sleep(0.01)
            failovers.append(time.perf_counter() - t0)
            await fresh.close()
            replicas.start(int(slot[1:]))
        out["failover"] = {"trials": len(failovers), "p50_s": round(pct(failovers, 50), 3),
                           "p99_s": round(pct(failovers, 99), 3), "max_s": round(max(failovers, default=0), 3)}
        return out
    finally:
        replicas.stop_all()
        bookies.stop_all()
        etcd.stop()


async def read_checks_side(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """The leader's read checks side by side (``--reads-only``): two groups on the same bookies."""
    from scriba.embedded.etcd import EtcdCluster
    from scriba.rsm.remote import RsmClient
    from scriba.testing.cluster import BookieCluster

    etcd = EtcdCluster(base / "etcd", 1)
    etcd.start()
    uri = etcd.uri("bench")
    bookies = BookieCluster(base / "bookies", uri)
    modes = ("barrier", "fence_probe")
    groups = {mode: Replicas(uri, "bench", f"counter-{mode}", mode) for mode in modes}
    out: dict[str, Any] = {"bookies": "3 processes, zones z1-z3, E3/W3/A2", "readers": args.concurrency,
                           "seconds_per_round": args.seconds, "reads_per_s": {mode: [] for mode in modes}}
    try:
        for zone in ("z1", "z2", "z3"):
            bookies.add_bookie(zone=zone)
        clients = {}
        for mode, group in groups.items():
            for slot in range(3):
                group.start(slot)
            clients[mode] = RsmClient(list(group.addresses.values()), timeout_s=60.0, pipeline_reads=True)
            await clients[mode].propose(COMMAND)  # a leader serves; its ledger has an entry
            await clients[mode].read(b"get")  # the client finds the leader
        for _ in range(args.rounds):
            for mode in modes:
                n, _lat = await timed_load(lambda c=clients[mode]: c.read(b"get"), args.concurrency, args.seconds)
                out["reads_per_s"][mode].append(round(n / args.seconds))
        out["leader_status"] = {}
        for mode, client in clients.items():
            for address in groups[mode].addresses.values():
                status = await client.status(address)
                if status["role"] == "leader":
                    out["leader_status"][mode] = {k: status[k] for k in (
                        "batches_sent", "read_probes_proven", "read_probes_unproven")}
            await client.close()
        median = {mode: sorted(v)[len(v) // 2] for mode, v in out["reads_per_s"].items()}
        out["median_reads_per_s"] = median
        out["fence_probe_vs_barrier"] = round(median["fence_probe"] / max(1, median["barrier"]), 2)
        return out
    finally:
        for group in groups.values():
            group.stop_all()
        bookies.stop_all()
        etcd.stop()


# --- the PySyncObj baseline ----------------------------------------------------------------
def pysyncobj_node(me: str, partners: list[str], journal: str, result_path: str, seconds: float,
                   concurrency: int) -> int:
    from pysyncobj import SyncObj, SyncObjConf, replicated  # type: ignore[import-not-found,import-untyped]

    class Counter(SyncObj):
        def __init__(self) -> None:
            super().__init__(me, partners, SyncObjConf(journalFile=journal, dynamicMembershipChange=False))
            self.count = 0

        @replicated
        def incr(self, command: bytes) -> int:
            self.count += 1
            return self.count

    node = Counter()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not os.path.exists(result_path):
        if node._isLeader() and node.isReady():
            break
        time.sleep(0.05)
    if os.path.exists(result_path) or not node._isLeader():
        while not os.path.exists(result_path) and time.monotonic() < deadline:
            time.sleep(0.1)
        return 0
    node.incr(COMMAND, sync=True, timeout=30)
    latencies: list[float] = []
    done = threading.Event()
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds
    inflight = [0]

    def issue() -> None:
        t0 = time.perf_counter()

        def callback(result: Any, error: Any) -> None:
            with lock:
                if error == 0:  # FAIL_REASON.SUCCESS
                    latencies.append(time.perf_counter() - t0)
                inflight[0] -= 1
                again = time.monotonic() < stop_at
                if again:
                    inflight[0] += 1
            if again:
                issue()
            elif inflight[0] == 0:
                done.set()

        node.incr(COMMAND, callback=callback)

    with lock:
        inflight[0] = concurrency
    for _ in range(concurrency):
        issue()
    done.wait(seconds + 60)
    concurrent = {"proposers": concurrency, "proposals_per_s": round(len(latencies) / seconds),
                  **summary_ms(latencies)}
    one: list[float] = []
    stop_at = time.monotonic() + seconds
    while time.monotonic() < stop_at:
        t0 = time.perf_counter()
        node.incr(COMMAND, sync=True, timeout=30)
        one.append(time.perf_counter() - t0)
    result = {"processes": 3, "journal": "FileJournal (mmap, no fsync)", "concurrent": concurrent,
              "one_proposer": {"proposals_per_s": round(len(one) / seconds), **summary_ms(one)}}
    Path(result_path + ".tmp").write_text(json.dumps(result))
    os.replace(result_path + ".tmp", result_path)
    return 0


def pysyncobj_side(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    nodes = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    result = str(base / "pysyncobj.json")
    procs = [subprocess.Popen([sys.executable, __file__, "--pysyncobj", me, ",".join(n for n in nodes if n != me),
                               str(base / f"pso-{i}.journal"), result, str(args.seconds), str(args.concurrency)])
             for i, me in enumerate(nodes)]
    try:
        for proc in procs:
            proc.wait(timeout=args.seconds * 2 + 180)
        doc: dict[str, Any] = json.loads(Path(result).read_text())
        return doc
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--replica":
        return asyncio.run(replica_main(*sys.argv[2:9]))
    if len(sys.argv) > 1 and sys.argv[1] == "--pysyncobj":
        a = sys.argv[2:]
        return pysyncobj_node(a[0], a[1].split(","), a[2], a[3], float(a[4]), int(a[5]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--read-concurrency", type=int, default=1024, help="reads in flight, last read load")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--reads-only", action="store_true",
                        help="only the leader's read checks side by side (barrier vs fence probe)")
    parser.add_argument("--rounds", type=int, default=3, help="--reads-only: alternating rounds per mode")
    args = parser.parse_args()
    if args.reads_only:
        with tempfile.TemporaryDirectory(prefix="bench-rsm-") as tmp:
            checks = asyncio.run(read_checks_side(args, Path(tmp)))
        checks["note"] = "2 shared cores: figures are noisy; both modes measured in the same run, alternating"
        print(json.dumps(checks, indent=2))
        if args.json:
            args.json.write_text(json.dumps(checks, indent=2))
        print(f"linearizable reads/s at {args.concurrency} in flight (median of {args.rounds}): barrier "
              f"{checks['median_reads_per_s']['barrier']}, fence probe {checks['median_reads_per_s']['fence_probe']}"
              f" = {checks['fence_probe_vs_barrier']}x", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-rsm-") as tmp:
        base = Path(tmp)
        baseline = pysyncobj_side(args, base)
        scriba = asyncio.run(scriba_side(args, base))
    ratio = scriba["concurrent"]["proposals_per_s"] / max(1, baseline["concurrent"]["proposals_per_s"])
    doc = {"scriba": scriba, "pysyncobj": baseline, "throughput_ratio": round(ratio, 2),
           "note": "2 shared cores: figures are noisy; PySyncObj does not fsync, Scriba's bookies do"}
    print(json.dumps(doc, indent=2))
    reads = scriba["linearizable_reads"]
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    print(f"proposals/s at {args.concurrency} in flight: Scriba {scriba['concurrent']['proposals_per_s']} vs "
          f"PySyncObj {baseline['concurrent']['proposals_per_s']} = {ratio:.2f}x; one proposer p99 "
          f"{scriba['one_proposer']['p99_ms']} ms vs {baseline['one_proposer']['p99_ms']} ms; fail-over p99 "
          f"{scriba['failover']['p99_s']} s; linearizable reads/s unpipelined {reads['unpipelined']['reads_per_s']}, "
          f"pipelined {reads['pipelined']['reads_per_s']} ({reads['pipelined_vs_unpipelined']}x) at "
          f"{args.concurrency} in flight, {reads['pipelined_many']['reads_per_s']} at {args.read_concurrency}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
