"""The command line: ``python -m scriba.examples.kvstore serve ...`` (also ``scriba-kv``).

    scriba-kv serve --metadata etcd://127.0.0.1:2379/scriba --replica-id r1 \\
        --listen 127.0.0.1:23790 [--peer 127.0.0.1:23800] [--namespace kv --name store]

    scriba-kv follow --metadata etcd://127.0.0.1:2479/scriba --replica-id f1 \\
        --listen 127.0.0.1:23890 [--origin a] [--max-staleness-s 30]

``serve`` starts one RSM replica of the store (its replica service on ``--peer``, by default
the listen port + 10) and serves etcd's API on ``--listen``. Prints ``READY`` on
stdout once serving; SIGTERM / SIGINT stop it cleanly. ``follow`` starts a read-only
follower of the store's geo-replicated command stream in another cluster (``follower``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys

from scriba.client import Client, ClientConfig
from scriba.examples.kvstore.follower import add_follow_arguments, follow
from scriba.examples.kvstore.machine import KvMachine
from scriba.examples.kvstore.server import KvServer
from scriba.log import configure
from scriba.meta.startup import retry_start_step
from scriba.rsm import ReplicatedStateMachine, RsmConfig
from scriba.tls import as_client
from scriba.tls_cli import add_tls_arguments, tls_from_args


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scriba-kv", description="an HA key-value store speaking etcd's v3 API")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run one replica")
    add_store_arguments(serve, "metadata URI (etcd://, zk://, memory://)")
    serve.add_argument("--peer", help="host:port of the RSM replica service (default: listen port + 10)")
    serve.add_argument("--zone", default="")
    serve.add_argument("--session-timeout-s", type=float, default=2.0)
    serve.add_argument("--watch-progress-notify-s", type=float, default=600.0,
                       help="idle time after which a progress_notify watch gets an empty response (etcd: 10 min)")
    add_tls_arguments(serve)  # one certificate for etcd clients, peer replicas and the bookies
    follow = sub.add_parser("follow", help="run a read-only follower of a geo-replicated copy")
    add_store_arguments(follow, "metadata URI of the cluster holding the copy")
    add_follow_arguments(follow)
    return parser.parse_args(argv)


def add_store_arguments(command: argparse.ArgumentParser, metadata_help: str) -> None:
    """What every process of the store is told: where, who, which group."""
    command.add_argument("--metadata", required=True, help=metadata_help)
    command.add_argument("--replica-id", required=True)
    command.add_argument("--listen", required=True, help="host:port for etcd clients")
    command.add_argument("--namespace", default="kv")
    command.add_argument("--name", default="store")
    command.add_argument("--rsm-config", default="{}", help="RsmConfig fields as JSON (session_ttl_ms and "
                                                            "session_results_max must be the same in every process)")


async def serve(args: argparse.Namespace) -> int:
    configure(stream=sys.stderr)
    host, _, port = args.listen.rpartition(":")
    peer = args.peer or f"{host}:{int(port) + 10}"
    tls = tls_from_args(args)
    loaded = tls.load() if tls is not None else None  # a bad file: a clear error before anything starts
    config = RsmConfig(**{"zone": args.zone, "tls": tls, **json.loads(args.rsm_config)}).validate()
    client_config = ClientConfig(add_timeout_s=5.0, bookie_wait_s=20.0,
                                 metadata_session_timeout_s=args.session_timeout_s, tls=as_client(tls))
    client = await retry_start_step(  # a store not answering yet is "not now" (meta/startup.py)
        "connect", lambda: Client.connect(args.metadata, config=client_config), owner=f"kv replica {args.replica_id}",
        timeout_s=config.start_timeout_s, log_event="rsm_start_retry", log_fields={"replica": args.replica_id})
    machine = KvMachine()
    rsm = ReplicatedStateMachine(client, namespace=args.namespace, name=args.name, state_machine=machine,
                                 replica_id=args.replica_id, address=peer, config=config)
    await rsm.start()
    server = KvServer(rsm, machine, args.listen, loaded, watch_progress_notify_s=args.watch_progress_notify_s)
    await server.start()
    print("READY", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set() and rsm.error is None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)
    await server.stop()
    await rsm.stop()
    await client.close()
    if rsm.error is not None and not stop.is_set():
        print(f"STOPPED {rsm.error}", file=sys.stderr, flush=True)
        return 3
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return asyncio.run(follow(args) if args.command == "follow" else serve(args))


if __name__ == "__main__":
    sys.exit(main())
