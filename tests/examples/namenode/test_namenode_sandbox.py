"""``scriba sandbox --with namenode``: an active and two standbys across zones, listed in
``sandbox.json`` under ``namenodes``, serving WebHDFS, and stopped with the sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hdfs import InsecureClient

from scriba.testing.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIBA = [sys.executable, "-m", "scriba.cli"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sandbox_with_namenode(tmp_path: Path) -> None:
    data = tmp_path / "sandbox"
    started = subprocess.run([*SCRIBA, "sandbox", "--data", str(data), "--bookies", "3", "--no-console",
                              "--with", "namenode", "--detach"], capture_output=True, text=True, timeout=240)
    doc: dict[str, object] = {}
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        doc = json.loads((data / "sandbox.json").read_text())
        namenodes = doc["namenodes"]
        assert isinstance(namenodes, list)
        assert [n["id"] for n in namenodes] == ["nn1", "nn2", "nn3"]
        assert len({n["zone"] for n in namenodes}) == 3
        assert sorted(n["role"] for n in namenodes) == ["active", "standby", "standby"]
        assert all(alive(n["pid"]) for n in namenodes)
        assert started.stdout.count("namenode: nn") == 3
        client = InsecureClient(";".join(n["url"] for n in namenodes[::-1]), user="hdfs")
        client.write("/sandbox/hello.txt", data=b"hello")
        with client.read("/sandbox/hello.txt") as reader:
            assert reader.read() == b"hello"
        listed = subprocess.run([*SCRIBA[:2], "scriba.examples.namenode", "haadmin", "--metadata",
                                 str(doc["metadata_uri"]), "-getAllServiceState"],
                                capture_output=True, text=True, timeout=60)
        assert sorted(line.split("\t")[0] for line in listed.stdout.splitlines()) == ["nn1", "nn2", "nn3"]
    finally:
        stopped = subprocess.run([*SCRIBA, "sandbox", "--stop", "--data", str(data)], capture_output=True,
                                 text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    for n in doc.get("namenodes", []):  # type: ignore[attr-defined]
        wait_until(lambda pid=n["pid"]: not alive(pid), 30, what=f"{n['id']} to exit", interval_s=0.05)
