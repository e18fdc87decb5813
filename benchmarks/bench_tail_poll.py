"""Benchmark: a tailing reader's CPU per entry and delivery delay against scripted bookies,
this tree against a base ref, alternating in one session.

What it isolates: ``LedgerReader.tail``'s own work per entry (its long polls, hedged at two
replicas, over the real ``BinaryTransport``; the answers' decoding and verification; the
delivery), with nothing else in the reader's process. A child process plays three bookies
(one binary-protocol server each, asyncio): entry ``n`` of the ledger becomes confirmed
``n`` ms after the ledger's first poll (1k entries/s), and a long poll for ``previous_lac
= p`` is answered as soon as entry ``p + 1`` is, with LAC ``p + 1`` and exactly that entry
piggybacked. So every poll carries one entry however late the reader is, and the work per
entry does not change with the machine's load (a real tail's answers carry more entries
when the reader falls behind, which makes its CPU per entry depend on the load).

The reader (a child of its own, this tree's code or the base's: ``ab_tail.export``) tails
``--entries`` entries and reports its process CPU per entry and the delay from an entry's
confirmation (its scheduled time, ``CLOCK_MONOTONIC``) to its delivery, p50/p99. Rounds
alternate base/head (head/base on odd rounds); medians over the rounds. Not a timed test:
2 shared cores; only ratios of one session compare.

Run: ``.venv/bin/python benchmarks/bench_tail_poll.py [--base main] [--rounds 4] [--entries 5000]
[--json OUT]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ab_tail import alternate, env_with, export, report

RATE_PER_S = 1000
STAMP = struct.Struct("<q")  # an entry's payload: its confirmation time (ns, CLOCK_MONOTONIC)
BOOKIES = ("bk0", "bk1", "bk2")


# --- the scripted bookies (child) -----------------------------------------------------------
async def serve_bookies() -> None:
    from scriba.entry import Crc32cDigest, pack_entry
    from scriba.proto import binary as wire

    digest = Crc32cDigest()
    loop = asyncio.get_running_loop()
    starts: dict[int, float] = {}  # ledger -> loop time of its first poll

    def answer(writer: asyncio.StreamWriter, rid: int, ledger_id: int, entry_id: int, due_ns: int) -> None:
        if writer.is_closing():
            return
        entry = pack_entry(digest, ledger_id, entry_id, entry_id - 1, 0, STAMP.pack(due_ns) + b"." * 92)
        writer.write(b"".join(bytes(p) for p in wire.encode_lac_answer(
            rid, 0, entry_id, entry_id, False, "", b"", [entry])))

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(wire.HEADER_SIZE + 2)  # HELLO
        writer.write(b"".join(bytes(p) for p in wire.encode_hello_ok(0, wire.VERSION)))
        frames = wire.FrameReader()
        while chunk := await _read(reader):
            for header, body in frames.feed(chunk):
                if header.type != wire.FrameType.READ_LAC:
                    continue
                ledger_id, _flags, previous, _timeout_ms, _max, _key = wire.decode_read_lac(body)
                start = starts.setdefault(ledger_id, loop.time())
                entry_id = previous + 1
                due = start + entry_id / RATE_PER_S
                due_ns = time.monotonic_ns() + int((due - loop.time()) * 1e9)
                loop.call_at(due, answer, writer, header.request_id, ledger_id, entry_id, due_ns)
        writer.close()

    servers = [await asyncio.start_server(serve, "127.0.0.1", 0) for _ in BOOKIES]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    print(json.dumps(ports), flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # until the parent is done


async def _read(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.read(65536)
    except ConnectionResetError:  # the reader aborts its links when it is done
        return b""


# --- the reader (child) ---------------------------------------------------------------------
async def tail_entries(ports: list[int], ledger_id: int, entries: int) -> dict[str, Any]:
    from scriba.client.binary_transport import BinaryTransport
    from scriba.client.reader import LedgerReader
    from scriba.client.transport import TransportConfig
    from scriba.entry import Crc32cDigest
    from scriba.ids import BookieId, EntryId, LedgerId
    from scriba.meta.records import LedgerMetadata

    address = {BookieId(b): f"127.0.0.1:{p}" for b, p in zip(BOOKIES, ports, strict=True)}
    transport = BinaryTransport(lambda _: "127.0.0.1:1", TransportConfig(), resolve_binary=address.__getitem__)
    md = LedgerMetadata(LedgerId(ledger_id), 3, 3, 2, ((EntryId(0), tuple(address)),))
    reader = LedgerReader(md, store=None, transport=transport, digest=Crc32cDigest(),  # type: ignore[arg-type]
                          master_key=b"", read_order=list)
    warm = min(200, entries // 5)
    delays_ms: list[float] = []
    cpu0 = 0.0
    try:
        async for entry in reader.tail(0):
            now = time.monotonic_ns()
            if entry.entry_id == warm:
                cpu0 = time.process_time()
            if entry.entry_id >= warm:
                delays_ms.append((now - STAMP.unpack_from(entry.payload)[0]) / 1e6)
            if entry.entry_id + 1 >= entries:
                break
        cpu_s = time.process_time() - cpu0
    finally:
        await transport.close()
    delays_ms.sort()
    n = len(delays_ms)
    return {"cpu_us_per_entry": round(cpu_s / n * 1e6, 1), "p50_ms": round(delays_ms[n // 2], 3),
            "p99_ms": round(delays_ms[min(n - 1, int(n * 0.99))], 3), "entries": n}


# --- the parent -----------------------------------------------------------------------------
def run_reader(pythonpath: str | None, ports: list[int], ledger_id: int, entries: int) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--child", "reader", "--ports", json.dumps(ports),
                           "--ledger", str(ledger_id), "--entries", str(entries)],
                          env=env_with(pythonpath), capture_output=True, text=True, timeout=entries / RATE_PER_S * 10 + 120)
    if done.returncode != 0:
        raise RuntimeError(f"reader failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--base", default="main", help="the git ref to compare against")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--entries", type=int, default=5000)
    p.add_argument("--json", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--ports", default="[]", help=argparse.SUPPRESS)
    p.add_argument("--ledger", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child == "bookies":
        asyncio.run(serve_bookies())
        return
    if args.child == "reader":
        print(json.dumps(asyncio.run(tail_entries(json.loads(args.ports), args.ledger, args.entries))), flush=True)
        return
    bookies = subprocess.Popen([sys.executable, __file__, "--child", "bookies"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert bookies.stdout is not None and bookies.stdin is not None
    try:
        ports = json.loads(bookies.stdout.readline())
        with tempfile.TemporaryDirectory(prefix="bench-tail-poll-") as tmp:
            variants = {"base": str(export(args.base, Path(tmp)) / "pkg"), "head": None}
            ledgers = iter(range(1, args.rounds * 2 + 1))
            rounds = alternate(args.rounds, lambda name: run_reader(variants[name], ports, next(ledgers), args.entries),
                               ("cpu_us_per_entry", "p50_ms", "p99_ms"))
    finally:
        bookies.stdin.close()
        bookies.wait(30)
        bookies.stdout.close()
    report(rounds, args.base, args.json)


if __name__ == "__main__":
    main(sys.argv[1:])
