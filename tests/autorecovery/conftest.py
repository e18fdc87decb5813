"""Real processes for autorecovery tests: etcd or ZooKeeper, bookies over three zones,
and ``scriba autorecovery run`` processes, each started and stopped by its own PID."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scriba.embedded.process import ServerProcess
from scriba.testing.cluster import LocalCluster

PASSWORD = b"pw"
ZONES = ["z1", "z2", "z3"]
SESSION_S = "2"  # bookie and worker metadata sessions: a SIGKILLed one is noticed in ~2 s


@dataclass
class ArCluster:
    cluster: LocalCluster
    base: Path
    workers: list[ServerProcess] = field(default_factory=list)

    @property
    def uri(self) -> str:
        return self.cluster.uri

    def start_autorecovery(self, name: str, *args: str, auditor: bool = True) -> ServerProcess:
        argv = [
            sys.executable, "-m", "scriba.cli", "--log-level", "info", "autorecovery",
            "--metadata", self.uri, "run", "--id", name, "--password", PASSWORD.decode(),
            "--delay-s", "1", "--tick-s", "0.2", "--claim-ttl-s", SESSION_S,
            "--open-ledger-grace-s", "3", "--check-interval-s", "3600",
            *([] if auditor else ["--no-auditor"]), *args,
        ]
        proc = ServerProcess(f"autorecovery {name}", argv, self.base / f"{name}.log")
        proc.start()
        proc.wait_ready(lambda: f'"autorecovery": "{name}"' in _read(proc.log_path), 30.0)
        self.workers.append(proc)
        return proc

    def stop(self) -> None:
        for w in self.workers:
            if w.running:
                w.stop()
        self.cluster.stop()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def start_cluster(kind: str, base: Path, bookies: int = 6) -> ArCluster:
    cluster = LocalCluster(base, metadata=kind)
    cluster.start(60.0)
    ar = ArCluster(cluster, base)
    try:
        cluster.bookies.start_bookies(bookies, zones=ZONES, extra_args=["--session-timeout-s", SESSION_S])
    except BaseException:
        ar.stop()
        raise
    return ar


@pytest.fixture(params=["etcd", "zk"])
def ar_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ArCluster]:
    ar = start_cluster(request.param, tmp_path)
    try:
        yield ar
    finally:
        failed = getattr(getattr(request.node, "scriba_report_call", None), "failed", False)
        if failed:
            for w in ar.workers:
                print(f"--- tail of {w.log_path} ---\n{w.log_tail(40)}")
            print(ar.cluster.bookies.describe())
        ar.stop()
