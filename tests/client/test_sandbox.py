"""``scriba sandbox``: starts etcd + bookie processes, describes them, stops them all."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scriba.embedded.process import port_open
from scriba.testing.waiting import wait_until

SCRIBA = [sys.executable, "-m", "scriba.cli"]
# the installed entry point, as a user runs it (its own dir, not the cwd, is on sys.path)
SCRIBA_INSTALLED = [str(Path(sys.executable).with_name("scriba"))] if Path(sys.executable).with_name("scriba").is_file() \
    else [sys.executable, "-P", "-m", "scriba.cli"]
START_TIMEOUT_S = 60.0
SHADOW_INIT = 'raise ImportError("the working directory shadowed the installed scriba package")\n'


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of ours is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc
    except (OSError, ValueError):
        return None


def _start(data: Path, *extra: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*SCRIBA, "sandbox", "--data", str(data), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
    )


def _kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL and reap; close its output pipe (a pipe left to the garbage collector is
    an unraisable ResourceWarning, which fails the test)."""
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _pids(doc: dict[str, Any]) -> list[int]:
    """The bookies', etcd's and the autorecovery process's PIDs (not the console's)."""
    return ([b["pid"] for b in doc["bookies"]] + list(doc["etcd"]["pids"] if doc.get("etcd") else [])
            + ([doc["autorecovery"]["pid"]] if doc.get("autorecovery") else []))


def _stop(proc: subprocess.Popen[str], sig: int) -> str:
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=40)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sandbox_starts_describes_refuses_second_and_stops(tmp_path: Path, sig: int) -> None:
    data = tmp_path / "sb"
    proc = _start(data, "--bookies", "4", "--zones", "3")
    try:
        wait_until(lambda: _read_json(data / "sandbox.json") is not None or proc.poll() is not None, START_TIMEOUT_S, what="sandbox.json", interval_s=0.05)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        doc = _read_json(data / "sandbox.json")
        assert doc is not None
        assert doc["metadata_uri"].startswith("etcd://127.0.0.1:")
        assert doc["pid"] == proc.pid
        assert [b["zone"] for b in doc["bookies"]] == ["zone-a", "zone-b", "zone-c", "zone-a"]
        assert len({b["bookie_id"] for b in doc["bookies"]}) == 4
        for b in doc["bookies"]:
            host, port = b["address"].rsplit(":", 1)
            assert port_open(host, int(port))
            assert Path(b["data_dir"]).is_relative_to(data)
        pids = _pids(doc)
        assert len(pids) == 6 and all(_alive(p) for p in pids)
        assert doc["autorecovery"]["id"] == "sandbox-autorecovery" and doc["autorecovery"]["delay_s"] == 60
        # a second sandbox on the same dir refuses, and harms nothing
        second = subprocess.run([*SCRIBA, "sandbox", "--data", str(data)], capture_output=True, text=True, timeout=30)
        assert second.returncode == 1
        assert "already running" in second.stderr and str(proc.pid) in second.stderr
        assert all(_alive(p) for p in pids)
        out = _stop(proc, sig)
    finally:
        if proc.poll() is None:
            _kill(proc)
    assert proc.returncode == 0, out
    assert "metadata: etcd://" in out and "next:" in out and "sandbox stopped" in out
    wait_until(lambda: not any(_alive(p) for p in pids), 10, what="every sandbox process exiting", interval_s=0.05)
    assert not (data / "sandbox.json").exists()
    # the dir is free again
    assert not (data / "sandbox.lock").exists()


@pytest.mark.slow
def test_sandbox_simple_test_mode_passes_and_cleans_up(tmp_path: Path) -> None:
    data = tmp_path / "sb"
    done = subprocess.run(
        [*SCRIBA, "sandbox", "--data", str(data), "--bookies", "3", "--simple-test"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "simple-test PASSED" in done.stdout
    assert "sandbox stopped" in done.stdout
    assert not (data / "sandbox.json").exists()


@pytest.mark.slow
def test_sandbox_detach_and_stop_and_shell_default_metadata(tmp_path: Path) -> None:
    started = subprocess.run(
        [*SCRIBA, "sandbox", "--bookies", "3", "--detach"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    doc = _read_json(tmp_path / "sandbox-data" / "sandbox.json")
    assert doc is not None
    pids = [*_pids(doc), doc["pid"]]
    try:
        # the shell finds the sandbox in ./sandbox-data without --metadata
        env = {k: v for k, v in os.environ.items() if k != "SCRIBA_METADATA"}
        listed = subprocess.run([*SCRIBA, "shell", "--json", "list-bookies"], capture_output=True, text=True,
                                timeout=60, cwd=tmp_path, env=env)
        assert listed.returncode == 0, listed.stderr
        assert sorted(b["bookie_id"] for b in json.loads(listed.stdout)) == ["bookie-1", "bookie-2", "bookie-3"]
    finally:
        stopped = subprocess.run([*SCRIBA, "sandbox", "--stop"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    wait_until(lambda: not any(_alive(p) for p in pids), 10, what="every sandbox process exiting", interval_s=0.05)


@pytest.mark.slow
def test_sandbox_after_a_sigkilled_one_reaps_its_orphans(tmp_path: Path) -> None:
    data = tmp_path / "sb"
    first = _start(data, "--bookies", "2")
    orphans: list[int] = []
    try:
        wait_until(lambda: _read_json(data / "sandbox.json") is not None or first.poll() is not None, START_TIMEOUT_S, what="sandbox.json", interval_s=0.05)
        doc = _read_json(data / "sandbox.json")
        assert doc is not None
        orphans = _pids(doc)
        _kill(first)  # no cleanup: its etcd and bookies keep running
        assert all(_alive(p) for p in orphans)
    finally:
        if first.poll() is None:
            _kill(first)
    second = _start(data, "--bookies", "2")
    try:
        wait_until(lambda: (_read_json(data / "sandbox.json") or {}).get("pid") == second.pid or second.poll() is not None, START_TIMEOUT_S, what="second sandbox.json", interval_s=0.05)
        assert second.poll() is None
        assert not any(_alive(p) for p in orphans)
        out = _stop(second, signal.SIGTERM)
        assert second.returncode == 0, out
    finally:
        if second.poll() is None:
            _kill(second)
        for pid in orphans:  # never leave them behind, even when the test fails
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def shadowing_cwd(tmp_path: Path) -> Path:
    """A working directory holding a folder named ``scriba`` that breaks any import of it."""
    cwd = tmp_path / "work"
    (cwd / "scriba").mkdir(parents=True)
    (cwd / "scriba" / "__init__.py").write_text(SHADOW_INIT)
    return cwd


def _cwd_of(pid: int) -> Path:
    return Path(os.readlink(f"/proc/{pid}/cwd"))


async def _write_ledger(uri: str, n: int) -> tuple[int, list[bytes]]:
    from scriba.client import Client

    payloads = [f"kept across restarts {i}".encode() for i in range(n)]
    async with Client.connect(uri) as client:
        writer = await client.create_ledger(3, 3, 2, password=b"pw")
        for p in payloads:
            await writer.append(p)
        await writer.close()
        return int(writer.ledger_id), payloads


async def _read_ledger(uri: str, ledger_id: int) -> list[bytes]:
    from scriba.client import Client

    async with Client.connect(uri) as client:
        reader = await client.open_ledger(ledger_id, password=b"pw", recovery=False)
        out = [bytes(e.payload) async for e in reader.read(0)]
        await reader.close()
        return out


async def _ledgers(uri: str) -> list[int]:
    from scriba.client import Client

    async with Client.connect(uri) as client:
        return [int(i) for i in await client.list_ledgers()]


@pytest.mark.slow
def test_sandbox_keeps_data_across_a_restart_and_fresh_wipes_it(tmp_path: Path) -> None:
    """Run from a working directory that would shadow the package (children must not care);
    a ledger written before a stop is readable after the next start, cookies and etcd data
    unchanged; ``--fresh`` starts empty."""
    cwd = shadowing_cwd(tmp_path)
    data = tmp_path / "sb"

    def sandbox(*extra: str) -> dict[str, Any]:
        done = subprocess.run([*SCRIBA_INSTALLED, "sandbox", "--data", str(data), "--bookies", "3", *extra],
                              capture_output=True, text=True, timeout=120, cwd=cwd)
        assert done.returncode == 0, done.stdout + done.stderr + (data / "sandbox.log").read_text(errors="replace")
        doc = _read_json(data / "sandbox.json")
        assert doc is not None
        return doc

    def stop(doc: dict[str, Any]) -> None:
        pids = [*_pids(doc), doc["pid"]]
        done = subprocess.run([*SCRIBA_INSTALLED, "sandbox", "--stop", "--data", str(data)],
                              capture_output=True, text=True, timeout=60, cwd=cwd)
        assert done.returncode == 0, done.stdout + done.stderr
        wait_until(lambda: not any(_alive(p) for p in pids), 20, what="every sandbox process exiting", interval_s=0.05)

    first = sandbox("--detach")
    try:
        assert _cwd_of(first["pid"]) == data.resolve()  # the detached sandbox runs in its data dir
        for b in first["bookies"]:
            assert _cwd_of(b["pid"]) == Path(b["data_dir"]).parent  # each bookie in its own dir
        assert all(_cwd_of(p) == (data / "etcd").resolve() for p in first["etcd"]["pids"])
        ledger_id, payloads = asyncio.run(_write_ledger(first["metadata_uri"], 50))
    finally:
        stop(first)
    cookies = {p: p.read_bytes() for p in data.glob("bookie-*/*/COOKIE")}
    assert len(cookies) >= 3, sorted(data.rglob("COOKIE"))

    second = sandbox("--detach")
    try:
        assert second["metadata_uri"] == first["metadata_uri"], "etcd restarted on its data and ports"
        assert "keeping the data" in (data / "sandbox.log").read_text()
        assert asyncio.run(_read_ledger(second["metadata_uri"], ledger_id)) == payloads
        assert {p: p.read_bytes() for p in data.glob("bookie-*/*/COOKIE")} == cookies
    finally:
        stop(second)

    third = sandbox("--detach", "--fresh")
    try:
        assert asyncio.run(_ledgers(third["metadata_uri"])) == []
        assert {p: p.read_bytes() for p in data.glob("bookie-*/*/COOKIE")} != cookies
    finally:
        stop(third)


@pytest.mark.slow
def test_sandbox_kept_etcd_whose_port_is_taken_says_so_and_fresh_starts(tmp_path: Path) -> None:
    import socket

    data = tmp_path / "sb"
    args = [*SCRIBA, "sandbox", "--data", str(data), "--bookies", "3"]
    first = subprocess.run([*args, "--detach"], capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    doc = _read_json(data / "sandbox.json")
    assert doc is not None
    port = int(doc["metadata_uri"].split("//")[1].split("/")[0].rsplit(":", 1)[1])
    stopped = subprocess.run([*SCRIBA, "sandbox", "--stop", "--data", str(data)], capture_output=True, text=True,
                             timeout=60)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    wait_until(lambda: not any(_alive(p) for p in [*_pids(doc), doc["pid"]]), 20, what="the first sandbox exiting", interval_s=0.05)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        refused = subprocess.run([*args, "--simple-test"], capture_output=True, text=True, timeout=120)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "ServerStartError" in refused.stderr and "--fresh" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
        fresh = subprocess.run([*args, "--fresh", "--simple-test"], capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr  # a fresh etcd takes free ports
    assert "simple-test PASSED" in fresh.stdout and "keeping the data" not in fresh.stdout


def test_sandbox_help_says_data_is_kept_and_fresh_wipes() -> None:
    done = subprocess.run([*SCRIBA, "sandbox", "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "--fresh" in text and "kept across a stop and start" in text and "wipe" in text


def test_sandbox_bad_options_and_stop_without_sandbox(tmp_path: Path) -> None:
    bad = subprocess.run([*SCRIBA, "sandbox", "--data", str(tmp_path / "x"), "--bookies", "0"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "--bookies" in bad.stderr and "Traceback" not in bad.stderr
    idle = subprocess.run([*SCRIBA, "sandbox", "--data", str(tmp_path / "y"), "--stop"],
                          capture_output=True, text=True, timeout=30)
    assert idle.returncode == 1 and "no sandbox is running" in idle.stdout
    external = subprocess.run([*SCRIBA, "sandbox", "--data", str(tmp_path / "z"), "--fresh",
                               "--metadata", "etcd://127.0.0.1:1/x"], capture_output=True, text=True, timeout=30)
    assert external.returncode == 1 and "--fresh with --metadata" in external.stderr
    assert "Traceback" not in external.stderr and not (tmp_path / "z").exists()


def test_launcher_children_ignore_a_shadowing_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test kit's launcher, used from a directory holding a ``scriba/`` folder, starts a
    bookie that imports the installed package and runs in its own dir (relative paths given
    to the launcher still mean the caller's directory)."""
    from scriba.testing.cluster import BookieCluster

    monkeypatch.chdir(shadowing_cwd(tmp_path))
    cluster = BookieCluster(Path("bookies"), "memory://launcher-shadow")
    try:
        bookie = cluster.add_bookie(timeout_s=60)
        assert bookie.pid is not None and bookie.serving()
        assert _cwd_of(bookie.pid) == (tmp_path / "work" / "bookies" / "bookie-0").resolve()
        assert bookie.data_dir.is_relative_to(tmp_path / "work" / "bookies")
        assert (bookie.data_dir / "COOKIE").is_file()
    finally:
        cluster.stop_all()


@pytest.mark.slow
def test_sandbox_autorecovery_re_replicates_a_killed_bookie_without_being_given_passwords(tmp_path: Path) -> None:
    """The sandbox's autorecovery process (auditor + worker) repairs a ledger written with a
    password it was never told (the ledger's metadata keeps it); ``--no-autorecovery`` starts none."""
    import asyncio

    from scriba.client import Client

    data = tmp_path / "sb"
    proc = _start(data, "--bookies", "4", "--no-console", "--autorecovery-delay-s", "0")
    try:
        wait_until(lambda: _read_json(data / "sandbox.json") is not None or proc.poll() is not None, START_TIMEOUT_S, what="sandbox.json", interval_s=0.05)
        doc = _read_json(data / "sandbox.json")
        assert doc is not None and doc["autorecovery"] is not None, doc
        uri = doc["metadata_uri"]
        ledger_id, payloads = asyncio.run(_write_ledger(uri, 50))

        async def ensemble() -> tuple[str, ...]:
            async with Client.connect(uri) as client:
                return tuple((await client.ledger_metadata(ledger_id)).current_ensemble)

        victim = asyncio.run(ensemble())[0]
        pid = next(b["pid"] for b in doc["bookies"] if b["bookie_id"] == victim)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: victim not in asyncio.run(ensemble()), 90, what=f"the ledger moved off {victim}", interval_s=0.05)
        assert asyncio.run(_read_ledger(uri, ledger_id)) == payloads
        out = _stop(proc, signal.SIGTERM)
        assert proc.returncode == 0, out
        assert "autorecovery: auditor + worker" in out
    finally:
        if proc.poll() is None:
            _kill(proc)
    wait_until(lambda: not _alive(doc["autorecovery"]["pid"]), 10, what="autorecovery exiting", interval_s=0.05)
    bare = _start(data, "--bookies", "3", "--no-console", "--no-autorecovery")
    try:
        wait_until(lambda: (_read_json(data / "sandbox.json") or {}).get("pid") == bare.pid or bare.poll() is not None, START_TIMEOUT_S, what="second sandbox.json", interval_s=0.05)
        assert (_read_json(data / "sandbox.json") or {}).get("autorecovery", "missing") is None
        assert _stop(bare, signal.SIGTERM) is not None and bare.returncode == 0
    finally:
        if bare.poll() is None:
            _kill(bare)
