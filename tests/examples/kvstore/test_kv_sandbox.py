"""``scriba sandbox --with kv``: three store replicas over the sandbox's zones, their
``--endpoints`` line printed, listed in ``sandbox.json``, usable by etcdctl, stopped
with the sandbox; the data survives a stop and start."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from kv_harness import Ctl

from scriba.errors import ConfigError
from scriba.sandbox import SandboxOptions
from scriba.testing.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

SCRIBA = [sys.executable, "-m", "scriba.cli"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"))


def _sandbox(data: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SCRIBA, "sandbox", "--data", str(data), "--no-console", *extra],
                          capture_output=True, text=True, timeout=240)


def test_unknown_service_is_refused() -> None:
    with pytest.raises(ConfigError, match="--with nosuch: known services are kv, namenode"):
        SandboxOptions(Path("x"), services=("nosuch",)).validate()
    SandboxOptions(Path("x"), services=("kv", "namenode"), tls=True).validate()  # served over mutual TLS


def test_sandbox_with_kv_serves_etcdctl_and_keeps_its_data(tmp_path: Path) -> None:
    data = tmp_path / "sb"
    started = _sandbox(data, "--with", "kv", "--detach")
    pids: list[int] = []
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        printed = re.search(r"etcdctl --endpoints (\S+) ", started.stdout)
        assert printed is not None, started.stdout
        doc = json.loads((data / "sandbox.json").read_text())
        kv = doc["kv"]
        assert [r["replica_id"] for r in kv] == ["r1", "r2", "r3"]
        assert sorted(r["zone"] for r in kv) == ["zone-a", "zone-b", "zone-c"]
        assert printed.group(1) == ",".join(r["endpoint"] for r in kv)
        pids = [r["pid"] for r in kv]
        assert all(_alive(pid) for pid in pids)
        ctl = Ctl(printed.group(1))
        assert ctl.ok("put", "sandbox/hello", "world").strip() == "OK"
        for r in kv:  # every replica answers
            assert ctl.ok("get", "sandbox/hello", "--print-value-only", endpoints=r["endpoint"]).strip() == "world"
        status = ctl.json("endpoint", "status")
        assert sum(1 for s in status if s["Status"]["leader"] == s["Status"]["header"]["member_id"]) == 1
        terms = {s["Status"]["raftTerm"] for s in status}  # followers report the leader's term too
        assert len(terms) == 1 and terms.pop() > 0, status
    finally:
        stopped = _sandbox(data, "--stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    wait_until(lambda: not any(_alive(pid) for pid in pids), 30, what="the sandbox stopped its KV replicas",
               interval_s=0.2)
    again = _sandbox(data, "--with", "kv", "--detach")  # restarted on the kept data
    try:
        assert again.returncode == 0, again.stdout + again.stderr
        endpoints = ",".join(r["endpoint"] for r in json.loads((data / "sandbox.json").read_text())["kv"])
        assert Ctl(endpoints).ok("get", "sandbox/hello", "--print-value-only").strip() == "world"
    finally:
        assert _sandbox(data, "--stop").returncode == 0
