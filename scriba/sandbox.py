"""``scriba sandbox``: a whole Scriba cluster on this machine, for trying things out.

Starts a real etcd (one member, unless ``--metadata`` names an existing store) and
N bookie *processes* spread over zones ``zone-a``, ``zone-b``, ... of one region
(``--regions R --zones-per-region Z``: over ``region-1`` .. ``region-R``, Z zones each,
round-robin over the regions first; the default bookie count is then one per zone;
``--inter-region-latency-ms MS`` puts MS of latency each way between clients, taken to
run in ``region-1``, and every other region's bookies, through the fault proxy:
:mod:`scriba.embedded.fault_proxy`),
starts the web console (``scriba console``, as a process; ``--no-console`` skips it,
``--console-allow-actions`` starts it with ``--allow-actions``)
and an autorecovery process (``scriba autorecovery run``: the elected auditor and one
replication worker, as BookKeeper's standalone runs autorecovery beside its bookies;
``--autorecovery-delay-s`` sets how long a bookie may be gone before its ledgers are
re-replicated, ``--no-autorecovery`` skips it); with ``--with kv`` three replicas of the
KV store example (etcd's v3 API, one per zone, ``scriba.embedded.kvstore``; their
``--endpoints`` line for etcdctl is printed), with ``--with namenode`` the namenode
example's three replicas (:mod:`scriba.embedded.namenode`); under ``--tls`` both serve
mutual TLS with the sandbox's server certificate and dial the bookies with it, and the
printed etcdctl line carries the client certificate (``--cacert --cert --key``); writes ``DIR/sandbox.json``
(metadata URI; per bookie: id, address, zone, data dir, PID; the console's URL, PID and
whether it allows actions;
the autorecovery process's id and PID; the KV replicas and the namenodes), prints the
URI, the console's URL and the next step, and runs until Ctrl-C / SIGTERM. Then it
stops everything it started, by PID, and waits for each exit.

States: LOCKING -> STARTING -> RUNNING -> STOPPING -> (exit). ``DIR/sandbox.lock``
is held (``flock``) from LOCKING to exit and names the sandbox's PID, so a second
sandbox on the same dir refuses with a clear message; the kernel drops the lock if
the process dies.

Data survives a stop and start, as a development server's should (Pulsar
standalone's and etcd's do): a sandbox on a DIR used before restarts its etcd from
``DIR/etcd`` (same ports, same data) and bookie ``bookie-N`` from ``DIR/bookie-N``
(same id, data, journal and cookie; new ports, which clients learn from its
registration), so every ledger written before can be read after. ``--fresh`` wipes
the ``etcd`` and ``bookie-*`` dirs first. With ``--metadata`` the store is the
user's: the bookies' dirs are always kept (the store holds their cookies, and a
wiped bookie would be refused), and ``--fresh`` is refused.

``--detach`` runs the same sandbox in the background (log in ``DIR/sandbox.log``)
and returns once it serves; ``--stop`` ends a detached one. ``--simple-test`` runs
``scriba shell simple-test`` against the sandbox and exits with its result. Every
child runs in its own directory under DIR and is started so that the caller's
working directory cannot shadow the installed package
(:func:`~scriba.embedded.process.python_module_argv`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from scriba.autorecovery.config import LOST_BOOKIE_RECOVERY_DELAY_S as AUTORECOVERY_DELAY_S
from scriba.embedded.process import ServerStartError
from scriba.embedded.sandbox_children import (
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    start_autorecovery,
    start_console,
    stop_child,
)
from scriba.errors import ConfigError, ScribaError
from scriba.log import get_logger
from scriba.shell import SANDBOX_DIR_DEFAULT, SANDBOX_FILE

log = get_logger(__name__)

DEFAULT_DATA_DIR = SANDBOX_DIR_DEFAULT
LOCK_FILE = "sandbox.lock"
LOG_FILE = "sandbox.log"
BOOKIES_DEFAULT = 4
BOOKIES_MAX = 32
ZONES_MAX = 26
REGIONS_MAX = 9
DETACH_TIMEOUT_S = 90.0
SERVICES = ("kv", "namenode")
KV_REPLICAS = 3
KV_SESSION_TIMEOUT_S = 10.0  # a busy laptop must not lose the replicas' metadata sessions


class SandboxBusyError(ScribaError):
    """Another sandbox holds the data dir."""


class Stop(BaseException):
    """Raised in the main thread by SIGINT/SIGTERM to unwind into the cleanup."""


@dataclass(frozen=True, slots=True)
class SandboxOptions:
    data_dir: Path
    bookies: int = BOOKIES_DEFAULT
    zones: int = 3  # per region
    regions: int = 1
    metadata: str | None = None
    fresh: bool = False  # wipe the etcd and bookie dirs a previous sandbox left
    console: str | None = "127.0.0.1:0"  # the web console's HOST:PORT (port 0: any free one); None: none
    console_allow_actions: bool = False  # the console's --allow-actions (each action confirmed; admin under --tls)
    autorecovery_delay_s: float | None = AUTORECOVERY_DELAY_S  # lost-bookie delay; None: no autorecovery
    tls: bool = False  # mutual TLS everywhere, with a throwaway CA (scriba.sandbox_tls)
    inter_region_latency_ms: int = 0  # > 0: other regions' bookies behind a latency proxy
    services: tuple[str, ...] = ()  # examples to start on top (``--with``): "kv", "namenode"

    def validate(self) -> None:
        if not 1 <= self.bookies <= BOOKIES_MAX:
            raise ConfigError(f"--bookies: {self.bookies} is not in 1..{BOOKIES_MAX}")
        if not 1 <= self.zones <= ZONES_MAX:
            raise ConfigError(f"--zones: {self.zones} is not in 1..{ZONES_MAX}")
        if not 1 <= self.regions <= REGIONS_MAX:
            raise ConfigError(f"--regions: {self.regions} is not in 1..{REGIONS_MAX}")
        if self.autorecovery_delay_s is not None and self.autorecovery_delay_s < 0:
            raise ConfigError(f"--autorecovery-delay-s: {self.autorecovery_delay_s} is below 0")
        if self.inter_region_latency_ms < 0:
            raise ConfigError(f"--inter-region-latency-ms: {self.inter_region_latency_ms} must be >= 0")
        if self.inter_region_latency_ms > 0 and self.regions < 2:
            raise ConfigError("--inter-region-latency-ms needs --regions 2 or more (latency is between regions)")
        unknown = sorted(set(self.services) - set(SERVICES))
        if unknown:
            raise ConfigError(f"--with {', '.join(unknown)}: known services are {', '.join(SERVICES)}")
        if self.fresh and self.metadata:
            raise ConfigError(
                "--fresh with --metadata: the store keeps the bookies' cookies and ledgers, so wiping "
                "only the bookies' dirs would leave a broken cluster; wipe the store yourself, "
                "or use another --data dir"
            )
        if self.console_allow_actions and not self.console:
            raise ConfigError("--console-allow-actions with --no-console: there is no console to act from")
        if self.tls and self.metadata:
            raise ConfigError("--tls with --metadata: the sandbox makes its own CA for the etcd it starts; "
                              "secure your own store and pass its etcd+tls:// URI without --tls")


    def location(self, index: int) -> tuple[str, str]:
        """Bookie ``index``'s (region, zone): round-robin over regions first, then their zones,
        so any ``regions * zones`` consecutive bookies fill every zone of every region once."""
        slot = index % (self.regions * self.zones)
        return region_name(slot % self.regions), zone_name((slot // self.regions) % self.zones)


def zone_name(index: int) -> str:
    return f"zone-{chr(ord('a') + index)}"


def region_name(index: int) -> str:
    return f"region-{index + 1}"


def default_data_dir() -> Path:
    return Path.cwd() / DEFAULT_DATA_DIR


def read_sandbox_file(data_dir: Path) -> dict[str, Any]:
    """The running sandbox's description; ConfigError if there is none."""
    path = data_dir / SANDBOX_FILE
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no sandbox is running in {data_dir} (no {SANDBOX_FILE}); start one with `scriba sandbox`") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    return doc


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SandboxLock:
    """``DIR/sandbox.lock``: an ``flock`` held for the sandbox's life, holding its PID."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise SandboxBusyError(
                f"a sandbox (pid {holder}) is already running on {self.path.parent}; "
                f"stop it (Ctrl-C, or `scriba sandbox --stop --data {self.path.parent}`) or use another --data dir"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._file = f

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    @staticmethod
    def holder(data_dir: Path) -> int | None:
        """The PID of the live sandbox holding ``data_dir``, if any."""
        path = data_dir / LOCK_FILE
        try:
            with open(path) as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    text = f.read().strip()
                    return int(text) if text.isdigit() else None
                fcntl.flock(f, fcntl.LOCK_UN)
                return None
        except FileNotFoundError:
            return None


class Sandbox:
    """Starts and stops the sandbox's processes (see the module docstring)."""

    def __init__(self, options: SandboxOptions) -> None:
        options.validate()
        self.options = options
        self.data_dir = options.data_dir
        self.etcd: Any = None
        self.bookies: list[Any] = []
        self.console: tuple[subprocess.Popen[bytes], str] | None = None  # (process, URL)
        self.autorecovery: tuple[subprocess.Popen[bytes], str] | None = None  # (process, its id)
        self.namenodes: list[Any] = []  # scriba.embedded.namenode.NamenodeChild
        self.kv: Any = None  # a scriba.embedded.kvstore.KvCluster with --with kv
        self.metadata_uri = options.metadata or ""
        self.pki: Any = None  # SandboxPki with --tls
        self.latency: Any = None  # RegionLatency with --inter-region-latency-ms

    def _reap_orphans(self) -> None:
        """Kill what a SIGKILLed sandbox left running on this dir (PIDs from its sandbox.json
        whose command line or working directory names this dir, so never anything else)."""
        try:
            doc = json.loads((self.data_dir / SANDBOX_FILE).read_text())
        except (OSError, ValueError):
            return
        pids = [b.get("pid") for b in doc.get("bookies", [])] + list((doc.get("etcd") or {}).get("pids", []))
        pids.append((doc.get("console") or {}).get("pid"))  # runs in DIR (its cwd), not named in its argv
        pids.append((doc.get("autorecovery") or {}).get("pid"))  # likewise
        pids.append((doc.get("region_latency") or {}).get("pid"))
        pids += [n.get("pid") for n in doc.get("namenodes", [])]  # run in DIR/namenode-* (their cwd)
        pids += [r.get("pid") for r in doc.get("kv") or []]  # run in DIR/kv
        for pid in pids:
            if not isinstance(pid, int) or not pid_alive(pid):
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            with contextlib.suppress(OSError):
                cmdline += " " + os.readlink(f"/proc/{pid}/cwd")
            if str(self.data_dir) in cmdline:
                log.warning("sandbox_orphan_killed", pid=pid)
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while pid_alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.05)

    def _prepare_data_dir(self) -> bool:
        """Reap a killed sandbox's orphans, drop its stale description, wipe with ``--fresh``.

        True when data of an earlier sandbox is kept (the etcd dir or a bookie dir exists).
        """
        self._reap_orphans()
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / SANDBOX_FILE).unlink()
        previous = [c for c in self.data_dir.iterdir()
                    if c.is_dir() and (c.name == "etcd" or c.name.startswith("bookie-"))]
        if self.options.fresh:  # validate() refused --fresh with an external store
            for child in previous:
                shutil.rmtree(child)
            return False
        return bool(previous)

    def start(self, out: IO[str]) -> None:
        from scriba.embedded.bookie import BookieProcess

        kept = self._prepare_data_dir()
        if kept:
            print(f"keeping the data in {self.data_dir} (ledgers written before stay; --fresh wipes it)",
                  file=out, flush=True)
        if self.options.tls:
            from scriba.sandbox_tls import SandboxPki

            self.pki = SandboxPki.create(self.data_dir / "tls")
            print(f"mutual TLS everywhere: a throwaway CA and certificates in {self.data_dir / 'tls'}",
                  file=out, flush=True)
        server_tls = self.pki.server_tls() if self.pki is not None else None
        if not self.options.metadata:
            from scriba.embedded.etcd import EtcdCluster

            print(f"starting etcd in {self.data_dir / 'etcd'} ...", file=out, flush=True)
            self.etcd = EtcdCluster(self.data_dir / "etcd", 1, tls=server_tls)
            try:
                self.etcd.start(timeout_s=START_TIMEOUT_S)
            except ServerStartError as exc:
                if not kept:
                    raise
                raise ServerStartError(f"{exc}\n(the kept etcd restarts on the ports it had; if another "
                                       f"program holds one now, stop it or start with --fresh)") from None
            self.metadata_uri = (self.etcd.uri("scriba") if self.pki is None else
                                 self.etcd.uri("scriba", cert=str(self.pki.client.cert), key=str(self.pki.client.key)))
        n, places = self.options.bookies, self.options.regions * self.options.zones
        print(f"starting {n} bookies over {min(n, places)} zones ...", file=out, flush=True)
        latency_ms = self.options.inter_region_latency_ms
        if latency_ms > 0:
            from scriba.embedded.fault_proxy import RegionLatency

            self.latency = RegionLatency(latency_ms, self.data_dir / "faults-proxy.log")
            url = self.latency.start()
            print(f"inter-region latency {latency_ms} ms each way through the fault proxy {url}",
                  file=out, flush=True)
        for i in range(n):
            region, zone = self.options.location(i)
            remote = self.latency is not None and region != region_name(0)
            self.bookies.append(
                BookieProcess(
                    self.data_dir / f"bookie-{i + 1}",
                    self.metadata_uri,
                    bookie_id=self.bookie_id(i),
                    region=region,
                    zone=zone,
                    rack=f"rack-{i + 1}",
                    tls=server_tls,
                    extra_args=self.latency.advertise_args(remote) if self.latency is not None else (),
                )
            )
            if remote:
                self.latency.add_bookie(self.bookies[-1].bookie_id, self.bookies[-1].port,
                                        self.bookies[-1].binary_port)
        with ThreadPoolExecutor(max_workers=min(8, n)) as pool:
            futures = [pool.submit(b.start, START_TIMEOUT_S) for b in self.bookies]
            for f in futures:
                f.result()
        if self.options.console:
            from scriba.embedded.bookie import tls_argv

            tls_args = tls_argv(self.pki.server_tls(self.pki.admin)) if self.pki is not None else []
            self.console = start_console(self.metadata_uri, self.options.console, self.data_dir, tls_args,
                                         allow_actions=self.options.console_allow_actions)
        if self.options.autorecovery_delay_s is not None:
            from scriba.embedded.bookie import tls_argv

            # the operator's certificate: it reads every ledger and adds recovery copies
            tls_args = tls_argv(self.pki.client_tls(self.pki.admin)) if self.pki is not None else []
            self.autorecovery = start_autorecovery(self.metadata_uri, self.options.autorecovery_delay_s,
                                                   self.data_dir, tls_args)
        if "namenode" in self.options.services:
            from scriba.embedded.namenode import start_namenodes

            print("starting the namenode example (active + 2 standbys) ...", file=out, flush=True)
            zones = sorted({self.options.location(i)[1] for i in range(max(n, places))})
            self.namenodes = start_namenodes(
                self.metadata_uri, self.data_dir, zones, START_TIMEOUT_S, tls_args=self._server_tls_args(),
                context=self.pki.client_tls().load().client_ssl_context() if self.pki is not None else None)
        if "kv" in self.options.services:
            from scriba.embedded.kvstore import KvCluster

            print(f"starting {KV_REPLICAS} KV store replicas (etcd v3 API) ...", file=out, flush=True)
            zones = sorted({self.options.location(i)[1] for i in range(len(self.bookies))})
            self.kv = KvCluster(self.metadata_uri, self.data_dir / "kv", replicas=KV_REPLICAS, zones=zones,
                                session_timeout_s=KV_SESSION_TIMEOUT_S, extra_args=self._server_tls_args())
            self.kv.start_all(attempts=3)
        self.write_sandbox_file()

    def _server_tls_args(self) -> list[str]:
        """The ``--tls-*`` flags of the examples' replicas under ``--tls`` (none without): the
        server certificate serves their ports and dials the bookies (as the bookie identity)."""
        from scriba.embedded.bookie import tls_argv

        return tls_argv(self.pki.server_tls()) if self.pki is not None else []

    def bookie_id(self, index: int) -> str:
        """``bookie-N``; on an external store also unique to this data dir (ids are cluster-wide)."""
        if not self.options.metadata:
            return f"bookie-{index + 1}"
        tag = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:6]
        return f"sandbox-{tag}-bookie-{index + 1}"

    def describe(self) -> dict[str, Any]:
        etcd: dict[str, Any] | None = None
        if self.etcd is not None:
            etcd = {
                "pids": [m.pid for m in self.etcd.members],
                "data_dir": str(self.data_dir / "etcd"),
                "endpoints": [f"{h}:{p}" for h, p in self.etcd.endpoints],
            }
        return {
            "metadata_uri": self.metadata_uri,
            "pid": os.getpid(),
            "started_at": time.time(),
            "regions": sorted({self.options.location(i)[0] for i in range(len(self.bookies))}),
            "etcd": etcd,
            "console": None if self.console is None else {"url": self.console[1], "pid": self.console[0].pid,
                                                          "actions": self.options.console_allow_actions},
            "autorecovery": None if self.autorecovery is None else {
                "id": self.autorecovery[1], "pid": self.autorecovery[0].pid,
                "delay_s": self.options.autorecovery_delay_s,
            },
            "kv": None if self.kv is None else [
                {"replica_id": r.replica_id, "endpoint": r.endpoint, "zone": r.zone,
                 "pid": r.proc.pid if r.proc is not None else None}
                for r in self.kv.replicas
            ],
            **(self.pki.describe() if self.pki is not None else {}),
            "region_latency": None if self.latency is None else self.latency.describe(),
            **({"namenodes": describe_namenodes(self.namenodes)} if self.namenodes else {}),
            "bookies": [
                {
                    "bookie_id": b.bookie_id,
                    "address": b.address,
                    "region": self.options.location(i)[0],
                    "zone": self.options.location(i)[1],
                    "data_dir": str(b.data_dir),
                    "journal_dir": str(b.journal_dir),
                    "log": str(b.log_path),
                    "pid": b.pid,
                }
                for i, b in enumerate(self.bookies)
            ],
        }

    def write_sandbox_file(self) -> None:
        path = self.data_dir / SANDBOX_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.describe(), indent=2) + "\n")
        tmp.replace(path)

    def stop(self) -> None:
        """Stop every process this sandbox started (bookies first, then etcd), waiting for each."""
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / SANDBOX_FILE).unlink()
        for child in (self.autorecovery, self.console):  # before the bookies: none of them is "lost"
            if child is not None:
                stop_child(child[0])
        if self.namenodes:
            from scriba.embedded.namenode import stop_namenodes

            stop_namenodes(self.namenodes, STOP_TIMEOUT_S)
        if self.kv is not None:
            _stop_quietly(self.kv)
        if self.bookies:
            with ThreadPoolExecutor(max_workers=min(8, len(self.bookies))) as pool:
                for f in [pool.submit(_stop_quietly, b) for b in self.bookies]:
                    f.result()
        if self.etcd is not None:
            _stop_quietly(self.etcd)
        if self.latency is not None:
            _stop_quietly(self.latency)

    def dead_bookies(self) -> list[str]:
        return [b.bookie_id for b in self.bookies if getattr(b, "pid", None) is not None and not _running(b)]


def _running(process: Any) -> bool:
    running = getattr(process, "running", None)
    if isinstance(running, bool):
        return running
    pid = getattr(process, "pid", None)
    return pid is not None and pid_alive(pid)


def describe_namenodes(children: list[Any]) -> list[dict[str, Any]]:
    from scriba.embedded.namenode import describe

    return describe(children)


def _stop_quietly(process: Any) -> None:
    try:
        process.stop()
    except Exception as exc:  # keep stopping the others
        log.warning("sandbox_stop_failed", what=repr(process), error=repr(exc))
