"""``scriba sandbox``: a whole Scriba cluster on this machine, for trying things out.

Starts a real etcd (one member, unless ``--metadata`` names an existing store) and
N bookie *processes* spread over zones ``zone-a``, ``zone-b``, ... of one region
(``--regions R --zones-per-region Z``: over ``region-1`` .. ``region-R``, Z zones each,
round-robin over the regions first; the default bookie count is then one per zone;
``--inter-region-latency-ms MS`` puts MS of latency each way between clients, taken to
run in ``region-1``, and every other region's bookies, through the fault proxy:
:mod:`scriba.embedded.fault_proxy`),
starts the web console (``scriba console``, as a process; ``--no-console`` skips it)
and an autorecovery process (``scriba autorecovery run``: the elected auditor and one
replication worker, as BookKeeper's standalone runs autorecovery beside its bookies;
``--autorecovery-delay-s`` sets how long a bookie may be gone before its ledgers are
re-replicated, ``--no-autorecovery`` skips it); with ``--with kv`` three replicas of the
KV store example (etcd's v3 API, one per zone, ``scriba.embedded.kvstore``; their
``--endpoints`` line for etcdctl is printed), with ``--with namenode`` the namenode
example's three replicas (:mod:`scriba.embedded.namenode`); writes ``DIR/sandbox.json``
(metadata URI; per bookie: id, address, zone, data dir, PID; the console's URL and PID;
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

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

from scriba.autorecovery.config import LOST_BOOKIE_RECOVERY_DELAY_S as AUTORECOVERY_DELAY_S
from scriba.embedded.process import ServerStartError, python_module_argv
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


class _Stop(BaseException):
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
        if self.services and self.tls:
            raise ConfigError(f"--with {' and '.join(self.services)} and --tls: the examples do not take the "
                              "sandbox's certificates yet; start one of the two")
        if self.fresh and self.metadata:
            raise ConfigError(
                "--fresh with --metadata: the store keeps the bookies' cookies and ledgers, so wiping "
                "only the bookies' dirs would leave a broken cluster; wipe the store yourself, "
                "or use another --data dir"
            )
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


def _pid_alive(pid: int) -> bool:
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
            if not isinstance(pid, int) or not _pid_alive(pid):
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
                while _pid_alive(pid) and time.monotonic() < deadline:
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
                self.latency.add_bookie(self.bookies[-1].bookie_id, self.bookies[-1].port)
        with ThreadPoolExecutor(max_workers=min(8, n)) as pool:
            futures = [pool.submit(b.start, START_TIMEOUT_S) for b in self.bookies]
            for f in futures:
                f.result()
        if self.options.console:
            from scriba.embedded.bookie import tls_argv

            tls_args = tls_argv(self.pki.server_tls(self.pki.admin)) if self.pki is not None else []
            self.console = start_console(self.metadata_uri, self.options.console, self.data_dir, tls_args)
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
            self.namenodes = start_namenodes(self.metadata_uri, self.data_dir, zones, START_TIMEOUT_S)
        if "kv" in self.options.services:
            from scriba.embedded.kvstore import KvCluster

            print(f"starting {KV_REPLICAS} KV store replicas (etcd v3 API) ...", file=out, flush=True)
            zones = sorted({self.options.location(i)[1] for i in range(len(self.bookies))})
            self.kv = KvCluster(self.metadata_uri, self.data_dir / "kv", replicas=KV_REPLICAS, zones=zones,
                                session_timeout_s=KV_SESSION_TIMEOUT_S)
            self.kv.start_all(attempts=3)
        self.write_sandbox_file()

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
            "console": None if self.console is None else {"url": self.console[1], "pid": self.console[0].pid},
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
            **({"namenodes": _describe_namenodes(self.namenodes)} if self.namenodes else {}),
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
    return pid is not None and _pid_alive(pid)


def _describe_namenodes(children: list[Any]) -> list[dict[str, Any]]:
    from scriba.embedded.namenode import describe

    return describe(children)


def _stop_quietly(process: Any) -> None:
    try:
        process.stop()
    except Exception as exc:  # keep stopping the others
        log.warning("sandbox_stop_failed", what=repr(process), error=repr(exc))


# --- the command ------------------------------------------------------------------


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sandbox",
        help="run etcd + bookies on this machine",
        description="Start an embedded etcd and N bookie processes over zones; Ctrl-C stops everything. "
                    "The data dir is kept across a stop and start (ledgers written before stay "
                    "readable); --fresh wipes it first.",
    )
    p.add_argument("--bookies", type=int, default=None,
                   help=f"bookie processes to start (default {BOOKIES_DEFAULT}; with --regions: one per zone)")
    p.add_argument("--zones", "--zones-per-region", dest="zones", type=int, default=3,
                   help="zones (in each region) to spread them over (default 3)")
    p.add_argument("--regions", type=int, default=1,
                   help="regions (region-1, region-2, ...) to spread them over, round-robin (default 1)")
    p.add_argument("--inter-region-latency-ms", type=int, default=0, metavar="MS",
                   help="latency each way between region-1 (where clients are taken to run) and every "
                        "other region's bookies, through the fault proxy (default 0: none)")
    p.add_argument("--data", type=Path, default=None, help=f"data dir (default ./{DEFAULT_DATA_DIR})")
    p.add_argument("--metadata", default=None, help="use this existing metadata store instead of starting etcd")
    p.add_argument("--fresh", action="store_true",
                   help="wipe the etcd and bookie data a previous sandbox left in --data (default: keep it)")
    p.add_argument("--console", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="where the web console listens (default 127.0.0.1:0: any free port; its URL is printed)")
    p.add_argument("--no-console", action="store_true", help="do not start the web console")
    p.add_argument("--autorecovery-delay-s", type=float, default=AUTORECOVERY_DELAY_S, metavar="S",
                   help="the autorecovery process re-replicates a bookie's ledgers once it has been gone "
                        f"this long (default {AUTORECOVERY_DELAY_S:g}; 0: at once)")
    p.add_argument("--no-autorecovery", action="store_true",
                   help="do not start the autorecovery process (auditor + replication worker)")
    p.add_argument("--with", dest="services", action="append", default=[], choices=SERVICES, metavar="SERVICE",
                   help="also start an example on the cluster: kv = 3 replicas of the KV store (etcd's v3 "
                        "API), namenode = the WebHDFS namenode example (an active and two standbys); both "
                        "spread over the zones and listed in sandbox.json")
    p.add_argument("--simple-test", action="store_true", help="run `scriba shell simple-test` against it, then stop")
    p.add_argument("--tls", action="store_true",
                   help="mutual TLS everywhere (etcd, bookies, console) with a throwaway CA in DATA/tls")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--detach", action="store_true", help="run in the background; return once it serves")
    mode.add_argument("--stop", action="store_true", help="stop the sandbox running on --data")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    data_dir = (args.data or default_data_dir()).resolve()
    if args.stop:
        return stop_detached(data_dir)
    if args.bookies is None:
        args.bookies = BOOKIES_DEFAULT if args.regions == 1 else min(args.regions * args.zones, BOOKIES_MAX)
    options = SandboxOptions(data_dir, bookies=args.bookies, zones=args.zones, regions=args.regions,
                             metadata=args.metadata, fresh=args.fresh,
                             console=None if args.no_console else args.console, tls=args.tls,
                             inter_region_latency_ms=args.inter_region_latency_ms,
                             autorecovery_delay_s=None if args.no_autorecovery else args.autorecovery_delay_s,
                             services=tuple(args.services))
    options.validate()
    if args.detach:
        return start_detached(args, data_dir)
    return run_foreground(options, simple_test=args.simple_test)


def run_foreground(options: SandboxOptions, *, simple_test: bool = False, out: IO[str] | None = None) -> int:
    out = out or sys.stdout
    lock = SandboxLock(options.data_dir)
    lock.acquire()
    sandbox = Sandbox(options)
    stop_requested = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not stop_requested.is_set():
            stop_requested.set()
            raise _Stop(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        sandbox.start(out)
        _print_ready(sandbox, out)
        if simple_test:
            code = _run_simple_test(sandbox.metadata_uri, out,
                                    sandbox.pki.client_tls() if sandbox.pki is not None else None)
        else:
            while not stop_requested.wait(1.0):
                dead = sandbox.dead_bookies()
                if dead:
                    print(f"warning: bookie process(es) exited: {', '.join(dead)}", file=out, flush=True)
                    sandbox.bookies = [b for b in sandbox.bookies if b.bookie_id not in dead]
                    sandbox.write_sandbox_file()
    except _Stop:
        code = 0
    finally:
        for s in previous:
            signal.signal(s, lambda signum, frame: None)  # a second Ctrl-C cannot cut the cleanup short
        print("stopping the sandbox ...", file=out, flush=True)
        sandbox.stop()
        lock.release()
        for s, handler in previous.items():
            signal.signal(s, handler)
        print("sandbox stopped", file=out, flush=True)
    return code


def _print_ready(sandbox: Sandbox, out: IO[str]) -> None:
    places = {sandbox.options.location(i) for i in range(len(sandbox.bookies))}
    zones = [f"{r}/{z}" if sandbox.options.regions > 1 else z for r, z in sorted(places)]
    print(f"sandbox running: {len(sandbox.bookies)} bookies in {', '.join(zones)}", file=out)
    print(f"metadata: {sandbox.metadata_uri}", file=out)
    if sandbox.console is not None:
        print(f"console:  {sandbox.console[1]}", file=out)
    if sandbox.autorecovery is not None:
        print(f"autorecovery: auditor + worker ({sandbox.autorecovery[1]}), a lost bookie re-replicated "
              f"after {sandbox.options.autorecovery_delay_s:g}s", file=out)
    for nn in _describe_namenodes(sandbox.namenodes):
        print(f"namenode: {nn['id']} {nn['url']} ({nn['zone']}, {nn['role']})", file=out)
    if sandbox.kv is not None:
        print(f"kv:       etcdctl --endpoints {sandbox.kv.endpoints} put hello world", file=out)
    print(f"details:  {sandbox.data_dir / SANDBOX_FILE}", file=out)
    tls = ""
    if sandbox.pki is not None:
        c = sandbox.pki.client
        tls = f" --tls-cert {c.cert} --tls-key {c.key} --tls-ca {sandbox.pki.ca}"
    print(
        f"next: SCRIBA_METADATA='{sandbox.metadata_uri}' scriba shell{tls} simple-test   "
        "(Ctrl-C here stops the sandbox)",
        file=out,
        flush=True,
    )


def _run_simple_test(uri: str, out: IO[str], tls: Any = None) -> int:
    from scriba.client.shell import simple_test_report

    ok, text = simple_test_report(uri, tls=tls)
    print(text, file=out, flush=True)
    return 0 if ok else 1


def start_detached(args: argparse.Namespace, data_dir: Path) -> int:
    holder = SandboxLock.holder(data_dir)
    if holder is not None:
        raise SandboxBusyError(f"a sandbox (pid {holder}) is already running on {data_dir}")
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = python_module_argv("scriba.cli", "sandbox", "--data", str(data_dir),
                              "--bookies", str(args.bookies), "--zones", str(args.zones),
                              "--regions", str(args.regions),
                              "--inter-region-latency-ms", str(args.inter_region_latency_ms))
    if args.metadata:
        argv += ["--metadata", args.metadata]
    if args.fresh:
        argv.append("--fresh")
    if args.tls:
        argv.append("--tls")
    argv += ["--no-console"] if args.no_console else ["--console", args.console]
    argv += (["--no-autorecovery"] if args.no_autorecovery
             else ["--autorecovery-delay-s", f"{args.autorecovery_delay_s:g}"])
    for service in args.services:
        argv += ["--with", service]
    log_path = data_dir / LOG_FILE
    with open(log_path, "ab") as log_file:
        child = subprocess.Popen(
            argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            cwd=data_dir,
        )
    deadline = time.monotonic() + DETACH_TIMEOUT_S
    while time.monotonic() < deadline:
        if child.poll() is not None:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
            raise ConfigError(f"the sandbox exited with {child.returncode}; log {log_path}:\n{tail}")
        try:
            doc = read_sandbox_file(data_dir)
        except ConfigError:
            doc = {}
        if doc.get("pid") == child.pid:
            print(f"sandbox running in the background (pid {child.pid}, log {log_path})")
            print(f"metadata: {doc['metadata_uri']}")
            if doc.get("console"):
                print(f"console:  {doc['console']['url']}")
            for nn in doc.get("namenodes", []):
                print(f"namenode: {nn['id']} {nn['url']} ({nn['zone']}, {nn['role']})")
            if doc.get("kv"):
                endpoints = ",".join(r["endpoint"] for r in doc["kv"])
                print(f"kv:       etcdctl --endpoints {endpoints} put hello world")
            print(f"next: SCRIBA_METADATA={doc['metadata_uri']} scriba shell simple-test ; "
                  f"stop with: scriba sandbox --stop --data {data_dir}")
            return 0
        time.sleep(0.1)
    child.terminate()
    raise ConfigError(f"the sandbox did not start within {DETACH_TIMEOUT_S:.0f}s; log {log_path}")


def stop_detached(data_dir: Path) -> int:
    pid = SandboxLock.holder(data_dir)
    if pid is None:
        print(f"no sandbox is running on {data_dir}")
        return 1
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _pid_alive(pid) and SandboxLock.holder(data_dir) is not None:
        if time.monotonic() >= deadline:
            raise ConfigError(f"sandbox pid {pid} did not stop within {STOP_TIMEOUT_S:.0f}s")
        time.sleep(0.1)
    print(f"sandbox (pid {pid}) stopped")
    return 0
