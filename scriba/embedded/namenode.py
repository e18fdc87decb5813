"""``scriba sandbox --with namenode``: launches the namenode example's three replicas beside the cluster.

Starts ``nn1`` (the first zone), ``nn2`` and ``nn3`` (the next zones, round-robin) as
``python -P -m scriba.examples.namenode serve`` processes on free ports, each in its own
directory ``DIR/namenode-nnN`` (log ``namenode.log`` there), waits for each to print
``READY <url>`` and for one of them to be active, and describes them for
``sandbox.json``'s ``namenodes`` list: ``id``, ``url`` (the WebHDFS endpoint), ``zone``,
``pid`` and ``role`` (``active`` / ``standby`` when the file was written; ``scriba-namenode
haadmin -getAllServiceState`` gives the current roles). The namespace lives in Scriba
(its edit log is a stream), so it survives a stop and start of the sandbox like the
ledgers do. Under ``scriba sandbox --tls`` they get the sandbox's ``--tls-*`` server flags:
WebHDFS is then HTTPS only and admits the sandbox's client and admin certificates. The
sandbox only launches the example; it imports nothing of it.
"""

from __future__ import annotations

import json
import select
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from scriba.embedded.process import ServerStartError, free_port, python_module_argv

NAMENODES: Final = 3
NAMESPACE: Final = "namenode"  # the edit log's stream namespace (haadmin's default too)


@dataclass(slots=True)
class NamenodeChild:
    replica_id: str
    zone: str
    process: subprocess.Popen[bytes]
    url: str = ""
    context: ssl.SSLContext | None = None  # the client side of HTTPS (a certificate the namenodes admit)


def start_namenodes(metadata_uri: str, data_dir: Path, zones: list[str], timeout_s: float, *,
                    tls_args: Sequence[str] = (), context: ssl.SSLContext | None = None) -> list[NamenodeChild]:
    """Start the replicas (in parallel), return once each serves and one is active.

    ``tls_args``: the replicas' ``--tls-*`` flags (HTTPS, the replica service and their
    bookie client); ``context``: how to reach their HTTPS status page (a client
    certificate they admit)."""
    children: list[NamenodeChild] = []
    try:
        for i in range(NAMENODES):
            replica_id, zone = f"nn{i + 1}", zones[i % len(zones)]
            home = data_dir / f"namenode-{replica_id}"
            home.mkdir(parents=True, exist_ok=True)
            argv = python_module_argv("scriba.examples.namenode", "serve", "--metadata", metadata_uri,
                                      "--id", replica_id, "--listen", f"127.0.0.1:{free_port()}",
                                      "--rsm-listen", f"127.0.0.1:{free_port()}", "--namespace", NAMESPACE,
                                      "--zone", zone, *tls_args)
            with open(home / "namenode.log", "ab") as log_file:
                process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log_file,
                                           stdin=subprocess.DEVNULL, cwd=home)
            children.append(NamenodeChild(replica_id, zone, process, context=context))
        deadline = time.monotonic() + timeout_s
        for child in children:
            child.url = _ready_url(child, deadline, data_dir)
        while not any(role(c.url, c.context) == "active" for c in children):
            if time.monotonic() > deadline:
                raise ServerStartError(f"no namenode became active within {timeout_s:.0f}s")
            time.sleep(0.1)
    except BaseException:
        stop_namenodes(children)
        raise
    return children


def _ready_url(child: NamenodeChild, deadline: float, data_dir: Path) -> str:
    pipe = child.process.stdout
    if pipe is None:  # cannot happen with stdout=PIPE
        raise ServerStartError("the namenode's stdout is not a pipe")
    try:
        while (left := deadline - time.monotonic()) > 0 and child.process.poll() is None:
            if select.select([pipe], [], [], left)[0]:
                line = pipe.readline().decode(errors="replace").strip()
                if line.startswith("READY "):
                    return line.removeprefix("READY ")
    finally:
        pipe.close()
    log = data_dir / f"namenode-{child.replica_id}" / "namenode.log"
    raise ServerStartError(f"namenode {child.replica_id} did not start (exit {child.process.poll()}; log {log})")


def role(url: str, context: ssl.SSLContext | None = None) -> str:
    """``active`` / ``standby`` as the namenode says, ``unreachable`` if it does not answer."""
    try:
        with urllib.request.urlopen(f"{url}/scriba/status", timeout=5, context=context) as answer:
            return str(json.loads(answer.read())["role"])
    except (OSError, ValueError, KeyError):
        return "unreachable"


def describe(children: list[NamenodeChild]) -> list[dict[str, Any]]:
    return [{"id": c.replica_id, "url": c.url, "zone": c.zone, "pid": c.process.pid,
             "role": role(c.url, c.context)}
            for c in children]


def stop_namenodes(children: list[NamenodeChild], timeout_s: float = 30.0) -> None:
    for child in children:
        if child.process.poll() is None:
            child.process.terminate()
    for child in children:
        try:
            child.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()
