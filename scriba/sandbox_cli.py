"""``scriba sandbox``: the command line of :mod:`scriba.sandbox` — flags, the foreground
run (signals unwind into the stop), ``--detach`` / ``--stop`` and the ready message.

What the sandbox starts, where its data lives and how it stops is :class:`scriba.sandbox.Sandbox`;
this module only turns flags into :class:`~scriba.sandbox.SandboxOptions` and runs it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import IO, Any

from scriba.embedded.process import python_module_argv
from scriba.embedded.sandbox_children import STOP_TIMEOUT_S
from scriba.errors import ConfigError
from scriba.sandbox import (
    AUTORECOVERY_DELAY_S,
    BOOKIES_DEFAULT,
    BOOKIES_MAX,
    DEFAULT_DATA_DIR,
    DETACH_TIMEOUT_S,
    LOG_FILE,
    SERVICES,
    Sandbox,
    SandboxBusyError,
    SandboxLock,
    SandboxOptions,
    Stop,
    default_data_dir,
    describe_namenodes,
    pid_alive,
    read_sandbox_file,
)
from scriba.shell import SANDBOX_FILE


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
    p.add_argument("--console-allow-actions", action="store_true",
                   help="start the console with --allow-actions: decommission, audit and leadership transfer "
                        "from its pages, each confirmed (with --tls: by the admin certificate only)")
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
                   help="mutual TLS everywhere (etcd, bookies, console, autorecovery, the --with examples) with "
                        "a throwaway CA in DATA/tls; the client certificate's paths are printed")
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
                             console_allow_actions=args.console_allow_actions,
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
            raise Stop(signum)

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
    except Stop:
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
    client_tls = sandbox.pki.describe()["client_tls"] if sandbox.pki is not None else None
    for line in _service_lines(describe_namenodes(sandbox.namenodes),
                               sandbox.kv.endpoints if sandbox.kv is not None else None, client_tls):
        print(line, file=out)
    print(f"details:  {sandbox.data_dir / SANDBOX_FILE}", file=out)
    print(f"next: SCRIBA_METADATA='{sandbox.metadata_uri}' scriba shell{_shell_tls(client_tls)} simple-test   "
          "(Ctrl-C here stops the sandbox)", file=out, flush=True)


def _shell_tls(client_tls: dict[str, str] | None) -> str:
    """``scriba shell``'s TLS flags for the sandbox's client certificate ('' without --tls)."""
    if client_tls is None:
        return ""
    return f" --tls-cert {client_tls['cert']} --tls-key {client_tls['key']} --tls-ca {client_tls['ca']}"


def _service_lines(namenodes: list[dict[str, Any]], kv_endpoints: str | None,
                   client_tls: dict[str, str] | None) -> list[str]:
    """The ready message's lines for the client certificate and the ``--with`` examples
    (the foreground and the ``--detach`` message print the same)."""
    lines = []
    if client_tls is not None:
        lines.append(f"client certificate (mutual TLS): --cert {client_tls['cert']} --key {client_tls['key']} "
                     f"--cacert {client_tls['ca']}")
    lines += [f"namenode: {nn['id']} {nn['url']} ({nn['zone']}, {nn['role']})" for nn in namenodes]
    if kv_endpoints is not None:
        tls = ("" if client_tls is None else
               f" --cacert {client_tls['ca']} --cert {client_tls['cert']} --key {client_tls['key']}")
        lines.append(f"kv:       etcdctl --endpoints {kv_endpoints}{tls} put hello world")
    return lines


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
    if args.console_allow_actions:
        argv.append("--console-allow-actions")
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
            kv = ",".join(r["endpoint"] for r in doc["kv"]) if doc.get("kv") else None
            for line in _service_lines(doc.get("namenodes", []), kv, doc.get("client_tls")):
                print(line)
            print(f"next: SCRIBA_METADATA='{doc['metadata_uri']}' scriba shell{_shell_tls(doc.get('client_tls'))} "
                  f"simple-test ; stop with: scriba sandbox --stop --data {data_dir}")
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
    while pid_alive(pid) and SandboxLock.holder(data_dir) is not None:
        if time.monotonic() >= deadline:
            raise ConfigError(f"sandbox pid {pid} did not stop within {STOP_TIMEOUT_S:.0f}s")
        time.sleep(0.1)
    print(f"sandbox (pid {pid}) stopped")
    return 0
