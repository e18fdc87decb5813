"""``scriba-namenode serve --metadata URI --id nn1 --listen 127.0.0.1:9870`` and ``haadmin``.

``serve`` starts one namenode replica: the RSM replica (its replica service on
``--rsm-listen``, default the HTTP port + 1) and the WebHDFS server, and registers the
endpoint for ``haadmin``. Prints ``READY <url>`` once serving; exits 3 if the replica
stops on an error (e.g. an edit record it cannot replay). ``haadmin -getServiceState
nn1`` (and the other verbs of :mod:`~scriba.examples.namenode.ha`) reads and changes
the HA state.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys

from scriba.client import Client, ClientConfig
from scriba.examples.namenode import ha
from scriba.examples.namenode.server import NameNode, serve
from scriba.log import configure
from scriba.meta.startup import retry_start_step
from scriba.rsm import RsmConfig
from scriba.tls import as_client
from scriba.tls_cli import add_tls_arguments, tls_from_args


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scriba-namenode", description=__doc__.split("\n\n")[1])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run one namenode replica with its WebHDFS endpoint")
    s.add_argument("--metadata", required=True, help="metadata URI, e.g. etcd://127.0.0.1:2379/scriba")
    s.add_argument("--id", required=True, help="replica id (nn1, nn2, ...)")
    s.add_argument("--listen", required=True, help="HOST:PORT of the WebHDFS server")
    s.add_argument("--rsm-listen", help="HOST:PORT of the replica service (default: HTTP port + 1)")
    s.add_argument("--namespace", default="namenode", help="stream namespace of the edit log")
    s.add_argument("--session-timeout-s", type=float, default=10.0,
                   help="metadata session timeout: how long a dead active holds its election")
    s.add_argument("--zone", default="", help="this replica's zone (shown by haadmin; reads prefer it)")
    s.add_argument("--rsm-config", default="{}", help="RsmConfig fields as JSON")
    add_tls_arguments(s)  # one certificate for WebHDFS, the replica service and the bookies
    ha.add_parser(sub)
    return parser.parse_args(argv)


def split_hostport(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"--listen {value!r}: expected HOST:PORT")
    return host, int(port)


async def run(args: argparse.Namespace) -> int:
    configure(stream=sys.stderr)
    host, port = split_hostport(args.listen)
    rsm_address = args.rsm_listen or f"{host}:{port + 1}"
    fields = {"tls": tls_from_args(args), **json.loads(args.rsm_config)}
    if args.zone:
        fields.setdefault("zone", args.zone)
    config = RsmConfig(**fields).validate()
    return await serve_until_stopped(args, host, port, rsm_address, config)


async def serve_until_stopped(args: argparse.Namespace, host: str, port: int,
                              rsm_address: str, config: RsmConfig) -> int:
    client_config = ClientConfig(metadata_session_timeout_s=args.session_timeout_s, tls=as_client(config.tls))
    client = await retry_start_step(  # a store not answering yet is "not now" (meta/startup.py)
        "connect", lambda: Client.connect(args.metadata, config=client_config), owner=f"namenode {args.id}",
        timeout_s=config.start_timeout_s, log_event="rsm_start_retry", log_fields={"replica": args.id})
    async with client:
        nn = NameNode(client, replica_id=args.id, rsm_address=rsm_address, namespace=args.namespace, config=config)
        await nn.start()
        # registered before it serves: whoever sees it answer can also find it (haadmin)
        scheme = "https" if config.tls is not None else "http"
        registration = ha.Registration(args.id, f"{scheme}://{host}:{port}", args.zone, os.getpid())
        await ha.register(client, args.namespace, registration)
        keeper = asyncio.create_task(ha.keep_registered(client, args.namespace, registration))
        runner = await serve(nn, host, port, config.tls.load() if config.tls is not None else None)
        print(f"READY {nn.url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            while nn.rsm.error is None and not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), 0.2)
                except TimeoutError:
                    pass
        finally:
            keeper.cancel()
            await runner.cleanup()
            await nn.stop()
        if nn.rsm.error is not None:
            print(f"STOPPED {nn.rsm.error}", file=sys.stderr, flush=True)
            return 3
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.command == "haadmin":
        return asyncio.run(ha.haadmin(args))
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
