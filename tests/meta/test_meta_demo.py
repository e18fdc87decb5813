"""``scriba demo``: the README's main job at this stage runs and says what happened."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from scriba.demo import demo


def test_demo_on_an_embedded_etcd_runs_every_step_and_stops_it(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "scriba.cli", "--log-level", "warning", "demo", "--data", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "started an embedded etcd" in out and "stopping the embedded etcd" in out
    assert "BadVersionError" in out and "event DELETE demo/jobs/b" in out
    assert "the record vanished" in out and "beta took over" in out
    assert out.rstrip().endswith("stopping the embedded etcd")
    assert list(tmp_path.glob("etcd-*/m0")), "the etcd data dir is kept under --data"


async def test_demo_on_memory() -> None:
    out = io.StringIO()
    await demo("memory://demo-test", out)  # in-process: the CLI's logging setup stays out of pytest
    assert "demo finished: every step behaved as promised" in out.getvalue()


def test_demo_with_a_bad_uri_fails_cleanly() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "scriba.cli", "demo", "--metadata", "nosuch://x/y"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 1
    assert "unknown metadata scheme" in proc.stderr
