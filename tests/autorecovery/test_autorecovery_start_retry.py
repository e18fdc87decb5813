"""The autorecovery process's start-up against a metadata server that is not answering
yet (``meta/startup.py``): a real ``scriba autorecovery run`` started while a real etcd
is stopped (SIGSTOP) retries its connect, comes up when the server resumes, and a
SIGTERM sent while it still retries ends it cleanly (exit 0), not after the bound."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scriba.embedded.etcd import EtcdCluster
from scriba.embedded.process import ServerProcess, wait_until

pytestmark = [pytest.mark.timeout(180)]

WAIT_S = 60.0


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with EtcdCluster(tmp_path_factory.mktemp("etcd-ar-start"), 1) as cluster:
        yield cluster


def autorecovery(etcd: Any, base: Path, name: str) -> ServerProcess:
    argv = [sys.executable, "-m", "scriba.cli", "--log-level", "info", "autorecovery",
            "--metadata", etcd.uri(f"ar-{name}"), "run", "--id", name, "--claim-ttl-s", "2",
            "--start-timeout-s", "120"]
    return ServerProcess(f"autorecovery {name}", argv, base / f"{name}.log")


def _log(proc: ServerProcess) -> str:
    try:
        return proc.log_path.read_text(errors="replace")
    except OSError:
        return ""


@contextlib.contextmanager
def started_while_paused(etcd: Any, proc: ServerProcess) -> Iterator[None]:
    """Start ``proc`` with the server stopped (SIGSTOP); yield once it has logged a retry;
    resume the server on the way out."""
    member = etcd.members[0]
    member.pause()
    try:
        proc.start()
        wait_until(lambda: "autorecovery_start_retry" in _log(proc) or not proc.running, WAIT_S,
                   what="the autorecovery process retrying its connect while the server is stopped")
        assert proc.running, _log(proc)[-3000:]
        assert "autorecovery_started" not in _log(proc)
        yield
    finally:
        member.resume()


def test_a_process_started_while_the_server_is_stopped_comes_up_when_it_resumes(etcd: Any, tmp_path: Path) -> None:
    proc = autorecovery(etcd, tmp_path, "paused")
    with started_while_paused(etcd, proc):
        pass
    try:
        wait_until(lambda: '"autorecovery": "paused"' in _log(proc) or not proc.running, WAIT_S,
                   what="the autorecovery process serving after the server resumed")
        assert proc.running, _log(proc)[-3000:]
        assert any("autorecovery_start_retry" in line and "connect" in line for line in _log(proc).splitlines())
    finally:
        proc.stop()
    assert proc.returncode == 0, _log(proc)[-3000:]


def test_sigterm_ends_a_start_that_is_still_retrying(etcd: Any, tmp_path: Path) -> None:
    proc = autorecovery(etcd, tmp_path, "abandoned")
    with started_while_paused(etcd, proc):
        proc.stop(timeout_s=30.0)  # SIGTERM; SIGKILL only if it does not exit by then
    assert proc.returncode == 0, _log(proc)[-3000:]  # exited on SIGTERM, not killed
    assert "autorecovery_start_abandoned" in _log(proc)
    assert "autorecovery_started" not in _log(proc)
