"""The fault proxy as a process of its own and as ``scriba faults-proxy``: started,
reached through its URL, stopped by SIGTERM or SIGINT with exit status 0, and the
URL helper falling back to the built-in proxy (``fault_proxy_site.py``).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_proxy_site import EchoServer, connect, recv_until_eof, round_trip_s

from scriba.testing.faults import ToxiproxyProcess, is_builtin, toxiproxy_client, toxiproxy_url


def test_faults_proxy_as_a_process(tmp_path: Path, echo: EchoServer) -> None:
    with ToxiproxyProcess(tmp_path / "proxy.log") as proc:
        tp = toxiproxy_client(proc.url)
        proxy = tp.create(upstream=echo.address, name="echo")
        proxy.add_toxic(type="latency", attributes={"latency": 100})
        with connect(proxy.listen) as sock:
            assert round_trip_s(sock) >= 0.1
        pid = proc.process.pid
    assert pid is not None and not proc.process.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_faults_toxiproxy_url_falls_back_to_builtin(monkeypatch: pytest.MonkeyPatch, echo: EchoServer) -> None:
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with toxiproxy_url() as url:
        assert is_builtin(url)
        proxy = toxiproxy_client(url).create(upstream=echo.address, name="echo")
        with connect(proxy.listen) as sock:
            assert round_trip_s(sock) < 1.0
    monkeypatch.setenv("TOXIPROXY_URL", "http://127.0.0.1:1/")
    with toxiproxy_url() as url:
        assert url == "http://127.0.0.1:1"


def test_faults_process_stops_gracefully_on_sigterm(tmp_path: Path, echo: EchoServer) -> None:
    proc = ToxiproxyProcess(tmp_path / "proxy.log")
    proc.start()
    tp = toxiproxy_client(proc.url)
    proxy = tp.create(upstream=echo.address, name="echo")
    live = connect(proxy.listen)
    try:
        assert round_trip_s(live) < 1.0
        proc.stop()  # SIGTERM; SIGKILL only after a timeout
        assert proc.process.returncode == 0, proc.process.log_tail()
        try:
            assert recv_until_eof(live) == b""
        except ConnectionResetError:
            pass
    finally:
        live.close()


def test_faults_cli_registers_faults_proxy() -> None:
    from scriba.cli import build_parser
    from scriba.testing import faults_cli

    args = build_parser().parse_args(["faults-proxy", "--listen", "127.0.0.1:0", "--seed", "3"])
    assert args.func is faults_cli.run
    assert args.listen == "127.0.0.1:0" and args.seed == 3


def test_faults_cli_foreground_prints_url_and_stops_on_sigint(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "scriba.cli", "faults-proxy", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
    )
    try:
        url = ""
        deadline = time.monotonic() + 20
        while not url and time.monotonic() < deadline:
            readable, _, _ = select.select([proc.stdout], [], [], 0.5)
            line = proc.stdout.readline() if readable and proc.stdout else ""
            if line.startswith("listening on "):
                url = line.split()[-1]
            assert proc.poll() is None, "faults-proxy exited early"
        assert url.startswith("http://127.0.0.1:")
        assert is_builtin(url)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
