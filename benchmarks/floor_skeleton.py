"""The floor of the latency goals in Python on this machine: the same hops as Scriba's,
done by the least code that can do them, measured beside the real thing in one run.

#20 (one append in flight: p50 <= 0.7 ms), #13 (one proposer: that plus one hop, p99 <= 3 ms)
and #12 (tail visibility at 1k records/s: p99 <= 5 ms) are set for Python processes on a
2-core machine. Whether a miss is our code or the platform is a question of what the
*minimum* implementation of the same protocol costs here. This file is that minimum:

* 3 **skeleton bookies** (one asyncio process each, the standard loop as Scriba's default):
  a frame is ``u32 len | u8 type | body``, read with ``recv_into`` a reused buffer; an ADD is written with ``os.write`` to a
  journal file and made durable with ``os.fdatasync`` on the loop (Scriba's idle path),
  then acknowledged; a LAC push raises the ledger's LAC and answers waiting long polls
  with the entries; a long poll for "after N" is answered at once or when the LAC passes N,
  with every entry up to the LAC in one write (a reader that fell behind catches up in one
  round trip: with one entry per poll, the skeleton's own tail queued behind any pause).
  No digests, no metadata, no index, no write cache, no metrics, no checks: only what
  the wire and the disk need.
* **one in flight:** a client sends each 1 KiB ADD to all 3 and starts the next when 2
  have answered (E3/W3/A2), like ``scriba bench --inflight 1``.
* **one proposer (#13's hop):** a client sends one 64-byte command at a time to a
  skeleton **leader** process, which appends it as above (E3/W3/A2, LAC pushed at once),
  counts it applied at its confirmation and answers; two skeleton **followers** (one
  process each) long-poll a bookie each and apply every entry, as replicas tail the
  stream. (Scriba's leader defers its push, ``RsmConfig.lac_push_delay_s``; the skeleton's
  immediate push costs it more, not less.) ``--compare`` does not run Scriba's side of
  this one: run ``bench_rsm.py``, whose "one proposer" is the same measurement, beside it.
* **tail:** a writer paces 1k 100-byte entries a second (each carries its send time),
  confirms at 2 acks and pushes the LAC to all 3 at once (Scriba's explicit push); a
  reader long-polls one skeleton bookie and notes when each entry reaches it.

``--compare`` then runs the one-in-flight and tail measurements on 3 real bookies (one etcd) in the
same run: ``scriba bench --inflight 1 --entries N`` and ``bench_stream``'s bare-ledger
tail. Every process's CPU per entry is printed beside the latencies: on 2 cores, the tail
at 1k/s is a question of how much of the machine the hops leave idle.

Run: ``.venv/bin/python benchmarks/floor_skeleton.py [--entries 3000] [--seconds 5]
[--rounds 2] [--compare] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from proc_cpu import pids_cpu_s

HEAD = struct.Struct("<IB")  # body length (type byte included), type
ADD, ACK, LAC, POLL, ENTRY, PROPOSE, ANSWER = 1, 2, 3, 4, 5, 6, 7
U64 = struct.Struct("<Q")
SENT = struct.Struct("<q")  # as bench_stream: a tail entry starts with its send time


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _pct(values: list[float], q: float) -> float:
    from scriba.client.bench import percentile

    return round(percentile(sorted(values), q), 3) if values else 0.0


def frame(kind: int, body: bytes) -> bytes:
    return HEAD.pack(len(body) + 1, kind) + body


class Framed(asyncio.BufferedProtocol):
    """Cuts the byte stream into frames and hands each to ``on_frame(kind, body)``; reads
    land in a reused buffer (``recv_into``), as Scriba's do (``scriba.frame_read``)."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.read_view = memoryview(bytearray(256 * 1024))
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.read_view

    def buffer_updated(self, nbytes: int) -> None:
        buf = self.buf
        buf += self.read_view[:nbytes]
        pos = 0
        while len(buf) - pos >= HEAD.size:
            length, kind = HEAD.unpack_from(buf, pos)
            end = pos + 4 + length
            if end > len(buf):
                break
            self.on_frame(kind, bytes(buf[pos + HEAD.size:end]))
            pos = end
        del buf[:pos]

    def on_frame(self, kind: int, body: bytes) -> None:
        raise NotImplementedError

    def send(self, kind: int, body: bytes) -> None:
        self.send_frames((frame(kind, body),))

    def send_frames(self, frames: Iterable[bytes]) -> None:
        """Frames already built, in one write."""
        assert self.transport is not None
        self.transport.write(b"".join(frames))


class Bookie:
    """One skeleton bookie's state: the journal's fd, the entries, the LAC and its waiters."""

    def __init__(self, journal: Path) -> None:
        self.fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.entries: dict[int, bytes] = {}
        self.lac = -1
        self.waiters: list[tuple[int, BookieConn]] = []
        self.missing: dict[int, list[BookieConn]] = {}  # confirmed by the others, not here yet

    def add(self, entry_id: int, data: bytes) -> None:
        os.write(self.fd, U64.pack(entry_id) + data)
        os.fdatasync(self.fd)
        self.entries[entry_id] = data
        for conn in self.missing.pop(entry_id, []):
            self.answer(entry_id - 1, conn)

    def raise_lac(self, lac: int) -> None:
        if lac <= self.lac:
            return
        self.lac = lac
        ready = [w for w in self.waiters if w[0] < lac]
        self.waiters = [w for w in self.waiters if w[0] >= lac]
        for after, conn in ready:
            self.answer(after, conn)

    def answer(self, after: int, conn: BookieConn) -> None:
        """Every entry after ``after`` up to the LAC that is here, in one write (a reader
        that fell behind catches up in one round trip, as Scriba's read-ahead does); each
        frame names the answer's last entry, after which the reader polls again."""
        first = after + 1
        if first not in self.entries:
            self.missing.setdefault(first, []).append(conn)
            return
        last = first
        while last < self.lac and last + 1 in self.entries:
            last += 1
        head = U64.pack(last)
        conn.send_frames(frame(ENTRY, head + U64.pack(e) + self.entries[e]) for e in range(first, last + 1))


class BookieConn(Framed):
    def __init__(self, bookie: Bookie) -> None:
        super().__init__()
        self.bookie = bookie

    def on_frame(self, kind: int, body: bytes) -> None:
        b = self.bookie
        if kind == ADD:
            (entry_id,) = U64.unpack_from(body)
            (lac,) = U64.unpack_from(body, 8)
            b.add(entry_id, body[16:])
            self.send(ACK, body[:8])
            b.raise_lac(lac - 1)  # the piggybacked LAC (stored +1 so -1 fits a u64)
        elif kind == LAC:
            b.raise_lac(U64.unpack_from(body)[0])
        elif kind == POLL:
            (after,) = U64.unpack_from(body)
            after -= 1
            if b.lac > after:
                b.answer(after, self)
            else:
                b.waiters.append((after, self))


async def _ready_until_stdin_closes() -> None:
    """Tell the parent the child serves, then serve until the parent closes stdin (its stop)."""
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)


async def serve(port: int, journal: Path) -> None:
    bookie = Bookie(journal)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: BookieConn(bookie), "127.0.0.1", port)
    await _ready_until_stdin_closes()
    server.close()


class WriterConn(Framed):
    """The writer's link to one bookie: an ACK resolves the entry's count of answers."""

    def __init__(self, on_ack: Any) -> None:
        super().__init__()
        self.on_ack = on_ack

    def on_frame(self, kind: int, body: bytes) -> None:
        if kind == ACK:
            self.on_ack(U64.unpack_from(body)[0])


class Writer:
    """E3/W3/A2: each entry to all 3; confirmed at the 2nd ACK, in order; LAC pushed at once."""

    def __init__(self, push_lac: bool) -> None:
        self.conns: list[WriterConn] = []
        self.acks: dict[int, int] = {}
        self.waiting: dict[int, asyncio.Future[None]] = {}
        self.lac = -1
        self.next_id = 0
        self.push_lac = push_lac

    async def connect(self, ports: list[int]) -> None:
        loop = asyncio.get_running_loop()
        for port in ports:
            _, conn = await loop.create_connection(lambda: WriterConn(self.on_ack), "127.0.0.1", port)
            self.conns.append(conn)

    def append(self, data: bytes) -> asyncio.Future[None]:
        entry_id = self.next_id
        self.next_id += 1
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting[entry_id] = fut
        self.acks[entry_id] = 0
        body = U64.pack(entry_id) + U64.pack(self.lac + 1) + data
        for conn in self.conns:
            conn.send(ADD, body)
        return fut

    def on_ack(self, entry_id: int) -> None:
        if entry_id not in self.acks:
            return
        self.acks[entry_id] += 1
        moved = False
        while self.acks.get(self.lac + 1, 0) >= 2:
            self.lac += 1
            del self.acks[self.lac]
            self.waiting.pop(self.lac).set_result(None)
            moved = True
        if moved and self.push_lac:
            for conn in self.conns:
                conn.send(LAC, U64.pack(self.lac))


async def one_in_flight(ports: list[int], entries: int) -> dict[str, Any]:
    writer = Writer(push_lac=False)
    await writer.connect(ports)
    payload = b"v" * 1024
    latencies: list[float] = []
    cpu0 = _cpu_s()
    for _ in range(entries):
        t0 = time.perf_counter()
        await writer.append(payload)
        latencies.append((time.perf_counter() - t0) * 1000)
    return {"entries": entries, "p50_ms": _pct(latencies, 0.5), "p99_ms": _pct(latencies, 0.99),
            "client_cpu_us": round((_cpu_s() - cpu0) / entries * 1e6, 1)}


async def tail_writer(ports: list[int], seconds: float) -> dict[str, Any]:
    """``bench_stream``'s pacing and payloads (the same writer loop as the real tail runs)."""
    from bench_stream import CPU_S, paced_appends

    writer = Writer(push_lac=True)
    await writer.connect(ports)
    count = await paced_appends(writer.append, seconds)
    return {"records": count, "cpu_us": round(CPU_S[0] / count * 1e6, 1)}


class ReaderConn(Framed):
    def __init__(self, done: asyncio.Future[None]) -> None:
        super().__init__()
        self.latencies: list[float] = []
        self.done = done
        self.seen = -1

    def on_frame(self, kind: int, body: bytes) -> None:
        (last,), (entry_id,) = U64.unpack_from(body), U64.unpack_from(body, 8)
        data = body[16:]
        if entry_id == self.seen + 1 and data:
            (sent,) = SENT.unpack_from(data)
            self.latencies.append((time.monotonic_ns() - sent) / 1e6)
            self.seen = entry_id
            if data[SENT.size:SENT.size + 1] == b"L":
                self.done.set_result(None)
                return
        if entry_id == last:  # the answer's last entry: poll for the next
            self.send(POLL, U64.pack(self.seen + 1))


async def tail_reader(port: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    _, conn = await loop.create_connection(lambda: ReaderConn(done), "127.0.0.1", port)
    conn.send(POLL, U64.pack(0))
    print("ready", flush=True)
    cpu0 = _cpu_s()
    await done
    n = len(conn.latencies)
    return {"records": n, "p50_ms": _pct(conn.latencies, 0.5), "p99_ms": _pct(conn.latencies, 0.99),
            "cpu_us": round((_cpu_s() - cpu0) / max(n, 1) * 1e6, 1)}


class LeaderConn(Framed):
    """The skeleton leader's side of one client: each PROPOSE is appended; its ANSWER (the
    counter after the apply) is written when the append confirms."""

    def __init__(self, writer: Writer, state: list[int]) -> None:
        super().__init__()
        self.writer = writer
        self.state = state

    def on_frame(self, kind: int, body: bytes) -> None:
        if kind == PROPOSE:
            self.writer.append(body).add_done_callback(self._applied)

    def _applied(self, _confirmed: asyncio.Future[None]) -> None:
        self.state[0] += 1
        self.send(ANSWER, U64.pack(self.state[0]))


async def lead(port: int, ports: list[int]) -> None:
    writer = Writer(push_lac=True)
    await writer.connect(ports)
    state = [0]
    server = await asyncio.get_running_loop().create_server(lambda: LeaderConn(writer, state), "127.0.0.1", port)
    await _ready_until_stdin_closes()
    server.close()


async def follow(port: int) -> None:
    """A follower: tails one bookie until stdin closes (its entries' latencies are not kept)."""
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(lambda: ReaderConn(loop.create_future()), "127.0.0.1", port)
    conn.send(POLL, U64.pack(0))
    await _ready_until_stdin_closes()


class ProposerConn(Framed):
    def __init__(self) -> None:
        super().__init__()
        self.answer: asyncio.Future[int] | None = None

    def on_frame(self, kind: int, body: bytes) -> None:
        if kind == ANSWER and self.answer is not None:
            self.answer.set_result(U64.unpack_from(body)[0])


async def one_proposer(port: int, entries: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(ProposerConn, "127.0.0.1", port)
    latencies: list[float] = []
    cpu0 = _cpu_s()
    for i in range(entries):
        conn.answer = loop.create_future()
        t0 = time.perf_counter()
        conn.send(PROPOSE, SENT.pack(time.monotonic_ns()) + b"c" * (64 - SENT.size))
        if await conn.answer != i + 1:
            raise RuntimeError("the skeleton leader answered out of order")
        latencies.append((time.perf_counter() - t0) * 1000)
    return {"entries": entries, "p50_ms": _pct(latencies, 0.5), "p99_ms": _pct(latencies, 0.99),
            "client_cpu_us": round((_cpu_s() - cpu0) / entries * 1e6, 1)}


def _child(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, "--child", *argv], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode})")
    return dict(json.loads(out.strip().splitlines()[-1]))


def _servers(base: Path, tag: str) -> tuple[list[int], list[subprocess.Popen[str]]]:
    from scriba.embedded.process import free_ports

    ports = free_ports(3)
    servers = [_child(["server", "--port", str(p), "--journal", str(base / f"{tag}{i}.jnl")])
               for i, p in enumerate(ports)]
    for s in servers:
        assert s.stdout is not None and s.stdout.readline().strip() == "ready"
    return ports, servers


def _stop(servers: list[subprocess.Popen[str]]) -> None:
    for s in servers:
        if s.stdin is not None:
            s.stdin.close()
    for s in servers:
        s.wait(timeout=30)
        if s.stdout is not None:
            s.stdout.close()


def skeleton_round(base: Path, entries: int, seconds: float) -> dict[str, Any]:
    """Fresh skeleton bookies for each part (each part's entries start at 0)."""
    ports, servers = _servers(base, "one")
    try:
        cpu0 = pids_cpu_s([s.pid for s in servers])
        one = _result(_child(["one", "--ports", ",".join(map(str, ports)), "--entries", str(entries)]))
        one["bookies_cpu_us"] = round((pids_cpu_s([s.pid for s in servers]) - cpu0) / entries * 1e6, 1)
    finally:
        _stop(servers)
    ports, servers = _servers(base, "rsm")
    replicas: list[subprocess.Popen[str]] = []
    try:
        from scriba.embedded.process import free_ports

        leader_port = free_ports(1)[0]
        replicas = [_child(["leader", "--port", str(leader_port), "--ports", ",".join(map(str, ports))]),
                    *(_child(["follower", "--port", str(p)]) for p in ports[1:])]
        for r in replicas:
            assert r.stdout is not None and r.stdout.readline().strip() == "ready"
        pids = [s.pid for s in servers + replicas]
        cpu0 = pids_cpu_s(pids)
        rsm = _result(_child(["proposer", "--port", str(leader_port), "--entries", str(entries)]))
        rsm["servers_cpu_us"] = round((pids_cpu_s(pids) - cpu0) / entries * 1e6, 1)
    finally:
        _stop(replicas + servers)
    ports, servers = _servers(base, "tail")
    try:
        reader = _child(["reader", "--port", str(ports[0])])
        assert reader.stdout is not None and reader.stdout.readline().strip() == "ready"
        cpu0 = pids_cpu_s([s.pid for s in servers])
        written = _result(_child(["writer", "--ports", ",".join(map(str, ports)), "--seconds", str(seconds)]))
        seen = _result(reader)
        bookies_us = (pids_cpu_s([s.pid for s in servers]) - cpu0) / written["records"] * 1e6
    finally:
        _stop(servers)
    return {"one_in_flight": one, "one_proposer": rsm,
            "tail": {**seen, "writer_cpu_us": written["cpu_us"], "bookies_cpu_us": round(bookies_us, 1)}}


def real_round(uri: str, entries: int, seconds: float, bookie_pids: list[int]) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_client import run_scriba_bench
    from bench_stream import ledger_tail_visibility

    one = run_scriba_bench(uri, seconds=None, entries=entries, inflight=1, ledgers=1)
    tail = ledger_tail_visibility(uri, seconds, bookie_pids)
    return {"one_in_flight": {k: v for k, v in one.items() if "latency" in k or "cpu" in k},
            "tail": {k: tail[k] for k in ("p50_ms", "p99_ms", "writer_cpu_us_per_record",
                                           "reader_cpu_us_per_record", "bookies_cpu_us_per_record")}}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", nargs="?")
    p.add_argument("--port", type=int)
    p.add_argument("--ports")
    p.add_argument("--journal")
    p.add_argument("--entries", type=int, default=3000)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--compare", action="store_true", help="also run 3 real bookies' figures, alternating")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.child:
        ports = [int(x) for x in args.ports.split(",")] if args.ports else []
        run = {"server": lambda: serve(args.port, Path(args.journal)),
               "one": lambda: one_in_flight(ports, args.entries),
               "writer": lambda: tail_writer(ports, args.seconds),
               "reader": lambda: tail_reader(args.port),
               "leader": lambda: lead(args.port, ports),
               "follower": lambda: follow(args.port),
               "proposer": lambda: one_proposer(args.port, args.entries)}[args.child]
        result = asyncio.run(run())
        if result is not None:
            print(json.dumps(result), flush=True)
        return
    results: dict[str, list[dict[str, Any]]] = {"skeleton": [], "scriba": []}
    with tempfile.TemporaryDirectory(prefix="floor-") as tmp:
        base = Path(tmp)
        cluster: Any = None
        if args.compare:
            from scriba.embedded.bookie import BookieProcess
            from scriba.embedded.etcd import EtcdCluster
            from scriba.log import configure

            configure(level="warning")
            etcd = EtcdCluster(base / "etcd", 1)
            etcd.start()
            uri = etcd.uri("floor")
            bookies = [BookieProcess(base / f"bookie-{i}", uri, bookie_id=f"bookie-{i}") for i in range(3)]
            for b in bookies:
                b.start()
            cluster = (etcd, bookies, uri)
        try:
            for r in range(args.rounds):
                (base / f"s{r}").mkdir()
                results["skeleton"].append(skeleton_round(base / f"s{r}", args.entries, args.seconds))
                print("skeleton", json.dumps(results["skeleton"][-1]), flush=True)
                if cluster is not None:
                    etcd, bookies, uri = cluster
                    results["scriba"].append(real_round(uri, args.entries, args.seconds,
                                                        [b.pid for b in bookies if b.pid is not None]))
                    print("scriba  ", json.dumps(results["scriba"][-1]), flush=True)
        finally:
            if cluster is not None:
                for b in cluster[1]:
                    b.stop()
                cluster[0].stop()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
