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
from scriba.console.actions import Actions, Authorize, admin_certificates, any_caller
from scriba.console.geo_lag import GeoScraper, LagWindow
from scriba.console.mirror import Mirror
from scriba.console.probe import Prober
from scriba.console.rsm_probe import RsmProber
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
    allow_actions: bool = False  # decommission, audit, leadership transfer (console.actions)
    geo_metrics: tuple[str, ...] = ()  # HOST:PORT of replicators' /metrics (scriba geo replicate --http)
    geo_window_s: float = 600.0  # the geo lag charts' window

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
        for address in self.geo_metrics:
            parse_host_port(address)
        if not 10 <= self.geo_window_s <= 86_400:
            raise ConfigError(f"console: geo window {self.geo_window_s} s: expected 10..86400")
        return self


class Console:
    """The mirror, the prober and the web server of one console, started and stopped together."""

    def __init__(self, config: ConsoleConfig, *, authorize: Authorize | None = None) -> None:
        """``authorize``: who may act when actions are allowed; by default the admin identity of the
        caller's certificate under mutual TLS (:func:`~scriba.console.actions.admin_certificates`),
        else anyone who reaches the console (:func:`~scriba.console.actions.any_caller`)."""
        self.config = config.validate()
        self._tls = config.tls.load() if config.tls is not None else None  # bad files: ConfigError now
        if authorize is None:
            mutual = self._tls is not None and self._tls.config.require_client_cert
            authorize = admin_certificates(self._tls) if mutual and self._tls is not None else any_caller
        self.mirror = Mirror(config.metadata_uri, connect)
        self.model = Model(self.mirror)
        client_tls = as_client(config.tls)  # the console's certificate, to probe bookies and replicas
        self.prober = Prober(self.model.probe_targets, interval_s=config.probe_interval_s,
                             window=config.window_samples, tls=client_tls)
        self.model.prober = self.prober
        self.rsm_prober = RsmProber(self.model.rsm_targets, interval_s=config.probe_interval_s,
                                    tls=client_tls.load() if client_tls is not None else None)
        self.model.rsm_prober = self.rsm_prober
        samples_max = max(2, int(config.geo_window_s / config.probe_interval_s) + 1)
        self.geo = GeoScraper(config.geo_metrics, LagWindow(config.geo_window_s, samples_max),
                              interval_s=config.probe_interval_s)
        self.model.geo = self.geo
        self.actions = (Actions(config.metadata_uri, connect, self.model, authorize=authorize, rsm_tls=client_tls)
                        if config.allow_actions else None)
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        self.mirror.start()
        self.prober.start()
        self.rsm_prober.start()
        self.geo.start()
        app = make_app(self.model, self.actions)
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
        await self.rsm_prober.stop()
        await self.geo.stop()
        await self.mirror.stop()


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("console", help="the web console (cluster map, ledgers, streams, RSM groups)")
    p.add_argument("--metadata", required=True, help="metadata store URI, e.g. etcd://127.0.0.1:2379/scriba")
    p.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT to serve on (port 0: any free one)")
    p.add_argument("--probe-interval", type=float, default=1.0, help="seconds between bookie probes")
    p.add_argument("--window", type=int, default=300, help="samples kept per bookie for charts")
    p.add_argument("--geo-metrics", action="append", default=[], metavar="HOST:PORT",
                   help="a geo replicator's /metrics (scriba geo replicate --http), repeatable: lag charts")
    p.add_argument("--geo-window", type=float, default=600.0, help="seconds of geo lag the charts keep")
    p.add_argument("--allow-actions", action="store_true",
                   help="allow decommission, audit and leadership transfer from the console (each confirmed; "
                        "with --tls-* client certificates, only by admin identities)")
    add_tls_arguments(p)
    p.set_defaults(func=cmd_console)


def cmd_console(args: argparse.Namespace) -> int:
    config = ConsoleConfig(args.metadata, args.listen, args.probe_interval, args.window,
                           tls_from_args(args), allow_actions=args.allow_actions,
                           geo_metrics=tuple(args.geo_metrics), geo_window_s=args.geo_window).validate()
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
