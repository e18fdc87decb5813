"""Partitions between network namespaces (root only): a TCP echo across the router, cut and healed."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scriba.embedded.process import wait_until
from scriba.testing import netns, tmpfs
from scriba.testing.netns import (
    NetworkLab,
    list_namespaces,
    remove_stale_namespaces,
    unavailable_reason,
)

REASON = unavailable_reason()
needs_netns = pytest.mark.skipif(REASON is not None, reason=REASON or "")

ECHO_PORT = 7000  # inside the lab's own namespace: no clash with anything else
ECHO_SERVER = r"""
import socket, sys, threading
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
def echo(conn):
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=echo, args=(conn,), daemon=True).start()
"""


@needs_netns
def test_netns_blackhole_unreachable_heal_and_cleanup(tmp_path: Path) -> None:
    lab = NetworkLab(["a", "b"])
    with lab:
        namespaces = lab.namespaces
        assert len(namespaces) == 3 and set(namespaces) <= set(list_namespaces())
        echo = lab.spawn("b", [sys.executable, "-c", ECHO_SERVER, lab.address("b"), str(ECHO_PORT)],
                         tmp_path / "echo.log")
        wait_until(lambda: lab.tcp_probe("a", "b", ECHO_PORT, timeout_s=1.0).result == "ok", 20.0,
                   interval_s=0.1, what="echo server reachable across the router")
        ok = lab.tcp_probe("a", "b", ECHO_PORT, payload="across")
        assert ok.result == "ok" and ok.data == "across"

        lab.cut("a", "b", "blackhole")  # silent: the connect just times out
        silent = lab.tcp_probe("a", "b", ECHO_PORT, timeout_s=1.0)
        assert silent.result == "timeout" and 0.9 <= silent.elapsed_s < 5.0
        assert lab.heal("a", "b") == 1
        assert lab.tcp_probe("a", "b", ECHO_PORT).result == "ok"

        lab.cut("a", "b", "unreachable")  # the router answers: the connect fails fast
        fast = lab.tcp_probe("a", "b", ECHO_PORT, timeout_s=5.0)
        assert fast.result == "error" and fast.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH), fast
        assert fast.elapsed_s < 1.0

        lab.heal()
        assert lab.cuts == []
        assert lab.tcp_probe("a", "b", ECHO_PORT).result == "ok"

        # one way: b -> a blocked stops replies too, so a's connect to b times out as well
        lab.cut("b", "a", "blackhole")
        assert lab.tcp_probe("a", "b", ECHO_PORT, timeout_s=1.0).result == "timeout"
        lab.heal()
        echo_pid = echo.pid
    assert echo_pid is not None and not echo.running
    left = set(list_namespaces())
    assert not left & set(namespaces)
    assert not any(lab.run_id in name for name in left)


@needs_netns
def test_netns_partition_isolates_only_the_named_pair(tmp_path: Path) -> None:
    with NetworkLab(["a", "b", "c"]) as lab:
        for host in ("b", "c"):
            lab.spawn(host, [sys.executable, "-c", ECHO_SERVER, lab.address(host), str(ECHO_PORT)],
                      tmp_path / f"echo-{host}.log")
        for host in ("b", "c"):
            wait_until(lambda h=host: lab.tcp_probe("a", h, ECHO_PORT, timeout_s=1.0).result == "ok", 20.0,
                       interval_s=0.1, what=f"echo on {host}")
        lab.partition("a", "b", "unreachable")
        assert lab.tcp_probe("a", "b", ECHO_PORT).result == "error"
        assert lab.tcp_probe("a", "c", ECHO_PORT).result == "ok"
        assert lab.tcp_probe("c", "b", ECHO_PORT).result == "ok"
        assert len(lab.cuts) == 2


@needs_netns
def test_netns_remove_stale_namespaces_only_of_dead_runs() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(10)
    stale = f"scriba-{dead.pid}-abcdef-router"
    live = f"scriba-{os.getpid()}-fedcba-router"
    for name in (stale, live):
        subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
    try:
        removed = remove_stale_namespaces()
        assert stale in removed and live not in removed
        assert stale not in list_namespaces() and live in list_namespaces()
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


def test_netns_and_tmpfs_say_why_when_not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(tmpfs.os, "geteuid", lambda: 1000)
    reason = netns.unavailable_reason()
    assert reason is not None and "root" in reason
    assert "root" in (tmpfs.unavailable_reason() or "")
    with pytest.raises(netns.NetnsUnavailableError, match="root"):
        NetworkLab(["a"]).create()
    with pytest.raises(tmpfs.TmpfsUnavailableError, match="root"), tmpfs.size_capped_tmpfs(4096):
        pass
