"""Namenode replicas as real processes (``python -m scriba.examples.namenode serve``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests

from scriba.embedded.process import free_port
from scriba.testing.cluster import BookieCluster
from scriba.testing.waiting import wait_until

RSM_CONFIG = {"campaign_backoff_s": 0.1, "suspended_grace_s": 0.5, "propose_timeout_s": 20.0,
              "snapshot_every_commands": 50}


class NamenodeProc:
    def __init__(self, uri: str, replica_id: str, log_dir: Path, namespace: str,
                 rsm_config: dict[str, Any] | None = None) -> None:
        self.uri, self.replica_id, self.namespace = uri, replica_id, namespace
        self.rsm_config = {**RSM_CONFIG, **(rsm_config or {})}
        self.port = free_port()
        self.rsm_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{replica_id}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> NamenodeProc:
        cmd = [sys.executable, "-m", "scriba.examples.namenode", "serve", "--metadata", self.uri,
               "--id", self.replica_id, "--listen", f"127.0.0.1:{self.port}",
               "--rsm-listen", f"127.0.0.1:{self.rsm_port}", "--namespace", self.namespace,
               "--session-timeout-s", "2", "--rsm-config", json.dumps(self.rsm_config)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=dict(os.environ))
        wait_until(lambda: self.status() is not None, 30.0, what=f"{self.replica_id} serving", interval_s=0.05)
        return self

    def status(self) -> dict[str, Any] | None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_bytes()[-3000:].decode(errors="replace")
            raise AssertionError(f"{self.replica_id} exited {self.proc.returncode}; log {self.log_path}:\n{tail}")
        try:
            return dict(requests.get(f"{self.url}/scriba/status", timeout=2).json())
        except requests.RequestException:
            return None

    def digest(self, consistency: str = "sequential") -> dict[str, Any]:
        answer = requests.get(f"{self.url}/scriba/digest", params={"scriba_consistency": consistency}, timeout=30)
        answer.raise_for_status()
        return dict(answer.json())

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


def open_root(node: NamenodeProc) -> None:
    """As the superuser, let every user create under ``/`` (a fresh namespace's root is
    ``hdfs:supergroup 755``, as after HDFS's format)."""
    answer = requests.put(f"{node.url}/webhdfs/v1/", params={"op": "SETPERMISSION", "permission": "777",
                                                            "user.name": "hdfs"}, timeout=60)
    answer.raise_for_status()


def haadmin(node: NamenodeProc, *verb: str) -> subprocess.CompletedProcess[str]:
    """``scriba-namenode haadmin --metadata ... VERB ...`` as a process; its output (pipes closed)."""
    cmd = [sys.executable, "-m", "scriba.examples.namenode", "haadmin", "--metadata", node.uri,
           "--namespace", node.namespace, *verb]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def active_of(nodes: list[NamenodeProc], timeout_s: float = 30.0) -> NamenodeProc:
    found: list[NamenodeProc] = []

    def one_active() -> bool:
        for node in nodes:
            if node.proc is not None and node.proc.poll() is None:
                status = node.status()
                if status is not None and status["role"] == "active":
                    found.append(node)
                    return True
        return False

    wait_until(one_active, timeout_s, what="an active namenode", interval_s=0.05)
    return found[0]


@contextlib.contextmanager
def namenode_cluster(etcd_cluster: Any, base: Path, replicas: int, namespace: str,
                     rsm_config: dict[str, Any] | None = None) -> Iterator[list[NamenodeProc]]:
    """3 bookies (zones z1..z3) and ``replicas`` namenodes ``nn1..`` on a fresh prefix of the
    shared etcd, the root opened to every user; everything stopped at the end."""
    uri = str(etcd_cluster.uri(f"n{uuid.uuid4().hex[:8]}"))
    bookies = BookieCluster(base / "bookies", uri)
    nodes: list[NamenodeProc] = []
    try:
        bookies.start_bookies(3, zones=["z1", "z2", "z3"])
        nodes = [NamenodeProc(uri, f"nn{i}", base, namespace, rsm_config).start() for i in range(1, replicas + 1)]
        open_root(active_of(nodes))
        yield nodes
    finally:
        for node in nodes:
            node.stop()
        bookies.stop_all()


def payload(name: str, size: int) -> bytes:
    """``size`` bytes that depend on ``name`` (every file's content differs)."""
    seed = hashlib.sha256(name.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]
