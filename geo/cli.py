"""``scriba geo replicate``: run replicators from a source cluster into a target cluster.

    scriba geo replicate --source etcd://us/scriba --target etcd://eu/scriba \\
        --stream prod/orders --stream prod/payments [--namespace prod] \\
        [--source-name us --target-name eu] [--local-only] [--http 127.0.0.1:9464]

One :class:`~scriba.geo.Replicator` per stream, in one process, until SIGTERM/SIGINT.

    scriba geo translate --source URI --target URI --stream NS/STREAM [POSITION ...] [--cursors]
    scriba geo failover-drill --source URI --target URI --stream NS/STREAM

``translate`` prints where source positions are in the target (``geo.translate``) and with
``--cursors`` moves the source stream's named cursors to the target; ``failover-drill``
stops the source stream, promotes the target and prints the measured data-loss window
and time to writable (``geo.drill``). Both print JSON.
Cluster names are what marks carry (``geo.origin``/``geo.source``): they must stay the
same for the life of the data (default: the metadata URI). ``--http`` serves ``/metrics``.

TLS: ``--tls-cert/--tls-key/--tls-ca`` (``scriba.tls_cli``) are the certificate every
command dials both clusters' bookies with (the CA bundle must verify both), and for
``replicate`` also what ``/metrics`` is served with (HTTPS; ``--tls-require-client-cert``
and ``--tls-allow admin=...`` admit scrapers as everywhere else).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from typing import Any

from scriba.errors import ConfigError
from scriba.log import get_logger
from scriba.metrics_http import serve_metrics
from scriba.tls_cli import add_tls_arguments, client_tls_from_args, tls_from_args

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
    run.add_argument("--http", default=None, help="HOST:PORT for /metrics (HTTPS with --tls-*)")
    add_tls_arguments(run, server=True, client=True)
    run.add_argument("--session-timeout-s", type=float, default=SESSION_TIMEOUT_S,
                     help="target metadata session: how soon a replicator that died lets another take over")
    run.set_defaults(func=cmd_replicate)
    tr = sub.add_parser("translate", help="where source positions (or the source's cursors) are in the target")
    add_link_arguments(tr)
    tr.add_argument("--target", required=True, help="target cluster's metadata URI")
    tr.add_argument("--stream", required=True, help="NS/STREAM")
    tr.add_argument("positions", nargs="*", help="source positions SEG:ENTRY:SLOT")
    tr.add_argument("--cursors", action="store_true",
                    help="translate the source stream's named cursors and commit them on the target")
    add_tls_arguments(tr, server=False)
    tr.set_defaults(func=cmd_translate)
    drill = sub.add_parser("failover-drill",
                           help="stop the source stream, promote the target, report the data-loss window")
    add_link_arguments(drill)
    drill.add_argument("--target", required=True, help="target cluster's metadata URI")
    drill.add_argument("--stream", required=True, help="NS/STREAM")
    drill.add_argument("--lock-timeout-s", type=float, default=30.0,
                       help="how long to wait for the source's writer and the replicator to be gone")
    add_tls_arguments(drill, server=False)
    drill.set_defaults(func=cmd_failover_drill)


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
    _check_pair(args)
    if not args.session_timeout_s > 0:
        raise ConfigError(f"--session-timeout-s must be > 0, got {args.session_timeout_s}")
    asyncio.run(_replicate(args))
    return 0


async def _replicate(args: argparse.Namespace) -> None:
    from scriba.client import Client, ClientConfig
    from scriba.geo.metrics import GeoMetrics
    from scriba.geo.replicator import Cluster, Replicator, ReplicatorOptions
    from scriba.meta import connect
    from scriba.stream import open_namespace

    options = ReplicatorOptions(local_only=args.local_only).validate()
    metrics = GeoMetrics()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    client_config = ClientConfig(tls=client_tls_from_args(args))
    async with contextlib.AsyncExitStack() as stack:
        metrics_url = await serve_metrics(stack, args.http, metrics.registry, tls_from_args(args))
        source = await stack.enter_async_context(Client.connect(args.source, config=client_config))
        # the target writer lock lives as long as this session: a SIGKILLed replicator frees it
        # within --session-timeout-s (the client leaves closing a store passed in to us)
        target_store = await connect(args.target, session_timeout_s=args.session_timeout_s)
        stack.push_async_callback(target_store.close)
        target = await stack.enter_async_context(
            Client.connect(args.target, store=target_store, config=client_config))
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
        print(json.dumps({"geo_replicate": [f"{r.target.namespace.name}/{r.stream}" for r in replicators],
                          "metrics": metrics_url}), flush=True)
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


def _check_pair(args: argparse.Namespace) -> None:
    if args.source == args.target and (args.source_name or args.source) == (args.target_name or args.target):
        raise ConfigError(f"--source and --target are the same cluster ({args.source})")


def cmd_translate(args: argparse.Namespace) -> int:
    _check_pair(args)
    if not args.positions and not args.cursors:
        raise ConfigError("nothing to translate: give source positions or --cursors")
    print(json.dumps(asyncio.run(_translate(args)), indent=2))
    return 0


async def _translate(args: argparse.Namespace) -> dict[str, Any]:
    from scriba.client import Client, ClientConfig
    from scriba.geo.translate import translate, translate_cursors
    from scriba.stream import Position, open_namespace

    ns_name, stream = split_stream(args.stream)
    positions = [Position.parse(p) for p in args.positions]
    source_name = args.source_name or args.source
    out: dict[str, Any] = {"stream": args.stream, "source": source_name}
    config = ClientConfig(tls=tls_from_args(args))
    async with Client.connect(args.source, config=config) as source, \
            Client.connect(args.target, config=config) as target:
        target_ns = await open_namespace(target, ns_name)
        if positions:
            found = await translate(target_ns, stream, source_name, positions)
            out["positions"] = [found[p].to_json() for p in positions]
        if args.cursors:
            moved = await translate_cursors(await open_namespace(source, ns_name), target_ns, stream, source_name)
            out["cursors"] = {name: t.to_json() for name, t in sorted(moved.items())}
    return out


def cmd_failover_drill(args: argparse.Namespace) -> int:
    _check_pair(args)
    if not args.lock_timeout_s > 0:
        raise ConfigError(f"--lock-timeout-s must be > 0, got {args.lock_timeout_s}")
    print(json.dumps(asyncio.run(_drill(args)), indent=2))
    return 0


async def _drill(args: argparse.Namespace) -> dict[str, Any]:
    from scriba.client import Client, ClientConfig
    from scriba.geo.drill import failover_drill
    from scriba.stream import WriterOptions, open_namespace

    ns_name, stream = split_stream(args.stream)
    config = ClientConfig(tls=tls_from_args(args))
    async with Client.connect(args.source, config=config) as source, \
            Client.connect(args.target, config=config) as target:
        report = await failover_drill(
            await open_namespace(source, ns_name), await open_namespace(target, ns_name), stream,
            args.source_name or args.source, options=WriterOptions(lock_timeout_s=args.lock_timeout_s),
        )
    return {"stream": args.stream, **report.to_json()}
