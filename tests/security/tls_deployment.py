"""One deployment with mutual TLS on every process, and the table of the ports it opens.

:func:`start_deployment` runs etcd (client and peer ports), three bookies (gRPC, binary
data path, HTTP admin), a KV replica (etcd API, RSM replica service), a namenode replica
(WebHDFS, RSM replica service), the console and ``scriba autorecovery run --http``, all
with the test CA's server certificate and ``--tls-require-client-cert``. :data:`PORTS`
names every port it should open (the secure-defaults audit holds what really listens to
it; the TLS fuzz test hammers each).
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from scriba.embedded.bookie import tls_argv
from scriba.embedded.etcd import EtcdCluster
from scriba.embedded.kvstore import KvCluster
from scriba.embedded.process import free_port, python_module_argv
from scriba.embedded.sandbox_children import start_child, start_console, stop_child
from scriba.testing.cluster import BookieCluster
from scriba.testing.pki import TestPki

RSM_CONFIG = {"campaign_backoff_s": 0.1, "suspended_grace_s": 0.5, "propose_timeout_s": 20.0,
              "writer_lock_timeout_s": 60.0}


@dataclass
class Deployment:
    etcd: EtcdCluster
    bookies: BookieCluster
    kv: KvCluster
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)  # the children's ports, by name

    def pids(self) -> list[int]:
        pids = [m.pid for m in self.etcd.members] + [b.pid for b in self.bookies.bookies]
        pids += [r.proc.pid for r in self.kv.replicas if r.proc is not None]
        pids += [c.pid for c in self.children.values()]
        return [p for p in pids if p is not None]


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


@dataclass(frozen=True)
class Row:
    """A kind of port: what listens there and how to find its ports in the deployment."""

    component: str
    port: str
    find: Callable[[Deployment], list[int]]

    @property
    def name(self) -> str:
        return f"{self.component} {self.port}"


PORTS: tuple[Row, ...] = (
    Row("etcd", "client", lambda d: [p for _, p in d.etcd.endpoints]),
    Row("etcd", "peer", lambda d: list(d.etcd.peer_ports)),
    Row("bookie", "gRPC", lambda d: [_port(a) for a in d.bookies.addresses().values()]),
    Row("bookie", "binary data path", lambda d: [_port(a) for a in d.bookies.binary_addresses().values()]),
    Row("bookie", "HTTP admin", lambda d: [b.http_port for b in d.bookies.bookies]),
    Row("kv", "etcd API", lambda d: [_port(r.endpoint) for r in d.kv.replicas]),
    Row("kv", "RSM replica service", lambda d: [_port(r.peer) for r in d.kv.replicas]),
    Row("namenode", "WebHDFS", lambda d: [d.ports["namenode-http"]]),
    Row("namenode", "RSM replica service", lambda d: [d.ports["namenode-rsm"]]),
    Row("console", "HTTP", lambda d: [d.ports["console"]]),
    Row("autorecovery", "HTTP /metrics", lambda d: [d.ports["autorecovery"]]),
)


def unclassified(listening: dict[int, int], rows: tuple[Row, ...], d: Deployment) -> dict[int, int]:
    """Listening ports (port -> pid) that no row of ``rows`` names."""
    named = {p for row in rows for p in row.find(d)}
    return {port: pid for port, pid in listening.items() if port not in named}



@contextmanager
def start_deployment(pki: TestPki, base: Path) -> Iterator[Deployment]:
    server = pki.server_tls()  # mutual TLS, the test allow-lists; SANs 127.0.0.1 and localhost
    flags = tls_argv(server)
    etcd = EtcdCluster(base / "etcd", 1, tls=server)
    etcd.start()
    uri = etcd.uri(f"audit{uuid.uuid4().hex[:8]}", cert=str(pki.client.cert), key=str(pki.client.key))
    bookies = BookieCluster(base / "bookies", uri, tls=server)
    kv = KvCluster(uri, base / "kv", replicas=1, rsm_config=RSM_CONFIG, extra_args=flags)
    d = Deployment(etcd, bookies, kv)
    try:
        bookies.start_bookies(3)
        kv.start_all()
        d.ports = {"namenode-http": free_port(), "namenode-rsm": free_port(), "console": free_port(),
                   "autorecovery": free_port()}
        nn_argv = python_module_argv(
            "scriba.examples.namenode", "serve", "--metadata", uri, "--id", "nn1", "--listen",
            f"127.0.0.1:{d.ports['namenode-http']}", "--rsm-listen", f"127.0.0.1:{d.ports['namenode-rsm']}", *flags)
        d.children["namenode"], _ = start_child(nn_argv, base, "namenode",
                                                lambda line: line if line.startswith("READY") else None)
        d.children["console"], _ = start_console(uri, f"127.0.0.1:{d.ports['console']}", base, flags)
        ar_argv = python_module_argv("scriba.cli", "autorecovery", "--metadata", uri, "run", "--http",
                                     f"127.0.0.1:{d.ports['autorecovery']}", *flags)
        d.children["autorecovery"], _ = start_child(ar_argv, base, "autorecovery",
                                                    lambda line: line if line.startswith("{") else None)
        yield d
    finally:
        for child in d.children.values():
            stop_child(child)
        kv.stop_all()
        bookies.stop_all()
        etcd.stop()
