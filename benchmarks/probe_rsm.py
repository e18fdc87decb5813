"""Probe (not a benchmark): where one proposer's commit latency goes, hop by hop.

The set-up of ``bench_rsm.py`` (one etcd, 3 bookie processes in zones z1-z3, E3/W3/A2,
3 replica processes), every process traced (``rsm_trace``, ``tail_trace``; bookies
through a ``sitecustomize`` on ``PYTHONPATH``). This process proposes one 64-byte
command at a time through ``RsmClient`` for ``--seconds`` (after a warm-up), noting each
call's start and end; every other process notes its hops. One proposal is in flight
at a time, so each hop of proposal *i* is the first event of its kind inside *i*'s
window. Stages (ms):

  client->srv_in   request written -> the leader read its frame
  srv_in->h0       -> the handler task runs
  h0->propose      -> queued in the term's batcher
  propose->flush   -> the batcher flushed (call_soon)
  flush->append    -> the append task runs
  append->sflush   -> the stream writer flushes (call_soon)
  sflush->lappend  -> the ledger writer packed the entry
  lappend->send    -> the adds taken into a message
  send->arrive     (per bookie) -> frame dispatched at the bookie
  arrive->added    (per bookie) -> journal write + fdatasync done, answered
  added->ack       (per bookie) -> the answer read at the leader
  send->ack2       -> the second (ack quorum) answer
  ack2->confirm    -> the ledger entry confirmed
  confirm->sent    -> the stream writer told
  sent->apply0     -> the term's confirm callback (append task resumed)
  apply0->apply1   apply + answer the futures
  apply1->sub1     -> ``_submit`` resumed
  sub1->srv_out    -> the answer encoded
  srv_out->cresp   -> the answer parsed at the client
  cresp->done      -> the caller resumed

then the slowest 1% broken down by stage (mean excess over the stage's median), the GC
pauses and fdatasyncs that overlapped them.

Also per proposal and process: CPU µs (``/proc``), and the leader's main-thread CPU on
the commit path (``cpu: srv_in->srv_out``, from ``time.thread_time_ns`` noted at the
hops: what contention cannot inflate much, unlike wall time); ``--profile DIR`` adds
``py-spy record`` stacks of the leader, a follower and the bookies (``pip install
py-spy``, not a dependency).

``--ab``: no tracing; two groups of 3 replica processes on the same bookies, group A with
``--config-a`` (``RsmConfig`` fields as JSON) and ``--env-a``, group B likewise, one
proposer (or ``--proposers N`` at once) against each in turn for ``--rounds`` rounds (A first
in even rounds, B in odd ones); per round proposals/s, p50/p90/p99, CPU µs and context
switches per proposal over every process, then medians and B/A ratios.

Run: ``.venv/bin/python benchmarks/probe_rsm.py [--seconds 10] [--json OUT] [--profile DIR]``
or ``... --ab --config-a '{"lac_push_delay_s": 0}' --config-b '{}' --rounds 6 --seconds 3``;
an older commit against this one: ``git archive COMMIT | tar -x -C OLD``, lay OLD out as the
installed package (``scriba.testing.mutation.package_view(OLD, VIEW)``), then
``... --ab --own-bookies --env-a PYTHONPATH=VIEW``.
On 2 shared cores the tail is mostly CPU contention: compare runs made together.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import rsm_trace
import tail_trace
from bench_rsm import COMMAND, Replicas, replica_main, timed_load

SITE = "import sys\nsys.path.insert(0, {bench!r})\nimport rsm_trace\nrsm_trace.install_bookie()\n"
HOPS = ("srv_in", "h0", "propose", "flush", "append", "sflush", "lappend", "send", "ack2", "confirm", "sent",
        "apply0", "apply1", "sub1", "srv_out")


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return round(v[min(len(v) - 1, int(q * len(v)))], 3) if v else float("nan")


_TICKS_S = os.sysconf("SC_CLK_TCK")
IDLE_S = 2.0


def cpu_s(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds of each named process (``/proc/<pid>/stat``)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / _TICKS_S
    return out


def profile(pids: dict[str, int], seconds: float, out: Path) -> list[subprocess.Popen[bytes]]:
    """``py-spy record`` (collapsed stacks) of the named processes for ``seconds``."""
    spy = Path(sys.executable).parent / "py-spy"
    out.mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen([str(spy), "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "500", "-f", "raw",
                              "--nonblocking", "-o", str(out / f"{name}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name, pid in pids.items()]


async def drive(addresses: list[str], seconds: float, warmup: int, pids: dict[str, int],
                profile_dir: Path | None = None, replicas: Replicas | None = None
                ) -> tuple[list[tuple[int, int]], dict[str, float]]:
    """One proposal at a time: the (start, end) of each; CPU µs per proposal of each process."""
    from bench_rsm import leader_slot

    from scriba.rsm.remote import RsmClient

    client = RsmClient(addresses, timeout_s=60.0)
    for _ in range(warmup):
        await client.propose(COMMAND)
    spies: list[subprocess.Popen[bytes]] = []
    if profile_dir is not None and replicas is not None:
        slot = await leader_slot(replicas)
        follower = next(s for s in replicas.procs if s != slot)
        targets = {"leader": replicas.procs[slot].pid, "follower": replicas.procs[follower].pid,
                   **{n: pid for n, pid in pids.items() if n.startswith("bookie")}}
        spies = profile(targets, seconds, profile_dir)
    idle0 = cpu_s(pids)
    await asyncio.sleep(IDLE_S)
    idle1 = cpu_s(pids)
    print("idle CPU ms/s: " + json.dumps({n: round((idle1[n] - idle0[n]) / IDLE_S * 1000, 1) for n in idle0 if n in idle1}),
          file=sys.stderr)
    windows: list[tuple[int, int]] = []
    before = cpu_s(pids)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.monotonic_ns()
        await client.propose(COMMAND)
        windows.append((t0, time.monotonic_ns()))
    after = cpu_s(pids)
    for spy in spies:
        spy.wait()
    await client.close()
    per = {name: round((after[name] - before[name]) / max(1, len(windows)) * 1e6) for name in before if name in after}
    return windows, per


class Kinds:
    """One process's events by kind, as sorted times (and the events themselves)."""

    def __init__(self, events: list[list[Any]]) -> None:
        self.times: dict[str, list[int]] = defaultdict(list)
        self.events: dict[str, list[list[Any]]] = defaultdict(list)
        for e in sorted(events, key=lambda e: e[0]):
            self.times[e[1]].append(e[0])
            self.events[e[1]].append(e)

    def first(self, kind: str, t0: int, t1: int) -> int | None:
        times = self.times.get(kind, [])
        i = bisect.bisect_left(times, t0)
        return times[i] if i < len(times) and times[i] <= t1 else None

    def first_event(self, kind: str, t0: int, t1: int) -> list[Any] | None:
        times = self.times.get(kind, [])
        i = bisect.bisect_left(times, t0)
        return self.events[kind][i] if i < len(times) and times[i] <= t1 else None

    def within(self, kind: str, t0: int, t1: int) -> list[list[Any]]:
        times = self.times.get(kind, [])
        return self.events[kind][bisect.bisect_left(times, t0):bisect.bisect_right(times, t1)]


def analyse(windows: list[tuple[int, int]], trace_dir: Path) -> dict[str, Any]:
    procs = {p.stem: Kinds(json.loads(p.read_text())) for p in sorted(trace_dir.glob("*.json"))}
    leader_name = max((k for k in procs if k.startswith("replica")), key=lambda k: len(procs[k].times["propose"]))
    leader = procs[leader_name]
    client = procs.get(next((k for k in procs if k.startswith("client")), ""), Kinds([]))
    bookies = {k: v for k, v in procs.items() if k.startswith("bookie")}
    stages: dict[str, list[float]] = defaultdict(list)
    per: list[dict[str, float]] = []
    for t0, t1 in windows:
        at: dict[str, int | None] = {"client": t0}
        for hop in HOPS:
            if hop == "ack2":
                acks = leader.within("ack", t0, t1)
                at[hop] = acks[1][0] if len(acks) >= 2 else None
            else:
                at[hop] = leader.first(hop, t0, t1)
        at["cresp"] = client.first("cresp", t0, t1)
        at["done"] = t1
        row: dict[str, float] = {"total": (t1 - t0) / 1e6}
        names = ["client", *HOPS, "cresp", "done"]
        for a, b in itertools.pairwise(names):
            if at[a] is not None and at[b] is not None:
                row[f"{a}->{b}"] = (at[b] - at[a]) / 1e6  # type: ignore[operator]
        send = at["send"]
        for name, bk in bookies.items():
            short = name.rsplit("-", 1)[0].removeprefix("bookie-")
            arrive, added = bk.first("arrive", t0, t1), bk.first("added", t0, t1)
            if send is not None and arrive is not None:
                row[f"send->arrive[{short}]"] = (arrive - send) / 1e6
            if arrive is not None and added is not None:
                row[f"arrive->added[{short}]"] = (added - arrive) / 1e6
            syncs = bk.within("sync", t0, t1)
            if syncs:
                row["fdatasync(max in window)"] = max(row.get("fdatasync(max in window)", 0.0),
                                                      max(e[2] for e in syncs))
        # the leader's CPU (main thread) on the way out and on the way back
        for name, a, b in (("cpu: srv_in->sflushed", "srv_in", "sflushed"), ("cpu: sent->srv_out", "sent", "srv_out"),
                           ("cpu: srv_in->srv_out", "srv_in", "srv_out")):
            ea, eb = leader.first_event(a, t0, t1), leader.first_event(b, t0, t1)
            if ea is not None and eb is not None:
                row[name] = (eb[-1] - ea[-1]) / 1e6
        gcs = [e for p in procs.values() for e in p.within("gc", t0, t1)]
        row["gc_ms_in_window"] = sum(e[3] for e in gcs)
        row["leader_gc_ms"] = sum(e[3] for e in leader.within("gc", t0, t1))
        per.append(row)
        for k, v in row.items():
            stages[k].append(v)
    out: dict[str, Any] = {"proposals": len(windows), "leader": leader_name, "stages": {
        k: {"n": len(v), "p50": pct(v, 0.5), "p90": pct(v, 0.9), "p99": pct(v, 0.99), "max": pct(v, 1.0),
            "mean": round(sum(v) / len(v), 3)} for k, v in stages.items()}}
    totals = sorted(r["total"] for r in per)
    cut = totals[int(0.99 * len(totals))] if totals else 0.0
    slow = [r for r in per if r["total"] >= cut]
    medians = {k: out["stages"][k]["p50"] for k in stages}
    excess = {k: round(sum(r.get(k, 0.0) for r in slow) / max(1, len(slow)) - medians[k], 3) for k in stages}
    out["slowest_1pct"] = {"n": len(slow), "from_ms": round(cut, 3),
                           "mean_excess_over_median_ms": dict(sorted(excess.items(), key=lambda kv: -kv[1])),
                           "with_gc": sum(1 for r in slow if r["gc_ms_in_window"] > 0),
                           "with_leader_gc": sum(1 for r in slow if r["leader_gc_ms"] > 0)}
    start, end = (windows[0][0], windows[-1][1]) if windows else (0, 0)
    out["gc_during_load"] = {}
    for name, p in procs.items():
        ev = p.within("gc", start, end)
        out["gc_during_load"][name] = {"collections": len(ev), "by_gen": [sum(1 for e in ev if e[2] == g) for g in range(3)],
                                       "ms_total": round(sum(e[3] for e in ev), 3),
                                       "ms_max": round(max((e[3] for e in ev), default=0.0), 3)}
    syncs = [e[2] for b in bookies.values() for e in b.events.get("sync", [])]
    out["fdatasync_all"] = {"n": len(syncs), "p50": pct(syncs, 0.5), "p99": pct(syncs, 0.99), "max": pct(syncs, 1.0)}
    return out


def show(result: dict[str, Any]) -> None:
    print(f"--- {result['proposals']} proposals, leader {result['leader']}")
    for name, s in result["stages"].items():
        print(f"  {name:28} n {s['n']:6}  p50 {s['p50']:7.3f}  p90 {s['p90']:7.3f}  p99 {s['p99']:7.3f}  "
              f"max {s['max']:8.3f}  mean {s['mean']:7.3f}")
    slow = result["slowest_1pct"]
    print(f"  slowest 1% ({slow['n']} from {slow['from_ms']} ms): with GC anywhere {slow['with_gc']}, "
          f"in the leader {slow['with_leader_gc']}; mean excess over median by stage:")
    for k, v in list(slow["mean_excess_over_median_ms"].items())[:10]:
        print(f"    {k:28} {v:7.3f}")
    print(f"  fdatasync (all bookies): {result['fdatasync_all']}")
    for name, g in result["gc_during_load"].items():
        print(f"  gc {name:26} {g}")
    print(f"  cpu µs per proposal: {result.get('cpu_us_per_proposal')}")


def switches(pids: dict[str, int]) -> dict[str, int]:
    """Context switches (voluntary + involuntary) of every thread of each named process."""
    out: dict[str, int] = {}
    for name, pid in pids.items():
        total = 0
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError):
                for line in (task / "status").read_text().splitlines():
                    if line.endswith("ctxt_switches:") or "ctxt_switches" in line:
                        total += int(line.split()[1])
        out[name] = total
    return out


async def serving(client: Any, timeout_s: float = 60.0) -> None:
    """Propose until one is confirmed: the elected replica may not serve yet (it replays
    first and answers RsmNotLeaderError naming itself meanwhile)."""
    from scriba.errors import RsmNotLeaderError, UnavailableError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await client.propose(COMMAND)
            return
        except (RsmNotLeaderError, UnavailableError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def proposing(addresses: list[str], seconds: float, pids: dict[str, int], proposers: int = 1
                    ) -> tuple[list[float], dict[str, float], dict[str, float]]:
    """``proposers`` callers on one client, each proposing one command at a time: latencies
    (ms); CPU µs and context switches per proposal, by process."""
    from scriba.rsm.remote import RsmClient

    client = RsmClient(addresses, timeout_s=60.0)
    await serving(client)
    for _ in range(100):
        await client.propose(COMMAND)
    cpu0, sw0 = cpu_s(pids), switches(pids)
    _, seconds_each = await timed_load(lambda: client.propose(COMMAND), proposers, seconds)
    cpu1, sw1 = cpu_s(pids), switches(pids)
    latencies = [s * 1000 for s in seconds_each]
    await client.close()
    n = max(1, len(latencies))
    return (latencies, {k: round((cpu1[k] - cpu0[k]) / n * 1e6) for k in cpu0 if k in cpu1},
            {k: round((sw1[k] - sw0[k]) / n, 2) for k in sw0 if k in sw1})


def ab(args: argparse.Namespace) -> dict[str, Any]:
    """Two replica groups on the same bookies, each with its own environment (``--env-a``,
    ``--env-b``: ``K=V,K=V``), one proposer against each in turn, ``--rounds`` times."""
    import bench_rsm

    from scriba.embedded.etcd import EtcdCluster
    from scriba.testing.cluster import BookieCluster

    def env(text: str, config: str) -> dict[str, str]:
        return {**dict(kv.split("=", 1) for kv in text.split(",") if kv), "BENCH_RSM_CONFIG": config or "{}"}

    out: dict[str, Any] = {"rounds": {"A": [], "B": []}, "env": {"A": args.env_a, "B": args.env_b},
                           "config": {"A": args.config_a, "B": args.config_b}, "own_bookies": args.own_bookies}
    specs = (("A", args.env_a, args.config_a), ("B", args.env_b, args.config_b))
    with tempfile.TemporaryDirectory(prefix="probe-rsm-ab-") as tmp:
        base = Path(tmp)
        etcd = EtcdCluster(base / "etcd", 1)
        etcd.start()
        # --own-bookies: each group's bookies run with its environment (another tree on
        # PYTHONPATH: old code against new), under its own metadata prefix
        uris = {k: etcd.uri(f"probe-{k}" if args.own_bookies else "probe") for k, _, _ in specs}
        clusters = ({k: BookieCluster(base / f"bookies-{k}", uris[k], env=env(e, "")) for k, e, _ in specs}
                    if args.own_bookies else {"AB": BookieCluster(base / "bookies", uris["A"])})
        groups = {k: Replicas(uris[k], "probe", f"counter-{k}", script=bench_rsm.__file__, env=env(e, c))
                  for k, e, c in specs}
        try:
            for bookies in clusters.values():
                for zone in ("z1", "z2", "z3"):
                    bookies.add_bookie(zone=zone)
            for group in groups.values():
                for slot in range(3):
                    group.start(slot)
            for i in range(args.rounds):
                # A then B, then B then A: the group measured second in a round ran slower
                # (by ~1.2x at p50 in same-code runs on a busy machine); alternating cancels it
                for k in ("A", "B") if i % 2 == 0 else ("B", "A"):
                    group = groups[k]
                    bookies = clusters.get(k) or clusters["AB"]
                    pids = {"client": os.getpid(), **{f"replica-{s}": p.pid for s, p in group.procs.items()},
                            **{f"bookie-{b.bookie_id}": b.pid for b in bookies.bookies if b.pid is not None}}
                    lat, cpu, sw = asyncio.run(proposing(list(group.addresses.values()), args.seconds, pids,
                                                         args.proposers))
                    out["rounds"][k].append({"n": len(lat), "per_s": round(len(lat) / args.seconds),
                                             "p50": pct(lat, 0.5), "p90": pct(lat, 0.9),
                                             "p99": pct(lat, 0.99), "load": os.getloadavg()[0],
                                             "cpu_us": sum(cpu.values()), "switches": round(sum(sw.values()), 2),
                                             "cpu_by_process": cpu, "switches_by_process": sw})
                    print(k, out["rounds"][k][-1], file=sys.stderr)
        finally:
            for group in groups.values():
                group.stop_all()
            for bookies in clusters.values():
                bookies.stop_all()
            etcd.stop()
    for k in ("A", "B"):
        rounds = out["rounds"][k]
        out[k] = {q: sorted(r[q] for r in rounds)[len(rounds) // 2]
                  for q in ("per_s", "p50", "p90", "p99", "cpu_us", "switches")}
    out["B/A per_s per round"] = [round(b["per_s"] / a["per_s"], 3)
                                  for a, b in zip(out["rounds"]["A"], out["rounds"]["B"], strict=True)]
    out["B/A p50 per round"] = [round(b["p50"] / a["p50"], 3) for a, b in zip(out["rounds"]["A"], out["rounds"]["B"], strict=True)]
    out["B/A p99 per round"] = [round(b["p99"] / a["p99"], 3) for a, b in zip(out["rounds"]["A"], out["rounds"]["B"], strict=True)]
    return out


async def replica(argv: list[str]) -> int:
    rsm_trace.install_replica(os.environ["SCRIBA_TAIL_TRACE"])
    return await replica_main(*argv)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--replica":
        return asyncio.run(replica(sys.argv[2:9]))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--json", type=Path)
    p.add_argument("--profile", type=Path, help="py-spy the leader, a follower and the bookies into this folder")
    p.add_argument("--ab", action="store_true", help="A/B: two replica groups with --env-a / --env-b, alternating")
    p.add_argument("--env-a", default="")
    p.add_argument("--env-b", default="")
    p.add_argument("--config-a", default="", help="RsmConfig fields of group A, as JSON")
    p.add_argument("--config-b", default="", help="RsmConfig fields of group B, as JSON")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--proposers", type=int, default=1,
                   help="--ab: callers proposing at once against each group (64: bench_rsm's throughput load)")
    p.add_argument("--own-bookies", action="store_true",
                   help="--ab: each group its own 3 bookies, run with its --env (e.g. PYTHONPATH=<another tree's "
                        "package view>: an older commit's bookies and replicas against this one's)")
    args = p.parse_args()
    if args.ab:
        result = ab(args)
        print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return 0
    from scriba.embedded.etcd import EtcdCluster
    from scriba.log import configure
    from scriba.testing.cluster import BookieCluster

    configure(stream=sys.stderr, level="warning")
    with tempfile.TemporaryDirectory(prefix="probe-rsm-") as tmp:
        base = Path(tmp)
        env, trace = tail_trace.traced_env(base, SITE.format(bench=str(Path(__file__).parent)))
        etcd = EtcdCluster(base / "etcd", 1)
        etcd.start()
        uri = etcd.uri("probe")
        bookies = BookieCluster(base / "bookies", uri, env=env)
        replicas = Replicas(uri, "probe", script=__file__, env={"SCRIBA_TAIL_TRACE": str(trace)})
        try:
            for zone in ("z1", "z2", "z3"):
                bookies.add_bookie(zone=zone)
            for slot in range(3):
                replicas.start(slot)
            rsm_trace.install_client()
            pids = {"client": os.getpid(), **{f"replica-{p.pid}": p.pid for p in replicas.procs.values()},
                    **{f"bookie-{b.bookie_id}": b.pid for b in bookies.bookies if b.pid is not None}}
            windows, cpu = asyncio.run(drive(list(replicas.addresses.values()), args.seconds, args.warmup, pids,
                                             args.profile, replicas))
        finally:
            for proc in replicas.procs.values():
                proc.send_signal(signal.SIGTERM)
            for proc in replicas.procs.values():
                try:
                    proc.wait(timeout=20)
                except Exception:
                    proc.kill()
                    proc.wait()
                if proc.stdout is not None:
                    proc.stdout.close()
            bookies.stop_all()
            etcd.stop()
        tail_trace._dump(trace / f"client-{os.getpid()}.json")
        result = analyse(windows, trace)
        result["cpu_us_per_proposal"] = cpu
    show(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
