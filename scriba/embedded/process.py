"""Child server processes Scriba starts itself (etcd, ZooKeeper, bookies).

One :class:`ServerProcess` per child: its own log file and PID, readiness waited
for with a deadline, stopped only by its own PID (and waited for, so its data dir
can be reused at once). Used by the sandbox and by ``scriba.testing.cluster``.

A child never runs in the caller's working directory: it gets its own (the directory
of its log, which is its data dir, unless told otherwise), and Python children start
with :func:`python_module_argv` (``python -P -m ...``), which puts neither the working
directory nor any script's directory on ``sys.path``. So a folder named ``scriba``
where the user happens to stand cannot shadow the installed package.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from scriba.errors import ScribaError


class ServerStartError(ScribaError):
    """A child server did not become ready; the message names its log file."""


def python_module_argv(module: str, *args: str) -> list[str]:
    """``python -P -m MODULE ARGS...`` with this interpreter (``-P``: no unsafe sys.path entry)."""
    return [sys.executable, "-P", "-m", module, *args]


_LISTEN_PORT_MIN = 10_000  # listening ports are picked from here up to the ephemeral range


def _ephemeral_port_min() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


# Ports this process handed out lately, and when: a port is not handed out again while a
# child it was meant for may still be on its way to binding it (a caller often picks the
# ports of several children before starting any of them, and each call binds only its own).
_HANDED_OUT_FOR_S = 600.0
_handed_out: dict[int, float] = {}
_handed_out_lock = threading.Lock()


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that were free a moment ago (all bound at once, then released),
    none of them handed out by this process in the last ten minutes.

    They are drawn at random *below* the kernel's ephemeral range: a port from bind(0)
    lies inside it, where any outgoing connection (a client's gRPC channel, say) may take
    it as its local port before the child that was meant to listen there binds it."""
    high = _ephemeral_port_min()
    low = min(_LISTEN_PORT_MIN, high // 2)
    rng = random.SystemRandom()
    socks: list[socket.socket] = []
    with _handed_out_lock:
        now = time.monotonic()
        for port in [p for p, at in _handed_out.items() if now - at > _HANDED_OUT_FOR_S]:
            del _handed_out[port]
        try:
            for _ in range(64 * count):
                if len(socks) == count:
                    break
                port = rng.randrange(low, high)
                if port in _handed_out:
                    continue
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    s.bind((host, port))
                except OSError:
                    s.close()
                    continue
                socks.append(s)
            if len(socks) < count:
                raise ServerStartError(f"no {count} free ports on {host} in {low}..{high - 1}")
            ports = [int(s.getsockname()[1]) for s in socks]
            _handed_out.update((port, now) for port in ports)
            return ports
        finally:
            for s in socks:
                s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (see :func:`free_ports`)."""
    return free_ports(1, host)[0]


def port_open(host: str, port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_until(
    condition: Callable[[], bool], timeout_s: float, *, interval_s: float = 0.02, what: str = "condition"
) -> None:
    """Poll ``condition`` until it holds or ``timeout_s`` passes (then ``TimeoutError``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} did not hold within {timeout_s:.1f}s")
        time.sleep(interval_s)


# Children left running on purpose (``ServerProcess.detach``), their handles kept for the
# life of this process so that collecting them does not warn "subprocess ... is still running".
_DETACHED: list[subprocess.Popen[bytes]] = []


class ServerProcess:
    """One child process with a log file, started and stopped by PID."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd  # None: the log's directory (never the caller's working directory)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def start(self) -> None:
        if self.running:
            raise ServerStartError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **(self.env or {})}
        cwd = self.cwd if self.cwd is not None else self.log_path.parent.absolute()
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
                start_new_session=True,  # a Ctrl-C to the parent does not hit children first
            )

    def detach(self) -> None:
        """Leave the child running past this object (a detached server, stopped later by the
        PID its caller recorded); this object no longer knows it."""
        if self._proc is not None:
            _DETACHED.append(self._proc)
            self._proc = None

    def wait_ready(self, ready: Callable[[], bool], timeout_s: float) -> None:
        """Wait for ``ready()``; fail early (with the log's tail) if the process exits."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.running:
                raise ServerStartError(
                    f"{self.name} exited with {self.returncode} before it was ready; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if ready():
                return
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"{self.name} not ready within {timeout_s:.1f}s; log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.02)

    def signal(self, sig: int) -> None:
        if self.running and self._proc is not None:
            os.kill(self._proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL and wait for the exit."""
        self.signal(signal.SIGKILL)
        self.wait_exit(10.0)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (after SIGCONT, in case it was paused); SIGKILL after ``timeout_s``."""
        if not self.running:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.wait_exit(timeout_s)
        except TimeoutError:
            self.kill()

    def wait_exit(self, timeout_s: float) -> int:
        if self._proc is None:
            return 0
        try:
            return self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{self.name} (pid {self._proc.pid}) did not exit in {timeout_s}s") from None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
