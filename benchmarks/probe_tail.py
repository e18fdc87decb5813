"""Probe (not a benchmark): where the time goes between an append and a tailing reader's
delivery, hop by hop, at 1k records/s.

One etcd, 3 bookie processes (``tail_trace`` installed in each through a
``sitecustomize`` on ``PYTHONPATH``). For each case (a bare ledger or a stream, over the
binary data path or gRPC) a writer child paces 1k 100-byte records/s, each carrying its
send time, and a reader child tails; every process notes the hops (``tail_trace``), and
the parent joins them per entry:

  append -> lappend   (stream only: the record packed into a ledger entry)
  lappend -> send     (the add taken into a message to the bookies)
  send -> added       (per bookie: network, decode, journal write + fdatasync, answer)
  added -> ack        (per bookie: the answer back at the writer)
  ack2 -> confirm     (the ack quorum's second answer -> the entry confirmed)
  confirm -> lac_out  (the LAC leaves the writer: an explicit push, or a later entry)
  lac_out -> lac_at   (the LAC known at the bookie the reader polls)
  lac_at(first)->polled (the LAC known at the first bookie -> at the polled one)
  lac_at -> answered  (that bookie answers the reader's long poll)
  answered -> lpd     (the answer back at the reader)
  lpd -> delivered    (to the consumer)

Also: ``lac_by_push`` (the share of entries whose LAC reached the polled bookie by an
explicit push rather than a later entry), ``poll_armed_late`` (answers whose poll reached
the bookie after it already knew the LAC: how late), ``reader_rearm_gap`` (an answer back
-> the reader's next poll sent) and every bookie's fdatasync durations.

Run: ``.venv/bin/python benchmarks/probe_tail.py [--seconds 3] [--cases ledger-binary,stream-binary,...]
[--lac-at adds|added] [--json OUT] [--keep DIR]`` (``--lac-at added`` for bookies that
learn a carried LAC only once the entry is durable, i.e. before this branch). Figures on
2 shared cores are dominated by CPU contention: compare runs made together.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import tail_trace
from bench_stream import SENT, STREAM, paced_appends

from scriba.grpc_runtime import apply_defaults

apply_defaults()

from scriba.log import configure  # noqa: E402

CASES = ("ledger-binary", "stream-binary", "ledger-grpc", "stream-grpc")
SITE = "import sys\nsys.path.insert(0, {bench!r})\nimport tail_trace\ntail_trace.install('bookie')\n"


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return round(v[min(len(v) - 1, int(q * len(v)))], 3) if v else float("nan")


async def _client(uri: str, protocol: str) -> Any:
    from scriba.client import Client, ClientConfig

    return await Client.connect(uri, config=ClientConfig(transport_protocol=protocol))


async def writer(uri: str, kind: str, protocol: str, namespace: str, seconds: float) -> dict[str, Any]:
    from scriba.stream import open_namespace

    client = await _client(uri, protocol)
    if kind == "ledger":
        w = await client.create_ledger(3, 3, 2)
        print(f"ledger {w.ledger_id}", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        count = await paced_appends(w.append_async, seconds)
        await w.close()
    else:
        ns = await open_namespace(client, namespace, create=True)
        sw = await ns.open_writer(STREAM)
        print("ledger 0", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        count = await paced_appends(sw.append_async, seconds)
        await sw.close()
    await client.close()
    return {"records": count}


async def reader(uri: str, kind: str, protocol: str, namespace: str, ledger_id: int) -> dict[str, Any]:
    from scriba.stream import open_namespace

    client = await _client(uri, protocol)
    delivered: list[tuple[int, int, int]] = []  # (entry id, sent ns, delivered ns)
    if kind == "ledger":
        r = await client.open_ledger(ledger_id, recovery=False)
        print("ready", flush=True)
        async for entry in r.tail(0):
            seen = time.monotonic_ns()
            delivered.append((int(entry.entry_id), SENT.unpack_from(entry.payload)[0], seen))
            if entry.payload[SENT.size:SENT.size + 1] == b"L":
                break
    else:
        ns = await open_namespace(client, namespace)
        sr = await ns.open_reader(STREAM, "latest")
        print("ready", flush=True)
        async for record in sr:
            seen = time.monotonic_ns()
            delivered.append((record.position.entry_id, SENT.unpack_from(record.payload)[0], seen))
            if record.payload[SENT.size:SENT.size + 1] == b"L":
                break
        await sr.close()
    await client.close()
    return {"delivered": delivered}


# --- analysis -----------------------------------------------------------------------------
def load(trace_dir: Path) -> dict[str, list[list[Any]]]:
    """Events per process file stem (``writer-<pid>``, ``bookie-<id>-<pid>``...)."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(trace_dir.glob("*.json"))}


def first_covering(events: list[list[Any]], kind: str, ledger_id: int, pos: int = 2) -> dict[int, int]:
    """entry id -> the earliest time of an event ``(t, kind, ..., ledger, first, last)``."""
    out: dict[int, int] = {}
    for e in events:
        if e[1] == kind and e[pos] == ledger_id:
            for eid in range(e[pos + 1], e[pos + 2] + 1):
                out.setdefault(eid, e[0])
    return out


def lac_reach(times_lacs: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Sorted (time, running max LAC) for "LAC >= N first known at" look-ups."""
    times: list[int] = []
    maxes: list[int] = []
    best = -1
    for t, lac in sorted(times_lacs):
        if lac > best:
            best = lac
            times.append(t)
            maxes.append(best)
    return times, maxes


def reach_time(reach: tuple[list[int], list[int]], entry_id: int) -> int | None:
    times, maxes = reach
    i = bisect.bisect_left(maxes, entry_id)
    return times[i] if i < len(times) else None


def analyse(trace: dict[str, list[list[Any]]], delivered: list[list[int]],
            lac_at_event: str = "adds") -> dict[str, dict[str, float]]:
    wr = next(v for k, v in trace.items() if k.startswith("writer"))
    rd = next(v for k, v in trace.items() if k.startswith("reader"))
    bookies = {k.split("-", 1)[1].rsplit("-", 1)[0]: v for k, v in trace.items() if k.startswith("bookie")}
    stages: dict[str, list[float]] = defaultdict(list)
    lappends = [e for e in wr if e[1] == "lappend"]
    ledger_id = lappends[-1][2]
    lappend = {e[3]: e[0] for e in lappends if e[2] == ledger_id}
    carried = [(e[0], e[4]) for e in lappends if e[2] == ledger_id]  # entry sent, LAC it carries
    send = first_covering(wr, "send", ledger_id)
    confirm = first_covering(wr, "confirm", ledger_id)
    acks: dict[str, dict[int, int]] = defaultdict(dict)
    for e in wr:
        if e[1] == "ack" and e[3] == ledger_id:
            for eid in range(e[4], e[5] + 1):
                acks[e[2]].setdefault(eid, e[0])
    pushes = [(e[0], e[3]) for e in wr if e[1] == "push" and e[2] == ledger_id]
    lac_out = lac_reach(carried + pushes)
    # at each bookie: when it learned LAC >= N (explicit push, or an entry carrying it made durable)
    lac_at: dict[str, tuple[list[int], list[int]]] = {}
    added: dict[str, dict[int, int]] = {}
    polled: dict[str, list[tuple[int, int, int, int]]] = {}  # answer time, previous, lac, start
    carries = {e[3]: e[4] for e in lappends if e[2] == ledger_id}
    for b, ev in bookies.items():
        added[b] = first_covering(ev, "added", ledger_id)
        known = [(e[0], e[3]) for e in ev if e[1] == "wlac" and e[2] == ledger_id]
        # a carried LAC counts from the entry's admission (raised before its journal write;
        # ``lac_at="added"``: from when it is durable, as bookies did before)
        known += [(t, carries.get(eid, -1)) for eid, t in first_covering(ev, lac_at_event, ledger_id).items()]
        lac_at[b] = lac_reach(known)
        starts: dict[int, list[int]] = defaultdict(list)
        answers = []
        for e in ev:
            if e[1] == "poll" and e[2] == ledger_id:
                starts[e[3]].append(e[0])
            elif e[1] == "polled" and e[2] == ledger_id:
                start = starts[e[3]].pop(0) if starts[e[3]] else e[0]
                answers.append((e[0], e[3], e[4], start))
        polled[b] = answers
    lpd = [(e[0], e[2], e[5], e[6]) for e in rd if e[1] == "lpd" and e[3] == ledger_id]
    lps = sorted(e[0] for e in rd if e[1] == "lp" and e[3] == ledger_id)
    for t, *_ in lpd:  # the reader's re-arm gap: an answer back -> its next poll sent
        i = bisect.bisect_left(lps, t)
        if i < len(lps):
            stages["reader_rearm_gap"].append((lps[i] - t) / 1e6)
    push_at = {b: lac_reach([(e[0], e[3]) for e in ev if e[1] == "wlac" and e[2] == ledger_id])
               for b, ev in bookies.items()}
    def add(name: str, a: int | None, b: int | None) -> None:
        if a is not None and b is not None:
            stages[name].append((b - a) / 1e6)

    for eid, sent, seen in delivered:
        add("total", sent, seen)
        add("append->lappend", sent, lappend.get(eid))
        add("lappend->send", lappend.get(eid), send.get(eid))
        ack_times = sorted(a[eid] for a in acks.values() if eid in a)
        for b in bookies:
            if eid in added[b]:
                add("send->added(each)", send.get(eid), added[b][eid])
                bid = next((k for k in acks if k.endswith(b) or b.endswith(k)), None)
                if bid is not None and eid in acks[bid]:
                    add("added->ack(each)", added[b][eid], acks[bid][eid])
        if len(ack_times) >= 2:
            add("send->ack2", send.get(eid), ack_times[1])
            add("ack2->confirm", ack_times[1], confirm.get(eid))
        out = reach_time(lac_out, eid)
        add("confirm->lac_out", confirm.get(eid), out)
        # the reader's answer that first covered eid, and the bookie that gave it
        answer = next(((t, b) for t, b, lac, n in lpd if lac >= eid), None)
        if answer is None:
            continue
        t_lpd, b_id = answer
        polled_bookie = next((k for k in bookies if k.endswith(b_id) or b_id.endswith(k)), None)
        if polled_bookie is None:
            continue
        b = polled_bookie
        at = reach_time(lac_at[b], eid)
        by_push = reach_time(push_at[b], eid)
        stages["lac_by_push(1=yes)"].append(1.0 if by_push is not None and by_push == at else 0.0)
        add("push->wlac(polled)", reach_time(lac_reach(pushes), eid), by_push)
        add("lac_out->lac_at", out, at)
        # how much later the polled bookie knew it than the first bookie that did (what a
        # reader polling every replica at once could gain)
        firsts = [t for t in (reach_time(lac_at[k], eid) for k in bookies) if t is not None]
        if firsts:
            add("lac_at(first)->polled", min(firsts), at)
        ans = next(((t, start) for t, prev, lac, start in polled[b] if lac >= eid and prev < eid), None)
        if ans is not None:
            add("lac_at->answered", at, ans[0])
            if at is not None and ans[1] > at:
                stages["poll_armed_late"].append((ans[1] - at) / 1e6)
            add("answered->lpd", ans[0], t_lpd)
        add("lpd->delivered", t_lpd, seen)
        add("confirm->delivered", confirm.get(eid), seen)
    syncs = [e[2] for ev in bookies.values() for e in ev if e[1] == "sync"]
    result = {name: {"n": len(v), "p50": pct(v, 0.5), "p90": pct(v, 0.9), "p99": pct(v, 0.99),
                     "mean": round(sum(v) / len(v), 3) if v else float("nan")} for name, v in stages.items()}
    result["fdatasync(all bookies)"] = {"n": len(syncs), "p50": pct(syncs, 0.5), "p90": pct(syncs, 0.9),
                                        "p99": pct(syncs, 0.99), "mean": float("nan")}
    pushes_n = len(pushes)
    result["writer"] = {"n": len(lappend), "p50": pushes_n, "p90": float("nan"), "p99": float("nan"),
                        "mean": float("nan")}
    return result


def show(case: str, result: dict[str, dict[str, float]]) -> None:
    print(f"--- {case}  (writer row: entries, explicit pushes)")
    for name, s in result.items():
        print(f"  {name:24} n {s['n']:6}  p50 {s['p50']:8.3f}  p90 {s['p90']:8.3f}  p99 {s['p99']:8.3f}  mean {s['mean']:8.3f}")


# --- the parent ------------------------------------------------------------------------------
def spawn(trace_dir: Path, mode: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "SCRIBA_TAIL_TRACE": str(trace_dir)}
    return subprocess.Popen([sys.executable, __file__, "--child", mode, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def result_of(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=180)
    if os.environ.get("PROBE_LOG"):
        print(err[-6000:], file=sys.stderr)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(err[-3000:])
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def run_case(uri: str, case: str, trace_dir: Path, bookie_trace: Path, seconds: float) -> dict[str, Any]:
    kind, protocol = case.split("-")
    case_dir = trace_dir / case
    case_dir.mkdir()
    namespace = f"probe/{case}-{time.monotonic_ns() % 100000}"
    common = ["--uri", uri, "--kind", kind, "--protocol", protocol, "--namespace", namespace]
    if kind == "stream":
        async def create() -> None:
            from scriba.stream import open_namespace

            client = await _client(uri, protocol)
            await (await open_namespace(client, namespace, create=True)).create_stream(STREAM)
            await client.close()
        asyncio.run(create())
    def start_reader(ledger_id: int) -> subprocess.Popen[str]:
        r = spawn(case_dir, "reader", *common, "--ledger", str(ledger_id))
        assert r.stdout is not None
        if r.stdout.readline().strip() != "ready":
            raise RuntimeError(r.communicate(timeout=10)[1][-2000:])
        return r

    r = start_reader(0) if kind == "stream" else None  # a stream's reader from "latest", before any record
    w = spawn(case_dir, "writer", *common, "--seconds", str(seconds))
    assert w.stdout is not None and w.stdin is not None
    ledger_id = int(w.stdout.readline().split()[1])
    r = r or start_reader(ledger_id)
    w.stdin.write("go\n")
    w.stdin.flush()
    result_of(w)
    delivered = result_of(r)["delivered"]
    return {"delivered": delivered, "dir": str(case_dir)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--child")
    p.add_argument("--uri")
    p.add_argument("--kind", default="ledger")
    p.add_argument("--protocol", default="binary")
    p.add_argument("--namespace", default="probe/x")
    p.add_argument("--ledger", type=int, default=0)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--json", default=None)
    p.add_argument("--lac-at", default="adds", choices=("adds", "added"),
                   help="when a bookie learns a carried LAC: at the entry's admission, or once durable (older bookies)")
    p.add_argument("--keep", default=None, help="keep the traces in a new folder under this one")
    args = p.parse_args()
    configure(level=os.environ.get("PROBE_LOG", "warning"))
    if args.child:
        tail_trace.install(args.child)
        if args.child == "writer":
            out = asyncio.run(writer(args.uri, args.kind, args.protocol, args.namespace, args.seconds))
        else:
            out = asyncio.run(reader(args.uri, args.kind, args.protocol, args.namespace, args.ledger))
        print(json.dumps(out), flush=True)
        return
    from scriba.embedded.etcd import EtcdCluster
    from scriba.testing.cluster import BookieCluster

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="probe-tail-") as tmp:
        if args.keep:
            tmp = tempfile.mkdtemp(prefix="probe-tail-", dir=args.keep)
        base = Path(tmp)
        site = base / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITE.format(bench=str(Path(__file__).parent)))
        bookie_trace = base / "bookie-trace"
        bookie_trace.mkdir()
        etcd = EtcdCluster(base / "etcd", 1)
        etcd.start()
        uri = etcd.uri("probe")
        env = {"PYTHONPATH": str(site), "SCRIBA_TAIL_TRACE": str(bookie_trace)}
        bookies = BookieCluster(base / "bookies", uri, env=env)
        runs: dict[str, Any] = {}
        try:
            for zone in ("z1", "z2", "z3"):
                bookies.add_bookie(zone=zone)
            for case in args.cases.split(","):
                runs[case] = run_case(uri, case, base, bookie_trace, args.seconds)
        finally:
            bookies.stop_all()
            etcd.stop()
        bookie_events = load(bookie_trace)
        for case, run in runs.items():
            trace = {**load(Path(run["dir"])), **bookie_events}
            results[case] = analyse(trace, run["delivered"], args.lac_at)
            show(case, results[case])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
