"""``scriba bench``: confirmed-append throughput and latency against a running cluster.

Creates ``--ledgers`` ledgers, keeps ``--inflight`` appends in flight over them
(spread evenly), and appends ``--size``-byte payloads until ``--entries`` are
confirmed or ``--seconds`` pass. Progress goes to stderr once a second; the result
(entries/s, MB/s, latency p50/p99/p99.9) to stdout, as JSON with ``--json``.

Appends use the writer's non-waiting path so that thousands can be in flight
without a coroutine per entry; the next append is issued from the previous one's
completion. ``--append-api callback`` (the default) uses ``append_callback`` (no
future: the writer calls back directly, BookKeeper's ``asyncAddEntry``);
``--append-api future`` uses ``append_async`` (a future per append and a done callback
on it, scheduled by the loop), which costs the client more CPU per append.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from time import perf_counter_ns
from typing import Any

from scriba import eventloop
from scriba.errors import ConfigError, ScribaError
from scriba.tls import TlsConfig
from scriba.tls_cli import add_tls_arguments, tls_from_args

PROGRESS_INTERVAL_S = 1.0
INFLIGHT_MAX = 100_000
SECONDS_MAX = 3600.0


@dataclass(frozen=True, slots=True)
class BenchConfig:
    metadata_uri: str
    ensemble_size: int = 3
    write_quorum_size: int = 3
    ack_quorum_size: int = 2
    entries: int | None = None
    seconds: float | None = 10.0
    size_bytes: int = 1024
    inflight: int = 1000
    ledgers: int = 1
    batch_entries_max: int = 512  # adds per gRPC message per bookie (the transport default)
    batches_inflight_max: int = 8  # unanswered batches per bookie before partial ones wait
    transport: str = "binary"  # the client's wire: "binary" (gRPC for bookies without it) or "grpc"
    tls: TlsConfig | None = None  # dial the bookies over TLS (its cost: benchmarks/bench_tls.py)
    append_api: str = "callback"  # "callback": append_callback; "future": append_async + a done callback

    def validate(self) -> BenchConfig:
        if not self.ensemble_size >= self.write_quorum_size >= self.ack_quorum_size >= 1:
            raise ConfigError("--ensemble >= --write >= --ack >= 1 is required")
        if self.entries is None and self.seconds is None:
            raise ConfigError("give --entries N or --seconds S")
        if self.entries is not None and self.entries < 1:
            raise ConfigError("--entries: must be >= 1")
        if self.seconds is not None and not 0 < self.seconds <= SECONDS_MAX:
            raise ConfigError(f"--seconds: must be in (0, {SECONDS_MAX:.0f}]")
        if not 1 <= self.inflight <= INFLIGHT_MAX:
            raise ConfigError(f"--inflight: must be in 1..{INFLIGHT_MAX}")
        if not 1 <= self.ledgers <= self.inflight:
            raise ConfigError("--ledgers: must be in 1..--inflight")
        if self.size_bytes < 0:
            raise ConfigError("--size: must be >= 0")
        if not 1 <= self.batch_entries_max <= 4096:
            raise ConfigError("--batch-entries: must be in 1..4096")
        if not 1 <= self.batches_inflight_max <= 1024:
            raise ConfigError("--batches-inflight: must be in 1..1024")
        if self.transport not in ("binary", "grpc"):
            raise ConfigError("--transport: 'binary' or 'grpc'")
        if self.append_api not in ("callback", "future"):
            raise ConfigError("--append-api: 'callback' or 'future'")
        return self


@dataclass(frozen=True, slots=True)
class BenchResult:
    entries: int
    failed: int
    seconds: float
    entries_per_s: float
    mb_per_s: float
    latency_ms_p50: float
    latency_ms_p99: float
    latency_ms_p999: float
    latency_ms_max: float
    size_bytes: int
    inflight: int
    ledgers: int
    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    first_error: str = ""
    adds_per_message: float = 0.0
    transport: str = "binary"
    client_cpu_us_per_entry: float = 0.0  # this process's CPU time (user + system) per confirmed entry
    append_api: str = "callback"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def to_text(self) -> str:
        return (
            f"{self.entries} entries in {self.seconds:.2f} s: {self.entries_per_s:,.0f} entries/s, "
            f"{self.mb_per_s:.1f} MB/s; latency ms p50 {self.latency_ms_p50:.2f} "
            f"p99 {self.latency_ms_p99:.2f} p99.9 {self.latency_ms_p999:.2f} max {self.latency_ms_max:.2f} "
            f"(E{self.ensemble_size}/W{self.write_quorum_size}/A{self.ack_quorum_size}, "
            f"{self.size_bytes} B, {self.inflight} in flight, {self.ledgers} ledger(s))"
            + (f"; {self.adds_per_message} adds/message" if self.adds_per_message else "")
            + f"; {self.transport}, {self.append_api} API, client CPU {self.client_cpu_us_per_entry:.1f} us/entry"
            + (f"; {self.failed} failed, first: {self.first_error}" if self.failed else "")
        )


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, math.ceil(fraction * len(sorted_values)) - 1))  # nearest rank
    return sorted_values[index]


def _submitter(writer: Any) -> Callable[[bytes], asyncio.Future[Any]]:
    """The writer's non-waiting append (a future per entry), else a task around ``append``."""
    for name in ("append_nowait", "append_future", "append_async", "submit"):
        fn = getattr(writer, name, None)
        if callable(fn):
            return fn  # type: ignore[no-any-return]
    loop = asyncio.get_running_loop()
    return lambda payload: loop.create_task(writer.append(payload))


class _Run:
    """Keeps ``inflight`` appends going from completion callbacks; records latencies.

    ``writers``' ``append_callback`` is used when ``cfg.append_api`` is "callback" and
    the writer has one: each slot's callback is made once and its start time kept in a
    list, so the harness allocates nothing per append; otherwise a future per append
    (``_submitter``) with a done callback."""

    def __init__(self, cfg: BenchConfig, writers: list[Any]) -> None:
        self.cfg = cfg
        self.callbacks = cfg.append_api == "callback" and all(hasattr(w, "append_callback") for w in writers)
        self.submits: list[Callable[..., Any]] = (
            [w.append_callback for w in writers] if self.callbacks else [_submitter(w) for w in writers]
        )
        self.started_ns = [0] * cfg.inflight  # per slot: when its append was issued
        self.slot_callbacks = [self._slot_callback(slot) for slot in range(cfg.inflight)] if self.callbacks else []
        self.payload = b"x" * cfg.size_bytes
        self.latencies_ns: list[int] = []
        self.issued = 0
        self.done = 0
        self.failed = 0
        self.first_error = ""
        self.stop_at = float("inf")
        self.finished = asyncio.get_running_loop().create_future()
        self.outstanding = 0
        self.issue_max = 0  # appends to issue in all (lowered when time is up or one fails)

    def start(self, seconds: float | None) -> None:
        """Issue the first appends; with ``seconds``, stop issuing after that long."""
        if seconds is not None:
            self.stop_at = time.monotonic() + seconds
            asyncio.get_running_loop().call_later(seconds, self._time_up)
        self.issue_max = self.cfg.entries if self.cfg.entries is not None else INFLIGHT_MAX**3
        for slot in range(min(self.cfg.inflight, self.cfg.entries or self.cfg.inflight)):
            self.issue(slot)

    def _time_up(self) -> None:
        self.issue_max = min(self.issue_max, self.issued)
        if self.outstanding == 0 and not self.finished.done():
            self.finished.set_result(None)

    def issue(self, slot: int) -> None:
        submit = self.submits[slot % len(self.submits)]
        self.issued += 1
        self.outstanding += 1
        self.started_ns[slot] = perf_counter_ns()
        try:
            if self.callbacks:
                submit(self.payload, self.slot_callbacks[slot])
            else:
                submit(self.payload).add_done_callback(lambda f: self._on_future(f, slot))
        except ScribaError as exc:  # refused at once (closed, failed): counted, and no more issued
            self._on_done(slot, exc)

    def _slot_callback(self, slot: int) -> Callable[[int, BaseException | None], None]:
        return lambda _entry_id, error: self._on_done(slot, error)

    def _on_future(self, fut: asyncio.Future[Any], slot: int) -> None:
        self._on_done(slot, asyncio.CancelledError() if fut.cancelled() else fut.exception())

    def _on_done(self, slot: int, error: BaseException | None) -> None:
        self.outstanding -= 1
        if error is None:
            self.latencies_ns.append(perf_counter_ns() - self.started_ns[slot])
            self.done += 1
        else:
            self.failed += 1
            self.issue_max = 0
            if not self.first_error:
                self.first_error = f"{type(error).__name__}: {error}"
        if self.issued < self.issue_max:
            self.issue(slot)
        elif self.outstanding == 0 and not self.finished.done():
            self.finished.set_result(None)


async def run_bench(cfg: BenchConfig, *, progress: bool = True, client: Any = None) -> BenchResult:
    cfg.validate()
    own_client = client is None
    transport: Any = None
    if client is None:
        from scriba.client import Client
        from scriba.client.binary_transport import new_transport
        from scriba.client.transport import TransportConfig

        holder: list[Any] = []

        class _Registry:  # the client's registry, once the client exists
            def address(self, bookie_id: Any) -> str:
                return str(holder[0].registry.address(bookie_id))

            def binary_address(self, bookie_id: Any) -> str:
                return str(holder[0].registry.binary_address(bookie_id))

        transport = new_transport(
            _Registry(),
            TransportConfig(
                batch_entries_max=cfg.batch_entries_max,
                batches_inflight_max=cfg.batches_inflight_max,
                protocol=cfg.transport,
                tls=cfg.tls,
            ),
        )
        client = await Client.connect(cfg.metadata_uri, transport=transport)
        holder.append(client)
    writers: list[Any] = []
    try:
        for _ in range(cfg.ledgers):
            writers.append(
                await client.create_ledger(
                    ensemble_size=cfg.ensemble_size,
                    write_quorum_size=cfg.write_quorum_size,
                    ack_quorum_size=cfg.ack_quorum_size,
                    password=b"scriba-bench",
                )
            )
        run = _Run(cfg, writers)
        reporter = asyncio.get_running_loop().create_task(_progress(run)) if progress else None
        cpu0 = time.process_time()
        t0 = time.monotonic()
        run.start(cfg.seconds)
        deadline_s = (cfg.seconds or SECONDS_MAX) + 60.0
        async with asyncio.timeout(deadline_s):
            await run.finished
        elapsed = time.monotonic() - t0
        cpu_s = time.process_time() - cpu0
        if reporter is not None:
            reporter.cancel()
        for w in writers:
            try:
                await w.close()
            except ScribaError as exc:
                if not run.first_error:
                    run.first_error = f"close: {type(exc).__name__}: {exc}"
    finally:
        if own_client:
            await client.close()
        if transport is not None:
            await transport.close()
    lat_ms = sorted(v / 1e6 for v in run.latencies_ns)
    return BenchResult(
        entries=run.done,
        failed=run.failed,
        seconds=round(elapsed, 3),
        entries_per_s=round(run.done / elapsed, 1) if elapsed > 0 else 0.0,
        mb_per_s=round(run.done * cfg.size_bytes / elapsed / 1e6, 2) if elapsed > 0 else 0.0,
        latency_ms_p50=round(percentile(lat_ms, 0.50), 3),
        latency_ms_p99=round(percentile(lat_ms, 0.99), 3),
        latency_ms_p999=round(percentile(lat_ms, 0.999), 3),
        latency_ms_max=round(lat_ms[-1], 3) if lat_ms else 0.0,
        size_bytes=cfg.size_bytes,
        inflight=cfg.inflight,
        ledgers=cfg.ledgers,
        ensemble_size=cfg.ensemble_size,
        write_quorum_size=cfg.write_quorum_size,
        ack_quorum_size=cfg.ack_quorum_size,
        first_error=run.first_error,
        adds_per_message=(
            round(transport.entries_sent / transport.batches_sent, 1)
            if transport is not None and transport.batches_sent
            else 0.0
        ),
        transport=cfg.transport,
        append_api="callback" if run.callbacks else "future",
        client_cpu_us_per_entry=round(cpu_s / run.done * 1e6, 1) if run.done else 0.0,
    )


async def _progress(run: _Run) -> None:
    last, t_last = 0, time.monotonic()
    while True:
        await asyncio.sleep(PROGRESS_INTERVAL_S)
        now = time.monotonic()
        rate = (run.done - last) / (now - t_last)
        last, t_last = run.done, now
        print(f"bench: {run.done} confirmed, {rate:,.0f}/s, {run.outstanding} in flight", file=sys.stderr, flush=True)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help="append throughput and latency")
    p.add_argument("--metadata", default=None, help="metadata URI (default $SCRIBA_METADATA or ./sandbox-data)")
    p.add_argument("--ensemble", type=int, default=3)
    p.add_argument("--write", type=int, default=3)
    p.add_argument("--ack", type=int, default=2)
    amount = p.add_mutually_exclusive_group()
    amount.add_argument("--entries", type=int, default=None)
    amount.add_argument("--seconds", type=float, default=None)
    p.add_argument("--size", type=int, default=1024, help="payload bytes (default 1024)")
    p.add_argument("--inflight", type=int, default=1000, help="appends in flight (default 1000)")
    p.add_argument("--ledgers", type=int, default=1)
    p.add_argument("--batch-entries", type=int, default=512, help="adds per message per bookie (default 512)")
    p.add_argument("--batches-inflight", type=int, default=8, help="unanswered messages per bookie (default 8)")
    p.add_argument("--transport", choices=["binary", "grpc"], default="binary",
                   help="binary data path (gRPC for bookies without one; default) or gRPC only")
    p.add_argument("--append-api", choices=["callback", "future"], default="callback",
                   help="append_callback (no future per append; default) or append_async with a done callback")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_tls_arguments(p, server=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scriba.shell import resolve_metadata

    cfg = BenchConfig(
        metadata_uri=resolve_metadata(args.metadata),
        ensemble_size=args.ensemble,
        write_quorum_size=args.write,
        ack_quorum_size=args.ack,
        entries=args.entries,
        seconds=args.seconds if args.seconds is not None else (None if args.entries else 10.0),
        size_bytes=args.size,
        inflight=args.inflight,
        ledgers=args.ledgers,
        batch_entries_max=args.batch_entries,
        batches_inflight_max=args.batches_inflight,
        transport=args.transport,
        append_api=args.append_api,
        tls=tls_from_args(args),
    ).validate()
    result = eventloop.run(run_bench(cfg, progress=not args.quiet))
    if args.json:
        print(json.dumps(result.to_json(), indent=2, sort_keys=True))
    else:
        print(result.to_text())
    return 0 if result.failed == 0 else 1
