"""Probe (not a benchmark): the CPU a TLS transport adds to moving bytes, one process.

A sender and a receiver in this process, on one event loop, over loopback TCP, move
``--mib`` MiB one way in 64 KiB writes (as ``scriba.frame_write`` joins the data path's
frames over TLS) into a ``BufferedProtocol`` (as the data path's connections are), with
the sender following ``pause_writing`` / ``resume_writing``. Three ways, alternating
round by round: plaintext asyncio, asyncio's TLS (``sslproto``, memory BIOs) and
``scriba.tls_socket`` (a non-blocking ``SSLSocket``). Prints the process CPU per MiB of
each (median of the rounds) and, for each TLS way, what it adds to plaintext; the ratio
of the two additions is what ``scriba.tls_socket`` saves. Then the same for round trips
of small messages (``--round-trips``: a 1 KiB request answered by 40 bytes, one in
flight, as an add and its acknowledgement at one add in flight): CPU per round trip.
One process on one core: the figures are CPU, not wall time, so a busy machine moves
them less than a rate.

Run: ``.venv/bin/python benchmarks/probe_tls_transport.py [--mib 128] [--round-trips 20000] [--rounds 5] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scriba import tls_server, tls_socket
from scriba.testing.pki import TestPki

CHUNK_BYTES = 64 * 1024


class _Sink(asyncio.BufferedProtocol):
    def __init__(self, total: int, done: asyncio.Future[None]) -> None:
        self.buf = bytearray(256 * 1024)
        self.total, self.done, self.got = total, done, 0

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        self.got += nbytes
        if self.got >= self.total and not self.done.done():
            self.done.set_result(None)


class _Source(asyncio.Protocol):
    def __init__(self) -> None:
        self.writable = asyncio.Event()
        self.writable.set()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()


async def _move(way: str, total: int, pki: TestPki) -> float:
    """Seconds of process CPU to move ``total`` bytes ``way``."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    sink = _Sink(total, done)
    server, transport, source = await _connect(way, pki, lambda: sink, _Source)
    payload = os.urandom(CHUNK_BYTES)
    start = time.process_time()
    sent = 0
    while sent < total:
        await source.writable.wait()
        transport.write(payload)
        sent += CHUNK_BYTES
    await done
    cpu = time.process_time() - start
    transport.abort()
    server.close()
    await server.wait_closed()
    return cpu


class _Echo(asyncio.BufferedProtocol):
    """Answers every read with 40 bytes."""

    def __init__(self) -> None:
        self.buf = bytearray(256 * 1024)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        assert self.transport is not None
        self.transport.write(ANSWER)


class _Asker(asyncio.BufferedProtocol):
    def __init__(self) -> None:
        self.buf = bytearray(256 * 1024)
        self.answered: asyncio.Future[None] | None = None

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        if self.answered is not None and not self.answered.done():
            self.answered.set_result(None)


ANSWER = b"a" * 40
REQUEST = b"r" * 1024


async def _connect(way: str, pki: TestPki, server_factory: Callable[[], asyncio.BaseProtocol],
                   client_factory: Callable[[], Any]) -> tuple[Any, Any, Any]:
    """(server, client transport, client protocol) over ``way``."""
    loop = asyncio.get_running_loop()
    server_ctx = pki.server_tls().load().server_ssl_context()
    client_ctx = pki.client_tls(pki.client).load().client_ssl_context()
    server: Any
    if way == "tls_socket":
        server = await tls_server.start_server(server_factory, "127.0.0.1", 0, ssl_context=server_ctx)
    else:
        server = await loop.create_server(server_factory, "127.0.0.1", 0,
                                          ssl=server_ctx if way == "sslproto" else None)
    port = server.sockets[0].getsockname()[1]
    transport: Any
    proto: Any
    if way == "tls_socket":
        transport, proto = await tls_socket.open_connection(client_factory, "127.0.0.1", port,
                                                            ssl_context=client_ctx, server_hostname="localhost")
    elif way == "sslproto":
        transport, proto = await loop.create_connection(client_factory, "127.0.0.1", port, ssl=client_ctx,
                                                        server_hostname="localhost")
    else:
        transport, proto = await loop.create_connection(client_factory, "127.0.0.1", port)
    return server, transport, proto


async def _round_trips(way: str, count: int, pki: TestPki) -> float:
    """Microseconds of process CPU per round trip ``way``."""
    loop = asyncio.get_running_loop()
    server, transport, asker = await _connect(way, pki, _Echo, _Asker)
    start = time.process_time()
    for _ in range(count):
        asker.answered = loop.create_future()
        transport.write(REQUEST)
        await asker.answered
    cpu = time.process_time() - start
    transport.abort()
    server.close()
    await server.wait_closed()
    return cpu / count * 1e6


def _compare(per_way: dict[str, list[float]], digits: int) -> dict[str, Any]:
    med = {w: statistics.median(v) for w, v in per_way.items()}
    added = {w: med[w] - med["plain"] for w in ("sslproto", "tls_socket")}
    return {
        "cpu": {w: {"median": round(med[w], digits), "each": [round(x, digits) for x in v]}
                for w, v in per_way.items()},
        "tls_adds": {w: round(a, digits) for w, a in added.items()},
        "tls_socket_over_sslproto_added": round(added["tls_socket"] / added["sslproto"], 3) if added["sslproto"] else None,
    }


async def _rounds(mib: int, round_trips: int, rounds: int) -> dict[str, Any]:
    pki = TestPki.create(Path(tempfile.mkdtemp(prefix="probe-tls-")))
    ways = ["plain", "sslproto", "tls_socket"]
    per_mib: dict[str, list[float]] = {w: [] for w in ways}
    per_trip: dict[str, list[float]] = {w: [] for w in ways}
    total = mib * 1024 * 1024
    for r in range(rounds):
        order = ways if r % 2 == 0 else list(reversed(ways))
        for way in order:
            per_mib[way].append(await _move(way, total, pki) / mib * 1e3)
            per_trip[way].append(await _round_trips(way, round_trips, pki))
    return {"mib": mib, "round_trips": round_trips, "rounds": rounds,
            "bulk_cpu_ms_per_mib": _compare(per_mib, 3), "round_trip_cpu_us": _compare(per_trip, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=128)
    p.add_argument("--round-trips", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    out = asyncio.run(_rounds(args.mib, args.round_trips, args.rounds))
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
