"""The fault proxy as a process, and inter-region latency for a sandbox through it.

``ToxiproxyProcess`` runs the Toxiproxy-compatible proxy (``scriba faults-proxy``,
``scriba.testing.faults``) or a real ``toxiproxy-server`` as its own process; it lives
here, beside the other launchers, so the sandbox can start one without importing the
test kit (``scriba.testing.faults`` re-exports it).

Inter-region latency:

``scriba sandbox --regions R --inter-region-latency-ms MS``: clients are taken to run
in the first region (``region-1``). Every bookie of another region listens on
``127.0.0.1:PORT`` as usual but *advertises* ``REMOTE_HOST:PORT`` (another loopback
address, so the same port is free there); a proxy of the Toxiproxy-compatible fault
proxy (``scriba.testing.faults``) listens on that address and forwards to the bookie
with a ``latency`` toxic of ``MS`` on each direction. So a client reaches region-1's
bookies directly and every other region one proxy hop away: one request/answer round
trip to a remote region costs ``2 * MS`` more (plus the proxy's own small cost).

The proxy runs as a process the sandbox starts and stops (by PID); its API URL is
recorded in ``sandbox.json`` (``region_latency``), so a user or a test can change the
toxics (for example cut a region off with ``timeout``) with any Toxiproxy client.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from scriba.embedded.process import ServerProcess, free_port
from scriba.errors import ConfigError


def _version_ok(url: str, timeout_s: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/version", timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError, ValueError):
        return False


class ToxiproxyProcess:
    """The fault proxy as its own process (``scriba faults-proxy``), or a real ``toxiproxy-server``."""

    def __init__(self, log_path: Path, *, port: int | None = None, binary: str | None = None) -> None:
        self.port = port if port is not None else free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if binary is not None:
            argv = [binary, "-host", "127.0.0.1", "-port", str(self.port)]
        else:
            argv = [sys.executable, "-m", "scriba.testing.faults_cli", "--listen", f"127.0.0.1:{self.port}"]
        self.process = ServerProcess("faults-proxy", argv, log_path)

    def start(self, timeout_s: float = 20.0) -> str:
        self.process.start()
        self.process.wait_ready(lambda: _version_ok(self.url), timeout_s)
        return self.url

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> ToxiproxyProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


REMOTE_HOST = "127.0.0.2"  # the address remote-region bookies advertise (loopback: always local)
API_TIMEOUT_S = 10.0


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=API_TIMEOUT_S) as response:
            doc: dict[str, Any] = json.loads(response.read() or b"{}")
            return doc
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        exc.close()
        raise ConfigError(f"fault proxy {url}: {exc.code} {detail}") from None


@dataclass
class RegionLatency:
    """One fault proxy with a latency proxy per remote-region bookie (see the module docstring)."""

    latency_ms: int  # each way (the proxy's latency toxic takes whole milliseconds)
    log_path: Path
    process: ToxiproxyProcess | None = None
    proxies: dict[str, str] = field(default_factory=dict)  # bookie id -> advertised address
    proxy_names: list[str] = field(default_factory=list)  # every proxy (gRPC and binary ports)

    def __post_init__(self) -> None:
        if self.latency_ms < 0:
            raise ConfigError(f"--inter-region-latency-ms: {self.latency_ms} must be >= 0")

    @staticmethod
    def advertise_args(remote: bool) -> list[str]:
        """The bookie's extra arguments: remote-region bookies advertise ``REMOTE_HOST``."""
        return ["--advertise", REMOTE_HOST] if remote else []

    def start(self) -> str:
        """Start the proxy process; returns its API URL."""
        self.process = ToxiproxyProcess(self.log_path)
        return self.process.start()

    def add_bookie(self, bookie_id: str, port: int, binary_port: int | None = None) -> str:
        """Proxy ``REMOTE_HOST:port`` to the bookie at ``127.0.0.1:port`` with the latency, and
        its binary data path (``binary_port``, which it advertises on ``REMOTE_HOST`` too) the
        same way, so that no client path bypasses the inter-region latency."""
        if self.process is None:
            raise ConfigError("region latency: start() first")
        listen = f"{REMOTE_HOST}:{port}"
        self._proxy(bookie_id, listen, f"127.0.0.1:{port}")
        if binary_port is not None:
            self._proxy(f"{bookie_id}-binary", f"{REMOTE_HOST}:{binary_port}", f"127.0.0.1:{binary_port}")
        self.proxies[bookie_id] = listen
        return listen

    def _proxy(self, name: str, listen: str, upstream: str) -> None:
        assert self.process is not None
        url = self.process.url
        _post(f"{url}/proxies", {"name": name, "listen": listen, "upstream": upstream, "enabled": True})
        for stream in ("upstream", "downstream"):
            _post(f"{url}/proxies/{name}/toxics", {
                "name": f"inter-region-{stream}", "type": "latency", "stream": stream,
                "attributes": {"latency": self.latency_ms, "jitter": 0},
            })
        self.proxy_names.append(name)

    def set_latency(self, latency_ms: int) -> None:
        """Change the latency of every remote-region proxy, on live connections too."""
        if self.process is None:
            raise ConfigError("region latency: start() first")
        if latency_ms < 0:
            raise ConfigError(f"inter-region latency: {latency_ms} must be >= 0")
        for name in self.proxy_names:
            for stream in ("upstream", "downstream"):
                _post(f"{self.process.url}/proxies/{name}/toxics/inter-region-{stream}",
                      {"attributes": {"latency": latency_ms, "jitter": 0}})
        self.latency_ms = latency_ms

    def describe(self) -> dict[str, Any]:
        return {
            "latency_ms": self.latency_ms,
            "api_url": None if self.process is None else self.process.url,
            "pid": None if self.process is None else self.process.process.pid,
            "proxies": dict(self.proxies),
        }

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
