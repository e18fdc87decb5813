"""``scriba local-cluster``: a multi-zone cluster's processes on this machine, one part at a time.

``terraform/environments/local`` drives it: one ``terraform_data`` resource per part
(the metadata store, each bookie), whose create-time ``local-exec`` runs ``start-*``
and whose destroy-time one runs ``stop-*``. Each command does one part and returns;
the processes it starts run detached (own session, own log, stdin from /dev/null), so
terraform's pipes close at once. The existing launchers do the process work
(:class:`~scriba.embedded.etcd.EtcdCluster`, :class:`~scriba.embedded.bookie.BookieProcess`);
this module adds fixed ports (terraform computes the metadata URI before anything
runs) and PID records that outlive the command that wrote them.

Layout under DATA_DIR::

    topology.json                 the topology file (``write-topology``)
    metadata/                     the etcd members' dirs and logs, cluster.json (ports)
    metadata/processes.json       the members' records
    bookies/<id>/                 data/, journal/, bookie.log
    bookies/<id>/process.json     the bookie's record

A record holds a PID and that process's start time (field 22 of ``/proc/PID/stat``):
a stop signals a recorded PID only while the same process still has it, never a
process that got the number later. A zombie counts as stopped.

Each part: ABSENT (no record) or STOPPED (record, process gone) --start--> RUNNING
--stop--> ABSENT, data removed unless ``--keep-data``. ``start`` on a RUNNING part and
``stop`` on an ABSENT one do nothing, so terraform may repeat either. A bookie whose
dirs do not exist yet is formatted first (``scriba bookie format --force``): a new
bookie under a reused id replaces the stale cookie its predecessor left in the store.

TLS: ``start-metadata`` and ``start-bookie`` take the servers' ``--tls-*`` flags
(:mod:`scriba.tls_cli`). etcd then serves its client and peer ports over TLS (with
``--tls-require-client-cert``: mutual TLS), the URI it reports is ``etcd+tls://...?ca=``,
and each bookie serves gRPC, the binary data path and HTTP with the certificate and its
allow-lists; the bookie reaches etcd with the ``cert=``/``key=`` of the ``--metadata``
URI terraform renders. A part started with TLS is stopped as any other.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import time
import urllib.parse
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scriba.errors import ConfigError, ScribaError
from scriba.log import get_logger
from scriba.tls import TlsConfig
from scriba.tls_cli import add_tls_arguments, tls_from_args

log = get_logger(__name__)

HOST = "127.0.0.1"
TOPOLOGY_FILE = "topology.json"
METADATA_DIR = "metadata"
BOOKIES_DIR = "bookies"
RECORDS_FILE = "processes.json"
RECORD_FILE = "process.json"
METADATA_MEMBERS_MAX = 7
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
KILL_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.05


class LocalClusterError(ScribaError):
    """A part of the local cluster could not be started or stopped."""


# --- process records -------------------------------------------------------------------


def process_start_ticks(pid: int) -> int | None:
    """The start time of a live process (clock ticks since boot); None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces and ')'
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of stat; fields[0] is field 3


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """One started process: its name, PID and start time (which pins the PID to it)."""

    name: str
    pid: int
    start_ticks: int
    log: str

    @classmethod
    def of(cls, name: str, pid: int | None, log_path: Path) -> ProcessRecord:
        ticks = process_start_ticks(pid) if pid is not None else None
        if pid is None or ticks is None:
            raise LocalClusterError(f"{name} exited right after it started; log {log_path}")
        return cls(name, pid, ticks, str(log_path))

    @property
    def alive(self) -> bool:
        return process_start_ticks(self.pid) == self.start_ticks

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM (after SIGCONT), SIGKILL after ``timeout_s``; return once it is gone."""
        for sig in (signal.SIGCONT, signal.SIGTERM):
            self._signal(sig)
        if self._wait_gone(timeout_s):
            return
        log.warning("local_cluster_kill", name=self.name, pid=self.pid)
        self._signal(signal.SIGKILL)
        if not self._wait_gone(KILL_TIMEOUT_S):
            raise LocalClusterError(f"{self.name} (pid {self.pid}) survived SIGKILL for {KILL_TIMEOUT_S:.0f}s")

    def _signal(self, sig: int) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def _wait_gone(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.alive:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_INTERVAL_S)
        return True


def read_records(path: Path) -> list[ProcessRecord]:
    """The records in ``path`` ([] if there is no file); ConfigError if it is unreadable."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    try:
        return [ProcessRecord(**r) for r in doc["processes"]]
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a process record file ({exc})") from None


def write_records(path: Path, records: list[ProcessRecord], **extra: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({**extra, "processes": [asdict(r) for r in records]}, indent=1) + "\n")
    tmp.replace(path)


def stop_records(path: Path) -> list[ProcessRecord]:
    """Stop every recorded process still alive (in order, each waited for); drop the file."""
    records = read_records(path)
    for record in records:
        record.stop()
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return records


# --- the metadata store ----------------------------------------------------------------


def metadata_ports(port_base: int, members: int) -> tuple[list[int], list[int]]:
    """Member i serves clients on ``port_base + 2i`` and peers on ``port_base + 2i + 1``."""
    return [port_base + 2 * i for i in range(members)], [port_base + 2 * i + 1 for i in range(members)]


def metadata_uri(port_base: int, members: int, prefix: str, tls: TlsConfig | None = None) -> str:
    """The members' URI; with ``tls``: ``etcd+tls://`` with its CA (clients add ``cert=``/``key=``)."""
    clients, _ = metadata_ports(port_base, members)
    hosts = ",".join(f"{HOST}:{p}" for p in clients)
    if tls is None:
        return f"etcd://{hosts}/{prefix}"
    return f"etcd+tls://{hosts}/{prefix}" + (f"?{urllib.parse.urlencode({'ca': str(tls.ca)})}" if tls.ca else "")


def _etcd(base_dir: Path, members: int, port_base: int, tls: TlsConfig | None = None) -> Any:
    """An :class:`EtcdCluster` on the ports terraform computed instead of free ones."""
    from scriba.embedded.etcd import EtcdCluster

    class PinnedEtcdCluster(EtcdCluster):
        @staticmethod
        def _new_layout(members: int, host: str) -> tuple[list[int], list[int], str]:
            clients, peers = metadata_ports(port_base, members)
            return clients, peers, f"scriba-local-{uuid.uuid4().hex[:12]}"

    cluster = PinnedEtcdCluster(base_dir, members, tls=tls)
    wanted, _ = metadata_ports(port_base, members)
    if [p for _, p in cluster.endpoints] != wanted:
        raise ConfigError(
            f"{base_dir} holds an etcd cluster on client ports {[p for _, p in cluster.endpoints]}, "
            f"not {wanted}: keep the ports it was created with, or remove the dir"
        )
    return cluster


def start_metadata(data_dir: Path, *, members: int, port_base: int, prefix: str,
                   timeout_s: float = START_TIMEOUT_S, tls: TlsConfig | None = None) -> str:
    """Start the etcd members that are not running (all of them the first time); the URI."""
    if not 1 <= members <= METADATA_MEMBERS_MAX or members % 2 == 0:
        raise ConfigError(f"--members: {members} is not an odd number from 1 to {METADATA_MEMBERS_MAX}")
    base = data_dir / METADATA_DIR
    records_path = base / RECORDS_FILE
    uri = metadata_uri(port_base, members, prefix, tls)
    alive = {r.name: r for r in read_records(records_path) if r.alive}
    cluster = _etcd(base, members, port_base, tls)
    names = [m.name for m in cluster.members]
    if all(n in alive for n in names):
        print(f"metadata store already running: {uri}", flush=True)
        return uri
    if not alive:
        cluster.start(timeout_s=timeout_s)
    else:  # a member died: bring back just the missing ones, on their data
        for i, name in enumerate(names):
            if name not in alive:
                cluster.start_member(i, timeout_s=timeout_s)
    records = [alive.get(m.name) or ProcessRecord.of(m.name, m.pid, m.log_path) for m in cluster.members]
    write_records(records_path, records, metadata_uri=uri)
    for m in cluster.members:
        m.detach()  # they outlive this call; stopped by their records
    print(f"metadata store running: {uri} (pids {', '.join(str(r.pid) for r in records)})", flush=True)
    return uri


def write_topology(data_dir: Path, text: str) -> Path:
    """Write DATA_DIR/topology.json, after checking that placement can read it."""
    from scriba.placement import parse_topology_mapping

    parse_topology_mapping(text, fmt="json")
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / TOPOLOGY_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text.rstrip("\n") + "\n")
    tmp.replace(path)
    return path


def stop_metadata(data_dir: Path, *, keep_data: bool) -> None:
    """Stop the recorded members; unless ``keep_data``, remove their dirs and the topology
    file, then the bookies dir and DATA_DIR if nothing else is left in them."""
    base = data_dir / METADATA_DIR
    stopped = stop_records(base / RECORDS_FILE)
    print(f"metadata store stopped ({len(stopped)} member(s))", flush=True)
    running = [p.parent.name for p in (data_dir / BOOKIES_DIR).glob(f"*/{RECORD_FILE}")
               if any(r.alive for r in read_records(p))]
    if running:
        print(f"warning: bookies still running without their metadata store: {', '.join(sorted(running))}",
              file=sys.stderr, flush=True)
    if keep_data:
        return
    shutil.rmtree(base, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        (data_dir / TOPOLOGY_FILE).unlink()
    for d in (data_dir / BOOKIES_DIR, data_dir):
        with contextlib.suppress(FileNotFoundError, OSError):
            d.rmdir()  # only when empty: never what someone else put there


# --- bookies ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BookieSpec:
    bookie_id: str
    metadata_uri: str
    region: str
    zone: str
    rack: str
    port: int
    http_port: int
    tls: TlsConfig | None = None  # what it serves (mutual TLS, allow-lists) and dials other bookies with

    def validate(self) -> BookieSpec:
        if not self.bookie_id or "/" in self.bookie_id or self.bookie_id in (".", ".."):
            raise ConfigError(f"bookie id {self.bookie_id!r}: non-empty, without '/'")
        for port in (self.port, self.http_port):
            if not 1 <= port <= 65535:
                raise ConfigError(f"bookie {self.bookie_id}: port {port} is not in 1..65535")
        return self


def bookie_dir(data_dir: Path, bookie_id: str) -> Path:
    return data_dir / BOOKIES_DIR / bookie_id


def start_bookie(data_dir: Path, spec: BookieSpec, timeout_s: float = START_TIMEOUT_S) -> None:
    """Start one bookie unless it runs; wait until it serves (it registers before that)."""
    from scriba.embedded.bookie import BookieProcess

    spec.validate()
    base = bookie_dir(data_dir, spec.bookie_id)
    record_path = base / RECORD_FILE
    if any(r.alive for r in read_records(record_path)):
        print(f"bookie {spec.bookie_id} already running", flush=True)
        return
    bookie = BookieProcess(base, spec.metadata_uri, bookie_id=spec.bookie_id, region=spec.region,
                           zone=spec.zone, rack=spec.rack, port=spec.port, http_port=spec.http_port, tls=spec.tls)
    if not base.exists():
        _format(bookie.format_argv(force=True))
    try:
        bookie.start(timeout_s)
    except BaseException:
        bookie.stop()
        raise
    write_records(record_path, [ProcessRecord.of(f"bookie {spec.bookie_id}", bookie.pid, bookie.log_path)],
                  bookie_id=spec.bookie_id, address=bookie.address, http_address=bookie.http_address,
                  location=f"/{spec.region}/{spec.zone}/{spec.rack}")
    print(f"bookie {spec.bookie_id} serving on {bookie.address} (pid {bookie.pid})", flush=True)
    bookie.process.detach()  # it outlives this call; stopped by its record


def _format(argv: list[str]) -> None:
    """Run ``scriba bookie format`` in this process (argv as BookieProcess builds it),
    leaving the process's logging as its caller set it up."""
    from scriba.bookie.cli import parse_command, run_command

    verb = argv.index("format")
    if run_command(parse_command(argv[verb:])) != 0:
        raise LocalClusterError(f"formatting a new bookie failed: {' '.join(argv[verb:])}")


def stop_bookie(data_dir: Path, bookie_id: str, *, keep_data: bool) -> None:
    base = bookie_dir(data_dir, bookie_id)
    stopped = stop_records(base / RECORD_FILE)
    if not keep_data:
        shutil.rmtree(base, ignore_errors=True)
    print(f"bookie {bookie_id} stopped" if stopped else f"bookie {bookie_id} was not running", flush=True)


# --- status ----------------------------------------------------------------------------


def status(data_dir: Path) -> dict[str, Any]:
    """What runs under DATA_DIR: the metadata members and bookies with PIDs and liveness."""
    def rows(path: Path) -> list[dict[str, Any]]:
        return [{**asdict(r), "alive": r.alive} for r in read_records(path)]

    meta_path = data_dir / METADATA_DIR / RECORDS_FILE
    meta_doc: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        meta_doc = json.loads(meta_path.read_text())
    bookies = []
    for path in sorted((data_dir / BOOKIES_DIR).glob(f"*/{RECORD_FILE}")):
        doc = json.loads(path.read_text())
        bookies.append({k: v for k, v in doc.items() if k != "processes"} | {"processes": rows(path)})
    return {
        "data_dir": str(data_dir),
        "metadata_uri": meta_doc.get("metadata_uri"),
        "metadata": rows(meta_path),
        "bookies": bookies,
        "topology_file": str(data_dir / TOPOLOGY_FILE) if (data_dir / TOPOLOGY_FILE).exists() else None,
    }


def format_status(doc: dict[str, Any]) -> str:
    lines = [f"data dir: {doc['data_dir']}", f"metadata: {doc['metadata_uri'] or '(not started)'}"]
    for r in doc["metadata"]:
        lines.append(f"  {r['name']:<24} pid {r['pid']:<8} {'running' if r['alive'] else 'STOPPED'}")
    for b in doc["bookies"]:
        for r in b["processes"]:
            lines.append(f"  {b['bookie_id']:<24} pid {r['pid']:<8} {'running' if r['alive'] else 'STOPPED'}"
                         f"  {b['address']}  {b['location']}")
    return "\n".join(lines)


# --- the command -----------------------------------------------------------------------


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "local-cluster",
        help="start/stop the parts of a multi-zone cluster on this machine (terraform's local environment)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = p.add_subparsers(dest="local_cluster_command", metavar="VERB", required=True)

    sp = verbs.add_parser("start-metadata", help="start the etcd members (idempotent)")
    sp.add_argument("--members", type=int, default=1, help="etcd members: 1, 3, 5 or 7")
    sp.add_argument("--port-base", type=int, required=True,
                    help="member i: client port BASE+2i, peer port BASE+2i+1")
    sp.add_argument("--prefix", default="scriba", help="key prefix in the metadata URI")
    add_tls_arguments(sp)
    sp.add_argument("data_dir", type=Path, metavar="DATA_DIR")
    sp.set_defaults(func=_cmd_start_metadata)

    sp = verbs.add_parser("write-topology", help="write DATA_DIR/topology.json (checked as placement reads it)")
    sp.add_argument("--json", required=True, dest="text", help="the topology file's text")
    sp.add_argument("data_dir", type=Path, metavar="DATA_DIR")
    sp.set_defaults(func=_cmd_write_topology)

    sp = verbs.add_parser("stop-metadata", help="stop the etcd members it recorded; remove their data")
    sp.add_argument("--keep-data", action="store_true", help="keep the members' data dirs")
    sp.add_argument("data_dir", type=Path, metavar="DATA_DIR")
    sp.set_defaults(func=_cmd_stop_metadata)

    sp = verbs.add_parser("start-bookie", help="start one bookie (idempotent)")
    sp.add_argument("--data", type=Path, required=True, metavar="DATA_DIR")
    sp.add_argument("--metadata", required=True, help="metadata URI")
    sp.add_argument("--region", required=True)
    sp.add_argument("--zone", required=True)
    sp.add_argument("--rack", required=True)
    sp.add_argument("--port", type=int, required=True, help="gRPC port on 127.0.0.1")
    sp.add_argument("--http-port", type=int, required=True, help="/health and /metrics port on 127.0.0.1")
    add_tls_arguments(sp)
    sp.add_argument("bookie_id", metavar="BOOKIE_ID")
    sp.set_defaults(func=_cmd_start_bookie)

    sp = verbs.add_parser("stop-bookie", help="stop one bookie it recorded; remove its data")
    sp.add_argument("--data", type=Path, required=True, metavar="DATA_DIR")
    sp.add_argument("--keep-data", action="store_true", help="keep the bookie's data and journal")
    sp.add_argument("bookie_id", metavar="BOOKIE_ID")
    sp.set_defaults(func=_cmd_stop_bookie)

    sp = verbs.add_parser("status", help="the recorded processes and whether each runs")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.add_argument("data_dir", type=Path, metavar="DATA_DIR")
    sp.set_defaults(func=_cmd_status)


def _cmd_start_metadata(args: argparse.Namespace) -> int:
    start_metadata(args.data_dir.resolve(), members=args.members, port_base=args.port_base, prefix=args.prefix,
                   tls=tls_from_args(args))
    return 0


def _cmd_write_topology(args: argparse.Namespace) -> int:
    print(f"topology file written: {write_topology(args.data_dir.resolve(), args.text)}")
    return 0


def _cmd_stop_metadata(args: argparse.Namespace) -> int:
    stop_metadata(args.data_dir.resolve(), keep_data=args.keep_data)
    return 0


def _cmd_start_bookie(args: argparse.Namespace) -> int:
    spec = BookieSpec(args.bookie_id, args.metadata, args.region, args.zone, args.rack, args.port, args.http_port,
                      tls_from_args(args))
    start_bookie(args.data.resolve(), spec)
    return 0


def _cmd_stop_bookie(args: argparse.Namespace) -> int:
    stop_bookie(args.data.resolve(), args.bookie_id, keep_data=args.keep_data)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    doc = status(args.data_dir.resolve())
    print(json.dumps(doc, indent=2) if args.json else format_status(doc))
    return 0
