"""``scriba sandbox`` starts the console by default and lists it in sandbox.json; --no-console skips it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

SCRIBA = [sys.executable, "-m", "scriba.cli"]


def _cluster(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url + "api/cluster", timeout=5) as reply:
        doc: dict[str, object] = json.loads(reply.read())
        return doc


@pytest.mark.slow
def test_sandbox_starts_the_console(tmp_path: Path) -> None:
    data = tmp_path / "sb"
    started = subprocess.run([*SCRIBA, "sandbox", "--data", str(data), "--bookies", "3", "--detach"],
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        doc = json.loads((data / "sandbox.json").read_text())
        url = doc["console"]["url"]
        assert f"console:  {url}" in started.stdout
        deadline = time.monotonic() + 20
        while (counts := _cluster(url)["counts"]) != {"writable": 3, "read-only": 0, "down": 0}:
            assert time.monotonic() < deadline, counts
            time.sleep(0.2)
    finally:
        stopped = subprocess.run([*SCRIBA, "sandbox", "--stop", "--data", str(data)], capture_output=True,
                                 text=True, timeout=60)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    deadline = time.monotonic() + 10
    while Path(f"/proc/{doc['console']['pid']}").exists():  # stopped with the sandbox
        assert time.monotonic() < deadline, "the console outlived its sandbox"
        time.sleep(0.1)


@pytest.mark.slow
def test_sandbox_without_console(tmp_path: Path) -> None:
    data = tmp_path / "sb"
    done = subprocess.run([*SCRIBA, "sandbox", "--data", str(data), "--bookies", "3", "--no-console",
                           "--simple-test"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "console:" not in done.stdout
