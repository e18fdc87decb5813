"""``scriba autorecovery run``: the auditor and a replication worker in one process.

    scriba autorecovery --metadata URI run [--password P ...] [--delay-s 60] [--http HOST:PORT]

``run`` campaigns for auditor (unless ``--no-auditor``) and runs one replication
worker (unless ``--no-worker``) until SIGTERM / SIGINT; its claims live in a metadata
session of ``--claim-ttl-s``. The operator verbs are ``scriba shell`` verbs
(``scriba.autorecovery.shell``). Workers run here, not inside bookies: a worker is a
ledger client, and ``bookie`` never imports ``client``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import uuid
from typing import TYPE_CHECKING, Any

from scriba.autorecovery.config import LOST_BOOKIE_RECOVERY_DELAY_S, AutorecoveryConfig
from scriba.errors import ConfigError
from scriba.ids import BookieId
from scriba.log import get_logger
from scriba.meta.startup import StartAbandoned, retry_start_step, start_unless_stopped
from scriba.metrics_http import serve_metrics
from scriba.tls_cli import add_tls_arguments, client_tls_from_args, tls_from_args

if TYPE_CHECKING:
    from scriba.client import Client

log = get_logger(__name__)
ENV_PASSWORDS = "SCRIBA_AUTORECOVERY_PASSWORDS"  # comma-separated, for processes a script starts


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--password", action="append", default=[],
                   help="a password to try for ledgers whose metadata does not keep theirs (repeat); "
                        "the empty one is always tried")
    p.add_argument("--entries-per-s", type=float, default=0.0, help="copy rate limit (0: none)")
    p.add_argument("--bytes-per-s", type=float, default=0.0, help="copy rate limit (0: none)")


def config_from(args: argparse.Namespace, **extra: Any) -> AutorecoveryConfig:
    import os

    passwords = [p.encode() for p in args.password]
    passwords += [p.encode() for p in os.environ.get(ENV_PASSWORDS, "").split(",") if p]
    return AutorecoveryConfig(
        passwords=tuple(passwords), entries_per_s=args.entries_per_s,
        bytes_per_s=args.bytes_per_s, **extra,
    ).validate()


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("autorecovery", help="run the auditor and re-replication workers")
    p.add_argument("--metadata", default=None, help="metadata URI (default $SCRIBA_METADATA or ./sandbox-data)")
    sub = p.add_subparsers(dest="autorecovery_command", metavar="COMMAND", required=True)
    run = sub.add_parser("run", help="run the auditor (elected) and a replication worker")
    add_config_arguments(run)
    run.add_argument("--id", default=None, help="this instance's name (default: random)")
    run.add_argument("--no-auditor", action="store_true")
    run.add_argument("--no-worker", action="store_true")
    run.add_argument("--delay-s", type=float, default=LOST_BOOKIE_RECOVERY_DELAY_S,
                     help="lost_bookie_recovery_delay_s (0: at once)")
    run.add_argument("--check-interval-s", type=float, default=600.0)
    run.add_argument("--open-ledger-grace-s", type=float, default=30.0)
    run.add_argument("--claim-ttl-s", type=float, default=10.0)
    run.add_argument("--start-timeout-s", type=float, default=30.0,
                     help="how long start-up retries an unreachable metadata store or a lost session")
    run.add_argument("--tick-s", type=float, default=1.0)
    run.add_argument("--http", default=None, help="HOST:PORT for /metrics (HTTPS with --tls-*)")
    # one certificate: the workers read and copy entries with it, /metrics is served with it
    add_tls_arguments(run, server=True, client=True)
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from scriba.shell import resolve_metadata

    uri = resolve_metadata(args.metadata)
    if args.no_auditor and args.no_worker:
        raise ConfigError("--no-auditor and --no-worker: nothing to run")
    config = config_from(
        args, lost_bookie_recovery_delay_s=args.delay_s, check_interval_s=args.check_interval_s,
        open_ledger_grace_s=args.open_ledger_grace_s, claim_ttl_s=args.claim_ttl_s,
        audit_tick_s=args.tick_s, start_timeout_s=args.start_timeout_s,
    )
    asyncio.run(_run(uri, config, args))
    return 0


async def _run(uri: str, config: AutorecoveryConfig, args: argparse.Namespace) -> None:
    from scriba.autorecovery.metrics import AutorecoveryMetrics

    name = args.id or f"autorecovery-{uuid.uuid4().hex[:8]}"
    metrics = AutorecoveryMetrics()
    async with contextlib.AsyncExitStack() as stack:
        url = await serve_metrics(stack, args.http, metrics.registry, tls_from_args(args))
        await _serve(uri, config, args, name, metrics, url)


async def _serve(uri: str, config: AutorecoveryConfig, args: argparse.Namespace, name: str,
                 metrics: Any, metrics_url: str | None) -> None:
    from scriba.autorecovery.auditor import Auditor
    from scriba.autorecovery.worker import ReplicationWorker

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        client = await start_unless_stopped(_connect(uri, config, args, name), stop)
    except StartAbandoned:
        log.info("autorecovery_start_abandoned", candidate=name)
        return
    async with client:
        tasks = []
        if not args.no_auditor:
            auditor = Auditor(client, config, candidate=name, metrics=metrics)
            tasks.append(asyncio.create_task(auditor.run(stop), name="auditor"))
        if not args.no_worker:
            worker = ReplicationWorker(client, config, worker_id=name, metrics=metrics)
            tasks.append(asyncio.create_task(worker.run(stop), name="worker"))
        log.info("autorecovery_started", candidate=name, auditor=not args.no_auditor,
                 worker=not args.no_worker, delay_s=config.lost_bookie_recovery_delay_s)
        print(json.dumps({"autorecovery": name, "metadata": uri, "metrics": metrics_url}), flush=True)
        await stop.wait()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 15)


async def _connect(uri: str, config: AutorecoveryConfig, args: argparse.Namespace, name: str) -> Client:
    """The client (and its metadata session, of ``claim_ttl_s``), retried within
    ``start_timeout_s``: a store not answering yet, a session lost while a loaded
    machine starved the start (``meta/startup.py``)."""
    from scriba.client import Client, ClientConfig

    client_config = ClientConfig(tls=client_tls_from_args(args), metadata_session_timeout_s=config.claim_ttl_s)
    return await retry_start_step("connect", lambda: Client.connect(uri, config=client_config),
                                  owner=f"autorecovery {name}", timeout_s=config.start_timeout_s,
                                  log_event="autorecovery_start_retry", log_fields={"candidate": name})


def print_progress(bookie: BookieId) -> Any:
    def progress(left: int, total: int) -> None:
        done = total - left
        print(f"{bookie}: {done}/{total} ledgers moved off, {left} left", file=sys.stderr, flush=True)

    return progress
