"""``KvCluster``: replicas of the KV store example as real processes (tests, benchmarks,
the sandbox).

    with KvCluster(metadata_uri, workdir, replicas=3) as kv:
        kv.endpoints          # "127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3" for etcdctl
        kv.kill(0); kv.start(0)

Each replica is ``python -m scriba.examples.kvstore serve`` on free ports, started
and waited for (``READY`` on stdout) one by one; its stderr goes to
``<workdir>/<replica id>-<incarnation>.log``. Only processes started here are
signalled, by PID.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from scriba.embedded.process import free_port, python_module_argv

READY_TIMEOUT_S = 60.0
RESTART_BACKOFF_S = 2.0


@dataclass
class KvReplica:
    replica_id: str
    endpoint: str
    peer: str
    zone: str = ""
    metadata_uri: str = ""  # this replica's own route to the metadata store (a fault proxy), if any
    incarnation: int = 0
    proc: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class KvCluster:
    def __init__(self, metadata_uri: str, workdir: Path, *, replicas: int = 3, namespace: str = "kv",
                 name: str = "store", zones: list[str] | None = None, rsm_config: dict[str, Any] | None = None,
                 metadata_uris: list[str] | None = None, session_timeout_s: float = 2.0,
                 extra_args: list[str] | None = None) -> None:
        self.metadata_uri = metadata_uri
        self.extra_args = list(extra_args or [])  # e.g. the --tls-* flags
        self.workdir = Path(workdir)
        self.namespace, self.name = namespace, name
        self.rsm_config = rsm_config or {}
        self.session_timeout_s = session_timeout_s  # each replica's metadata session (its fail-over time)
        self.replicas = [
            KvReplica(f"r{i + 1}", f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}",
                      zones[i % len(zones)] if zones else "", metadata_uris[i] if metadata_uris else "")
            for i in range(replicas)
        ]

    @property
    def endpoints(self) -> str:
        return ",".join(r.endpoint for r in self.replicas)

    def start(self, index: int) -> KvReplica:
        r = self.replicas[index]
        r.incarnation += 1
        self.workdir.mkdir(parents=True, exist_ok=True)
        log_path = self.workdir / f"{r.replica_id}-{r.incarnation}.log"
        r.logs.append(log_path)
        with log_path.open("wb") as log_file:
            r.proc = subprocess.Popen(
                python_module_argv(
                    "scriba.examples.kvstore", "serve", "--metadata", r.metadata_uri or self.metadata_uri,
                    "--replica-id", r.replica_id, "--listen", r.endpoint, "--peer", r.peer, "--namespace",
                    self.namespace, "--name", self.name, "--zone", r.zone, "--rsm-config", json.dumps(self.rsm_config),
                    "--session-timeout-s", str(self.session_timeout_s), *self.extra_args),
                stdout=subprocess.PIPE, stderr=log_file, stdin=subprocess.DEVNULL, cwd=self.workdir,
            )
        self._wait_ready(r)
        return r

    def _wait_ready(self, r: KvReplica) -> None:
        assert r.proc is not None and r.proc.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([r.proc.stdout], [], [], 0.5)
            if ready:
                line = r.proc.stdout.readline()
                if line.strip() == b"READY":
                    return
                if not line:
                    break
        self.kill_replica(r)
        tail = r.logs[-1].read_text(errors="replace")[-3000:] if r.logs else ""
        raise RuntimeError(f"kv replica {r.replica_id} did not start within {READY_TIMEOUT_S} s:\n{tail}")

    def start_all(self, attempts: int = 1) -> KvCluster:
        """Start every replica; one whose process exits before it serves (say, its metadata
        session lost on a machine too busy to renew it) is tried up to ``attempts`` times."""
        for i in range(len(self.replicas)):
            for attempt in range(attempts):
                try:
                    self.start(i)
                    break
                except RuntimeError:
                    if attempt == attempts - 1:
                        raise
                    time.sleep(RESTART_BACKOFF_S)  # a backoff: the dead attempt's registration may linger
        return self

    def kill(self, index: int) -> None:
        self.kill_replica(self.replicas[index])

    def signal(self, index: int, sig: signal.Signals) -> None:
        """SIGSTOP / SIGCONT (or any signal) to one running replica, by its PID."""
        r = self.replicas[index]
        if r.running:
            assert r.proc is not None
            os.kill(r.proc.pid, sig)

    @staticmethod
    def kill_replica(r: KvReplica) -> None:
        if r.running:
            assert r.proc is not None
            os.kill(r.proc.pid, signal.SIGKILL)  # our own child, by its PID
            r.proc.wait()
        if r.proc is not None and r.proc.stdout is not None:
            r.proc.stdout.close()

    def stop_all(self) -> None:
        for r in self.replicas:
            if r.running:
                assert r.proc is not None
                os.kill(r.proc.pid, signal.SIGCONT)  # a paused replica could not act on SIGTERM
                os.kill(r.proc.pid, signal.SIGTERM)
        for r in self.replicas:
            if r.proc is not None:
                try:
                    r.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
                self.kill_replica(r)  # kills a straggler; closes the pipe either way

    stop = stop_all  # the launchers' common name

    def __enter__(self) -> KvCluster:
        return self.start_all()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop_all()
