"""``scriba console``: serve the web console until SIGTERM/SIGINT.

    scriba console --metadata etcd://127.0.0.1:2379/scriba --listen 127.0.0.1:8080

The console starts even if the store is not reachable yet (the pages say so and it
keeps trying); it prints one line ``console: http://HOST:PORT/`` once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from scriba.aiohttp_tls import identity_middleware, site_ssl
from scriba.config import parse_host_port
from scriba.console.mirror import Mirror
from scriba.console.probe import Prober
from scriba.console.server import make_app
from scriba.console.views import Model
from scriba.errors import ConfigError
from scriba.log import get_logger
from scriba.meta.connect import connect
from scriba.tls import Role, TlsConfig, as_client
from scriba.tls_cli import add_tls_arguments, tls_from_args

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    metadata_uri: str
    listen: str = "127.0.0.1:8080"
    probe_interval_s: float = 1.0
    window_samples: int = 300  # a bookie's chart window: 5 minutes at one probe a second
    # HTTPS (mutual TLS: admin certificates only); the same certificate probes TLS bookies
    tls: TlsConfig | None = None

    def validate(self) -> ConsoleConfig:
        if not self.metadata_uri:
            raise ConfigError("console: --metadata URI is required")
        parse_host_port(self.listen)
        if not 0.1 <= self.probe_interval_s <= 60:
            raise ConfigError(f"console: probe interval {self.probe_interval_s} s: expected 0.1..60")
        if not 2 <= self.window_samples <= 100_000:
            raise ConfigError(f"console: window {self.window_samples} samples: expected 2..100000")
        if self.tls is not None:
            self.tls.validate()
        return self


class Console:
    """The mirror, the prober and the web server of one console, started and stopped together."""

    def __init__(self, config: ConsoleConfig) -> None:
        self.config = config.validate()
        self._tls = config.tls.load() if config.tls is not None else None  # bad files: ConfigError now
        self.mirror = Mirror(config.metadata_uri, connect)
        self.model = Model(self.mirror)
        self.prober = Prober(self.model.probe_targets, interval_s=config.probe_interval_s,
                             window=config.window_samples, tls=as_client(config.tls))
        self.model.prober = self.prober
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        self.mirror.start()
        self.prober.start()
        app = make_app(self.model)
        if self._tls is not None and self._tls.config.require_client_cert:
            app.middlewares.append(identity_middleware(self._tls, (Role.ADMIN,)))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        host, port = parse_host_port(self.config.listen)
        site = web.TCPSite(self._runner, host, port, ssl_context=site_ssl(self._tls))
        await site.start()
        bound = self._runner.addresses[0]
        self.url = f"{'https' if self._tls else 'http'}://{bound[0]}:{bound[1]}/"
        log.info("console_listening", url=self.url, metadata=self.config.metadata_uri)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self.prober.stop()
        await self.mirror.stop()


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("console", help="the web console (cluster map, ledgers, streams, RSM groups)")
    p.add_argument("--metadata", required=True, help="metadata store URI, e.g. etcd://127.0.0.1:2379/scriba")
    p.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT to serve on (port 0: any free one)")
    p.add_argument("--probe-interval", type=float, default=1.0, help="seconds between bookie probes")
    p.add_argument("--window", type=int, default=300, help="samples kept per bookie for charts")
    add_tls_arguments(p)
    p.set_defaults(func=cmd_console)


def cmd_console(args: argparse.Namespace) -> int:
    config = ConsoleConfig(args.metadata, args.listen, args.probe_interval, args.window,
                           tls_from_args(args)).validate()
    asyncio.run(_serve(config))
    return 0


async def _serve(config: ConsoleConfig) -> None:
    console = Console(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    url = await console.start()
    print(f"console: {url}", flush=True)
    try:
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await console.stop()
