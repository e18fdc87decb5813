"""``scriba faults-proxy``: the Toxiproxy-API-compatible fault proxy in the foreground.

Serves until Ctrl-C or SIGTERM, then closes every listener and connection.
Prints ``listening on http://HOST:PORT`` once serving (with ``--listen ...:0``
that line carries the port picked).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from typing import Any

from scriba.config import parse_host_port
from scriba.log import configure
from scriba.testing.faults import CONNECTIONS_PER_PROXY_MAX, FaultProxyConfig, ToxiproxyServer


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "faults-proxy",
        help="run the Toxiproxy-API-compatible fault proxy (foreground)",
        description="A TCP fault proxy driven through the Toxiproxy HTTP API (toxiproxy-python works).",
    )
    _add_arguments(parser)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default="127.0.0.1:8474", help="API address (HOST:PORT, default %(default)s)")
    parser.add_argument(
        "--connections-per-proxy-max", type=int, default=CONNECTIONS_PER_PROXY_MAX,
        help="connections each proxy accepts at once (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed for toxicity rolls, jitter and slicing")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    host, port = parse_host_port(args.listen, default_port=8474)
    config = FaultProxyConfig(connections_per_proxy_max=args.connections_per_proxy_max, seed=args.seed)
    server = ToxiproxyServer(host, port, config)
    asyncio.run(_serve(server))
    return 0


async def _serve(server: ToxiproxyServer) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.request_stop)

    def ready(url: str) -> None:
        print(f"listening on {url}", flush=True)

    try:
        await server.serve(on_ready=ready)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    print("stopped", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m scriba.testing.faults_cli``: the same command without the rest of the CLI."""
    parser = argparse.ArgumentParser(prog="scriba-faults-proxy")
    _add_arguments(parser)
    parser.add_argument("--log-json", action="store_true", help="log as JSON lines")
    args = parser.parse_args(argv)
    configure(json=args.log_json)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
