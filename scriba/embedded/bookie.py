"""One ``scriba bookie run ...`` child process, started and stopped by its own PID.

Ready when ``GetBookieInfo`` answers with a serving state (the bookie registers before
it reports one). ``stop()`` is SIGTERM (graceful: deregister, flush); ``kill()`` SIGKILL;
``pause()``/``resume()`` SIGSTOP/SIGCONT; ``restart()`` keeps id, dirs and ports;
``wipe()`` deletes the data and journal dirs (cookie tests). With ``tls`` the bookie
serves TLS (its flags are rendered from the config) and the readiness probe dials with
``probe_tls`` (default: the bookie's own certificate and CA, as a peer bookie would).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc

from scriba.embedded.process import (
    ServerProcess,
    ServerStartError,
    free_port,
    port_open,
    python_module_argv,
)
from scriba.meta.records import DEFAULT_RACK, DEFAULT_REGION, DEFAULT_ZONE
from scriba.proto import scriba_pb2 as pb
from scriba.proto import scriba_pb2_grpc as pb_grpc
from scriba.tls import TlsConfig

_SERVING = (pb.BOOKIE_READ_WRITE, pb.BOOKIE_READ_ONLY)


class BookieProcess:
    def __init__(
        self,
        base_dir: Path,
        metadata_uri: str,
        *,
        bookie_id: str | None = None,
        region: str = DEFAULT_REGION,
        zone: str = DEFAULT_ZONE,
        rack: str = DEFAULT_RACK,
        port: int | None = None,
        http_port: int | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        journal_dir: Path | None = None,
        tls: TlsConfig | None = None,
        probe_tls: TlsConfig | None = None,
    ) -> None:
        self.base_dir = Path(base_dir).absolute()  # the child runs in it: argv paths must not be relative
        self.metadata_uri = metadata_uri
        self.port = port if port is not None else free_port()
        self.http_port = http_port if http_port is not None else free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.http_address = f"127.0.0.1:{self.http_port}"
        self.bookie_id = bookie_id or self.address  # as `scriba bookie run`: the id defaults to the address
        self.region = region
        self.zone = zone
        self.rack = rack
        self.data_dir = self.base_dir / "data"
        self.journal_dir = Path(journal_dir).absolute() if journal_dir is not None else self.base_dir / "journal"
        self.log_path = self.base_dir / "bookie.log"
        self.env = dict(env) if env is not None else {}
        self.extra_args = list(extra_args)
        self.tls = tls
        if tls is not None and probe_tls is None:
            probe_tls = TlsConfig(cert=tls.cert, key=tls.key, ca=tls.ca)
        self.probe_tls = probe_tls
        self._process = ServerProcess(
            f"bookie {self.bookie_id}", self.argv(), self.log_path, env=self.env
        )

    def argv(self) -> list[str]:
        return python_module_argv(
            "scriba.bookie.cli", "run",
            "--metadata", self.metadata_uri,
            "--data", str(self.data_dir),
            "--journal", str(self.journal_dir),
            "--listen", self.address,
            "--id", self.bookie_id,
            "--region", self.region,
            "--zone", self.zone,
            "--rack", self.rack,
            "--http", self.http_address,
            *tls_argv(self.tls),
            *self.extra_args,
        )

    def format_argv(self, *, force: bool = True) -> list[str]:
        return python_module_argv(
            "scriba.bookie.cli", "format",
            "--metadata", self.metadata_uri,
            "--data", str(self.data_dir),
            "--journal", str(self.journal_dir),
            "--id", self.bookie_id,
            *(["--force"] if force else []),
        )

    @property
    def process(self) -> ServerProcess:
        return self._process

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process.running

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    def bookie_info(self, timeout_s: float = 1.0) -> pb.BookieInfoResponse | None:
        """GetBookieInfo, or None when the bookie does not answer."""
        if not port_open("127.0.0.1", self.port):
            return None
        try:
            with _channel(self.address, self.probe_tls) as channel:
                stub = pb_grpc.BookieStub(channel)
                response: pb.BookieInfoResponse = stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=timeout_s)
                return response
        except grpc.RpcError:
            return None

    def serving(self) -> bool:
        info = self.bookie_info()
        return info is not None and info.status == pb.OK and info.state in _SERVING

    def start(self, timeout_s: float = 30.0) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._process.argv = self.argv()
        self._process.start()
        self._process.wait_ready(self.serving, timeout_s)

    def start_expect_exit(self, timeout_s: float = 30.0) -> int:
        """Start and wait for the process to exit by itself (e.g. a refused cookie)."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._process.argv = self.argv()
        self._process.start()
        deadline = time.monotonic() + timeout_s
        while self._process.running:
            if time.monotonic() > deadline:
                self._process.kill()
                raise ServerStartError(f"{self._process.name} kept running; log {self.log_path}")
            time.sleep(0.05)
        return self._process.returncode or 0

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM: graceful shutdown (SIGKILL if it takes longer than ``timeout_s``)."""
        self._process.stop(timeout_s)

    def kill(self) -> None:
        self._process.kill()

    def pause(self) -> None:
        self._process.pause()

    def resume(self) -> None:
        self._process.resume()

    def restart(self, timeout_s: float = 30.0) -> None:
        if self.running:
            self.stop()
        self.start(timeout_s)

    def wipe(self) -> None:
        """Delete the data and journal dirs (the process must not be running)."""
        if self.running:
            raise ServerStartError(f"{self._process.name} is running; stop it before wipe()")
        for d in (self.data_dir, self.journal_dir):
            shutil.rmtree(d, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        return self._process.log_tail(lines)


def tls_argv(tls: TlsConfig | None) -> list[str]:
    """The ``--tls-*`` flags of a server that serves ``tls`` (none for None)."""
    if tls is None:
        return []
    argv: list[str] = []
    for flag, value in (("--tls-cert", tls.cert), ("--tls-key", tls.key), ("--tls-ca", tls.ca)):
        if value is not None:
            argv += [flag, str(value)]
    if tls.require_client_cert:
        argv.append("--tls-require-client-cert")
    for role, identities in sorted(tls.allow.items()):
        argv += [a for ident in sorted(identities) for a in ("--tls-allow", f"{role}={ident}")]
    return argv


def _channel(address: str, tls: TlsConfig | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(address)
    loaded = tls.load()
    return grpc.secure_channel(address, loaded.grpc_channel_credentials(), options=loaded.grpc_channel_options())
