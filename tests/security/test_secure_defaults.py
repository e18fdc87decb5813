"""Secure-defaults audit: every port a mutual-TLS deployment opens speaks only mutual TLS.

One deployment, every process with the test CA's certificates and ``--tls-require-client-cert``:
etcd (client and peer ports), three bookies (gRPC, binary data path, HTTP admin), a KV
replica (etcd API, RSM replica service), a namenode replica (WebHDFS, RSM replica
service), the console and ``scriba autorecovery run --http``. :data:`PORTS` is the one
table of what should listen; the audit

1. reads from ``/proc`` which TCP ports those processes (and their children) really
   listen on, and fails on any the table does not name (a new listener nobody put in
   the table, TLS or not, fails here) and on any row that does not listen;
2. probes every row's ports protocol-blind (``tls_probe.refusals``): a certificate
   the CA signed completes the handshake (the positive control); plaintext, no
   certificate and a certificate from another CA are refused.

The negative controls: the classification names the port of a row taken out of the
table; the probe flags an in-process plaintext server and a TLS server that does not ask
for client certificates.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from tls_probe import listening_ports, refusals

from scriba.embedded.bookie import tls_argv
from scriba.embedded.etcd import EtcdCluster
from scriba.embedded.kvstore import KvCluster
from scriba.embedded.process import free_port, python_module_argv
from scriba.embedded.sandbox_children import start_child, start_console, stop_child
from scriba.testing.cluster import BookieCluster
from scriba.testing.pki import TestPki

pytestmark = [pytest.mark.timeout(420)]
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


@pytest.fixture(scope="module")
def deployment(pki: TestPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    base = tmp_path_factory.mktemp("audit")
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


def test_every_listening_port_is_in_the_table(deployment: Deployment) -> None:
    listening = listening_ports(deployment.pids())
    extra = unclassified(listening, PORTS, deployment)
    assert not extra, f"listening ports the audit table does not name (port: pid): {extra}"
    for row in PORTS:
        ports = row.find(deployment)
        assert ports and all(p in listening for p in ports), f"{row.name}: {ports} not all listening"
    # negative control: a row taken out of the table leaves its ports unclassified
    without_console = tuple(r for r in PORTS if r.component != "console")
    assert set(unclassified(listening, without_console, deployment)) == {deployment.ports["console"]}


@pytest.mark.parametrize("row", PORTS, ids=[r.name for r in PORTS])
def test_port_speaks_only_mutual_tls(deployment: Deployment, pki: TestPki, row: Row) -> None:
    for port in row.find(deployment):
        assert refusals(port, pki) == [], f"{row.name} on {port}"


# --- negative controls of the probe ----------------------------------------------------------


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


def _serve(server: HTTPServer) -> Iterator[int]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_probe_flags_a_plaintext_server(pki: TestPki) -> None:
    for port in _serve(HTTPServer(("127.0.0.1", 0), _Ok)):
        problems = refusals(port, pki)
        assert any(p.startswith("served plaintext: b'HTTP/1.0 200") for p in problems), problems
        assert any(p.startswith("refused a certificate the CA signed") for p in problems), problems


def test_probe_flags_tls_without_client_certificates(pki: TestPki) -> None:
    ctx = pki.server_tls(mutual=False).load().server_ssl_context()  # server-side TLS only

    class TlsServer(HTTPServer):
        def get_request(self) -> tuple[socket.socket, Any]:
            sock, addr = super().get_request()
            return ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # the probe's refused handshakes

    for port in _serve(TlsServer(("127.0.0.1", 0), _Ok)):
        problems = refusals(port, pki)
        assert "accepted a client without a certificate" in problems, problems
        assert not any(p.startswith("refused a certificate") for p in problems), problems
        assert not any(p.startswith("served plaintext") for p in problems), problems
