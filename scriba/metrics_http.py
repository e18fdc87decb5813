"""``GET /metrics`` of a command-line process (geo replicators, autorecovery), TLS-capable.

Theory of operation. A process that runs next to a cluster rather than inside a bookie
serves its Prometheus registry on ``--http HOST:PORT`` from its own event loop (an
aiohttp site; no extra thread). With a :class:`~scriba.tls.TlsConfig` the site is HTTPS
only, and with mutual TLS only certificates on the admin allow-list are answered (403
otherwise, :func:`scriba.aiohttp_tls.identity_middleware`), as every other Scriba HTTP
endpoint. The config is loaded before binding, so a TLS config that does not load stops
the process before it listens (ConfigError naming the file); there is no plaintext
fallback.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from scriba.aiohttp_tls import identity_middleware, site_ssl
from scriba.config import parse_host_port
from scriba.log import get_logger
from scriba.tls import Role, TlsConfig

log = get_logger(__name__)
REQUEST_BYTES_MAX = 8192  # a scrape is a bodiless GET


class MetricsServer:
    """Serves ``registry`` on ``/metrics`` at ``listen`` (port 0: any free one; see :attr:`url`)."""

    def __init__(self, listen: str, registry: CollectorRegistry, tls: TlsConfig | None = None) -> None:
        self._host, self._port = parse_host_port(listen)
        self._registry = registry
        self._tls = tls.load() if tls is not None else None  # a bad file: ConfigError now
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application(client_max_size=REQUEST_BYTES_MAX)
        if self._tls is not None and self._tls.config.require_client_cert:
            app.middlewares.append(identity_middleware(self._tls, (Role.ADMIN,)))
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._runner = runner
        await web.TCPSite(runner, self._host, self._port, ssl_context=site_ssl(self._tls)).start()
        host, port = runner.addresses[0][:2]
        self.url = f"{'https' if self._tls else 'http'}://{host}:{port}/metrics"
        log.info("metrics_listening", url=self.url)
        return self.url

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self._registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def serve_metrics(stack: AsyncExitStack, listen: str | None, registry: CollectorRegistry,
                        tls: TlsConfig | None) -> str | None:
    """A :class:`MetricsServer` on ``listen`` (None: no server, None returned) that
    ``stack`` stops; its URL."""
    if listen is None:
        return None
    server = MetricsServer(listen, registry, tls)
    url = await server.start()
    stack.push_async_callback(server.stop)
    return url
