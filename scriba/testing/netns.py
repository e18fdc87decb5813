"""Partitions between "hosts" on one machine: network namespaces joined by a router namespace.

Layout (root only; nothing is added to the root namespace):

    host a (10.77.1.2) --veth-- router (10.77.1.1 | 10.77.2.1) --veth-- host b (10.77.2.2)

Each host namespace has a default route through the router; the router forwards.
Addresses live only inside namespaces this lab creates, so they never leave the
machine and two labs never collide. Names carry the creating PID and a random
suffix (``scriba-<pid>-<hex>-<host>``), so :meth:`NetworkLab.close` removes
exactly what it made and :func:`remove_stale_namespaces` can clear what a killed
run left behind.

Faults: :meth:`NetworkLab.cut` drops traffic from one host to another, one way,
with a policy rule in the router: ``blackhole`` (silent drop — a connect times out),
``unreachable`` (the router answers ICMP unreachable — a connect fails fast with
ENETUNREACH or EHOSTUNREACH) or
``prohibit``. :meth:`heal` removes rules. Processes run inside a host's namespace
through ``ip netns exec`` and are stopped by their own PIDs when the lab closes.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

from scriba.embedded.process import ServerProcess
from scriba.errors import ScribaError
from scriba.invariant import invariant
from scriba.log import get_logger

log = get_logger(__name__)

CutMode = Literal["blackhole", "unreachable", "prohibit"]
CUT_MODES: tuple[CutMode, ...] = ("blackhole", "unreachable", "prohibit")
NAMESPACE_PREFIX = "scriba-"
HOSTS_MAX = 200
RULE_PREF_FIRST = 1000
IP_TIMEOUT_S = 10.0
_HOST_NAME = re.compile(r"^[a-z0-9][a-z0-9_]{0,15}$")


class NetnsUnavailableError(ScribaError):
    """Network namespaces cannot be used here (not root, or no ``ip netns``)."""


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here, or None if they can (tests skip with this text)."""
    if os.geteuid() != 0:
        return "network namespaces need root: run the partition tests as root"
    if shutil.which("ip") is None:
        return "`ip` from iproute2 is not installed (apt-get install iproute2)"
    try:
        probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns list` failed: {exc}"
    if probe.returncode != 0:
        return f"`ip netns` is unavailable: {probe.stderr.strip()}"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and done.returncode != 0:
        raise NetnsUnavailableError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def list_namespaces() -> list[str]:
    out = _ip("netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_stale_namespaces() -> list[str]:
    """Delete ``scriba-<pid>-...`` namespaces whose creating process is gone; returns their names."""
    removed = []
    for name in list_namespaces():
        match = re.match(rf"^{NAMESPACE_PREFIX}(\d+)-", name)
        if match is None or _pid_alive(int(match.group(1))):
            continue
        _ip("netns", "del", name, check=False)
        removed.append(name)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True, slots=True)
class Host:
    name: str
    namespace: str
    address: str  # this host's address (inside its namespace)
    gateway: str  # the router's address on this host's link
    index: int


@dataclass(frozen=True, slots=True)
class Cut:
    src: str
    dst: str
    mode: CutMode
    pref: int


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """The outcome of one TCP connect+echo attempt from inside a namespace."""

    result: Literal["ok", "timeout", "error"]
    elapsed_s: float
    errno: int | None = None
    data: str = ""


_PROBE_SCRIPT = r"""
import json, socket, sys, time
host, port, timeout, payload = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
start = time.monotonic()
try:
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(payload.encode())
        data = b""
        while len(data) < len(payload):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    out = {"result": "ok", "data": data.decode(errors="replace")}
except socket.timeout:
    out = {"result": "timeout"}
except OSError as exc:
    out = {"result": "error", "errno": exc.errno}
out["elapsed_s"] = time.monotonic() - start
print(json.dumps(out))
"""


class NetworkLab:
    """Host namespaces joined through one router namespace; a context manager that cleans up."""

    def __init__(self, hosts: Sequence[str], *, subnet_prefix: str = "10.77") -> None:
        invariant(0 < len(hosts) <= HOSTS_MAX, f"1..{HOSTS_MAX} hosts")
        invariant(len(set(hosts)) == len(hosts), "host names must be unique")
        for name in hosts:
            invariant(bool(_HOST_NAME.match(name)), f"host name {name!r}: lowercase letters, digits, _ (<= 16)")
        invariant(bool(re.fullmatch(r"\d{1,3}\.\d{1,3}", subnet_prefix)), "subnet_prefix like '10.77'")
        self.run_id = f"{os.getpid()}-{secrets.token_hex(3)}"
        self.router_namespace = f"{NAMESPACE_PREFIX}{self.run_id}-router"
        self.hosts: dict[str, Host] = {
            name: Host(name, f"{NAMESPACE_PREFIX}{self.run_id}-{name}", f"{subnet_prefix}.{i}.2",
                       f"{subnet_prefix}.{i}.1", i)
            for i, name in enumerate(hosts, start=1)
        }
        self._created: list[str] = []
        self._cuts: list[Cut] = []
        self._processes: list[ServerProcess] = []
        self._next_pref = RULE_PREF_FIRST

    # --- lifecycle ---
    def create(self) -> NetworkLab:
        reason = unavailable_reason()
        if reason is not None:
            raise NetnsUnavailableError(reason)
        try:
            self._add_namespace(self.router_namespace)
            self._exec(self.router_namespace, ["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"])
            for host in self.hosts.values():
                self._add_host(host)
        except BaseException:
            self.close()
            raise
        log.info("netns_lab_created", run_id=self.run_id, hosts=list(self.hosts))
        return self

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._created.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _add_host(self, host: Host) -> None:
        self._add_namespace(host.namespace)
        router_if = f"r{host.index}"
        _ip("link", "add", "eth0", "netns", host.namespace, "type", "veth",
            "peer", "name", router_if, "netns", self.router_namespace)
        _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", self.router_namespace, "addr", "add", f"{host.gateway}/24", "dev", router_if)
        _ip("-n", host.namespace, "link", "set", "eth0", "up")
        _ip("-n", self.router_namespace, "link", "set", router_if, "up")
        _ip("-n", host.namespace, "route", "add", "default", "via", host.gateway)

    def close(self) -> None:
        """Stop every process this lab started (by PID), then delete its namespaces."""
        errors = []
        for proc in reversed(self._processes):
            try:
                proc.stop(timeout_s=5.0)
            except Exception as exc:
                errors.append(f"{proc.name}: {exc}")
        self._processes.clear()
        for name in reversed(self._created):
            done = _ip("netns", "del", name, check=False)
            if done.returncode != 0:
                errors.append(f"netns del {name}: {done.stderr.strip()}")
        self._created.clear()
        self._cuts.clear()
        if errors:
            raise NetnsUnavailableError("cleanup failed: " + "; ".join(errors))

    def __enter__(self) -> NetworkLab:
        return self.create()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def namespaces(self) -> list[str]:
        return list(self._created)

    # --- running things inside a host ---
    def address(self, host: str) -> str:
        return self.hosts[host].address

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.hosts[host].namespace, *argv]

    def run(self, host: str, argv: Sequence[str], *, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a command to completion inside ``host`` (output captured, deadline enforced)."""
        return subprocess.run(self.exec_argv(host, argv), capture_output=True, text=True, timeout=timeout_s)

    def spawn(
        self, host: str, argv: Sequence[str], log_path: Path, *, env: Mapping[str, str] | None = None
    ) -> ServerProcess:
        """Start a long-running process inside ``host``; the lab stops it (by PID) on close."""
        proc = ServerProcess(f"{host}:{Path(argv[0]).name}", self.exec_argv(host, argv), log_path, env=env)
        proc.start()
        self._processes.append(proc)
        return proc

    def _exec(self, namespace: str, argv: Sequence[str]) -> None:
        done = subprocess.run(["ip", "netns", "exec", namespace, *argv], capture_output=True, text=True,
                              timeout=IP_TIMEOUT_S)
        if done.returncode != 0:
            raise NetnsUnavailableError(f"in {namespace}: {' '.join(argv)}: {done.stderr.strip()}")

    def tcp_probe(self, src: str, dst: str, port: int, *, timeout_s: float = 2.0, payload: str = "ping") -> ProbeResult:
        """From inside ``src``: connect to ``dst``:port, send ``payload``, read it back."""
        done = self.run(
            src, [sys.executable, "-c", _PROBE_SCRIPT, self.address(dst), str(port), str(timeout_s), payload],
            timeout_s=timeout_s + 30.0,
        )
        invariant(done.returncode == 0, f"probe failed to run: {done.stderr.strip()}")
        out = json.loads(done.stdout)
        return ProbeResult(out["result"], float(out["elapsed_s"]), out.get("errno"), out.get("data", ""))

    # --- faults ---
    def cut(self, src: str, dst: str, mode: CutMode = "blackhole") -> Cut:
        """Drop packets from ``src`` to ``dst`` at the router (one way)."""
        invariant(mode in CUT_MODES, f"mode must be one of {CUT_MODES}")
        invariant(src in self.hosts and dst in self.hosts and src != dst, f"bad hosts {src!r} -> {dst!r}")
        pref = self._next_pref
        self._next_pref += 1
        _ip("-n", self.router_namespace, "rule", "add", "from", self.address(src), "to", self.address(dst),
            mode, "pref", str(pref))
        cut = Cut(src, dst, mode, pref)
        self._cuts.append(cut)
        log.info("netns_cut", src=src, dst=dst, mode=mode)
        return cut

    def partition(self, a: str, b: str, mode: CutMode = "blackhole") -> None:
        """Cut both ways between ``a`` and ``b``."""
        self.cut(a, b, mode)
        self.cut(b, a, mode)

    def heal(self, src: str | None = None, dst: str | None = None) -> int:
        """Remove the cuts matching ``src``/``dst`` (None matches any); returns how many."""
        removed = 0
        for cut in list(self._cuts):
            if (src is None or cut.src == src) and (dst is None or cut.dst == dst):
                _ip("-n", self.router_namespace, "rule", "del", "pref", str(cut.pref))
                self._cuts.remove(cut)
                removed += 1
        log.info("netns_healed", src=src, dst=dst, rules=removed)
        return removed

    @property
    def cuts(self) -> list[Cut]:
        return list(self._cuts)


__all__ = [
    "CUT_MODES",
    "Cut",
    "Host",
    "NetnsUnavailableError",
    "NetworkLab",
    "ProbeResult",
    "list_namespaces",
    "remove_stale_namespaces",
    "unavailable_reason",
]
