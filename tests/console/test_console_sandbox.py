"""``scriba sandbox`` starts the console by default and lists it in sandbox.json; --no-console skips it;
its actions are off unless the sandbox is started with --console-allow-actions. The KV and
NameNode examples' RSM groups (``--with kv --with namenode``) appear on its RSM page with no
code of theirs for it: they register as every RSM group does."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

SCRIBA = [sys.executable, "-m", "scriba.cli"]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


def _cluster(url: str) -> dict[str, object]:
    doc: dict[str, object] = _get(url + "api/cluster")
    return doc


def _groups_led(url: str) -> dict[str, dict[str, Any]]:
    """RSM groups shown with a leader that says it leads and every member answering its STATUS."""
    return {f"{g['namespace']}/{g['name']}": g for g in _get(url + "api/rsm")
            if g["leader"] and all(m["answered"] for m in g["members"])
            and [m["role"] for m in g["members"] if m["replica_id"] == g["leader"]] == ["leader"]}


def _act(url: str, kind: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url + f"api/actions/{kind}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def _stop(data: Path) -> None:
    stopped = subprocess.run([*SCRIBA, "sandbox", "--stop", "--data", str(data)], capture_output=True,
                             text=True, timeout=60)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr


@pytest.mark.slow
def test_sandbox_starts_the_console(tmp_path: Path) -> None:
    data = tmp_path / "sb"
    started = subprocess.run([*SCRIBA, "sandbox", "--data", str(data), "--bookies", "3", "--no-autorecovery",
                              "--with", "kv", "--with", "namenode", "--detach"],
                             capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        doc = json.loads((data / "sandbox.json").read_text())
        url = doc["console"]["url"]
        assert f"console:  {url}" in started.stdout
        assert doc["console"]["actions"] is False
        status, refused = _act(url, "audit", {"full": True})  # read-only by default
        assert status == 403 and "--allow-actions" in str(refused["error"]), refused
        deadline = time.monotonic() + 60
        while (counts := _cluster(url)["counts"]) != {"writable": 3, "read-only": 0, "down": 0}:
            assert time.monotonic() < deadline, counts
            time.sleep(0.2)
        # the examples' groups, each replica where sandbox.json says it runs
        deadline = time.monotonic() + 60
        while set(groups := _groups_led(url)) != {"kv/store", "namenode/namenode"}:
            assert time.monotonic() < deadline, _get(url + "api/rsm")
            time.sleep(0.5)
        kv = {r["replica_id"]: r["zone"] for r in doc["kv"]}
        namenodes = {n["id"]: n["zone"] for n in doc["namenodes"]}
        assert {m["replica_id"]: m["zone"] for m in groups["kv/store"]["members"]} == kv and len(kv) == 3
        assert {m["replica_id"]: m["zone"] for m in groups["namenode/namenode"]["members"]} == namenodes
        with urllib.request.urlopen(url + "rsm", timeout=10) as reply:
            page = reply.read().decode()
        for group in ("kv/store", "namenode/namenode"):
            leader = groups[group]["leader"]
            assert f'data-group="{group}" data-leader="{leader}"' in page, page
        assert all(f'data-replica="{r}"' in page for r in (*kv, *namenodes)), page
    finally:
        _stop(data)
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


@pytest.mark.slow
def test_sandbox_console_allow_actions(tmp_path: Path) -> None:
    data = tmp_path / "sb"
    refused = subprocess.run([*SCRIBA, "sandbox", "--data", str(data), "--no-console", "--console-allow-actions"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "--console-allow-actions with --no-console" in refused.stderr, refused
    assert not (data / "sandbox.json").exists()  # refused before starting anything
    started = subprocess.run([*SCRIBA, "sandbox", "--data", str(data), "--bookies", "1", "--no-autorecovery",
                              "--console-allow-actions", "--detach"], capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        doc = json.loads((data / "sandbox.json").read_text())
        url = doc["console"]["url"]
        assert doc["console"]["actions"] is True
        status, asked = _act(url, "audit", {"full": True})  # the first POST asks for a confirmation
        assert status == 200 and asked["confirm"], asked
        status, done = _act(url, "audit", {"full": True, "confirm": asked["confirm"]})
        assert status == 200 and done["done"] is True and done["result"] == {"sequence": 1, "full": True}, done
    finally:
        _stop(data)
