"""``scriba geo replicate``: run replicators from a source cluster into a target cluster.

    scriba geo replicate --source etcd://us/scriba --target etcd://eu/scriba \\
        --stream prod/orders --stream prod/payments [--namespace prod] \\
        [--source-name us --target-name eu] [--local-only] [--http 127.0.0.1:9464]

One :class:`~scriba.geo.Replicator` per stream, in one process, until SIGTERM/SIGINT.
Cluster names are what marks carry (``geo.origin``/``geo.source``): they must stay the
same for the life of the data (default: the metadata URI). ``--http`` serves ``/metrics``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from typing import Any

from scriba.config import parse_host_port
from scriba.errors import ConfigError
from scriba.log import get_logger

log = get_logger(__name__)
METRICS_INTERVAL_S = 1.0
SESSION_TIMEOUT_S = 10.0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("geo", help="geo-replication between clusters")
    sub = p.add_subparsers(dest="geo_command", metavar="COMMAND", required=True)
    run = sub.add_parser("replicate", help="replicate streams from --source into --target (until stopped)")
    add_link_arguments(run)
    run.add_argument("--target", required=True, help="target cluster's metadata URI")
    run.add_argument("--stream", action="append", default=[], help="NS/STREAM (repeatable)")
    run.add_argument("--namespace", action="append", default=[], help="every stream of namespace NS")
    run.add_argument("--local-only", action="store_true",
                     help="ship only records written in the source (full mesh); default: all but the target's")
    run.add_argument("--http", default=None, help="HOST:PORT for /metrics")
    run.add_argument("--session-timeout-s", type=float, default=SESSION_TIMEOUT_S,
                     help="target metadata session: how soon a replicator that died lets another take over")
    run.set_defaults(func=cmd_replicate)


def add_link_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", required=True, help="source cluster's metadata URI")
    p.add_argument("--source-name", default=None, help="source cluster's name in marks (default: its URI)")
    p.add_argument("--target-name", default=None, help="target cluster's name in marks (default: its URI)")


def split_stream(text: str) -> tuple[str, str]:
    """``NS/STREAM`` (the namespace may hold '/') -> (namespace, stream)."""
    namespace, sep, stream = text.rpartition("/")
    if not sep or not namespace or not stream:
        raise ConfigError(f"stream must be given as NAMESPACE/STREAM, got {text!r}")
    return namespace, stream


def cmd_replicate(args: argparse.Namespace) -> int:
    if not args.stream and not args.namespace:
        raise ConfigError("nothing to replicate: give --stream NS/STREAM or --namespace NS")
    if args.source == args.target and (args.source_name or args.source) == (args.target_name or args.target):
        raise ConfigError(f"--source and --target are the same cluster ({args.source})")
    if not args.session_timeout_s > 0:
        raise ConfigError(f"--session-timeout-s must be > 0, got {args.session_timeout_s}")
    asyncio.run(_replicate(args))
    return 0


async def _replicate(args: argparse.Namespace) -> None:
    from scriba.client import Client
    from scriba.geo.metrics import GeoMetrics
    from scriba.geo.replicator import Cluster, Replicator, ReplicatorOptions
    from scriba.meta import connect
    from scriba.stream import open_namespace

    options = ReplicatorOptions(local_only=args.local_only).validate()
    metrics = GeoMetrics()
    if args.http:
        from prometheus_client import start_http_server

        host, port = parse_host_port(args.http)
        start_http_server(port, addr=host, registry=metrics.registry)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        source = await stack.enter_async_context(Client.connect(args.source))
        # the target writer lock lives as long as this session: a SIGKILLed replicator frees it
        # within --session-timeout-s (the client leaves closing a store passed in to us)
        target_store = await connect(args.target, session_timeout_s=args.session_timeout_s)
        stack.push_async_callback(target_store.close)
        target = await stack.enter_async_context(Client.connect(args.target, store=target_store))
        wanted = [split_stream(s) for s in args.stream]
        for ns_name in args.namespace:
            ns = await open_namespace(source, ns_name)
            wanted += [(ns_name, s) for s in await ns.list_streams()]
        replicators = []
        for ns_name, stream in dict.fromkeys(wanted):
            src = Cluster(args.source_name or args.source, await open_namespace(source, ns_name))
            dst = Cluster(args.target_name or args.target, await open_namespace(target, ns_name, create=True))
            await src.namespace.info(stream)  # an unknown source stream: a clear error now
            replicators.append(Replicator(dst, stream, [src], options))
        tasks = [asyncio.create_task(r.run(), name=f"geo-{r.stream}") for r in replicators]
        print(json.dumps({"geo_replicate": [f"{r.target.namespace.name}/{r.stream}" for r in replicators]}),
              flush=True)
        while not stop.is_set() and not any(t.done() for t in tasks):
            for r in replicators:
                metrics.update(r)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), METRICS_INTERVAL_S)
        for r in replicators:
            await r.stop()
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
