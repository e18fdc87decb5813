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
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from tls_deployment import PORTS, Deployment, Row, start_deployment, unclassified
from tls_probe import listening_ports, refusals

from scriba.testing.pki import TestPki

pytestmark = [pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def deployment(pki: TestPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with start_deployment(pki, tmp_path_factory.mktemp("audit")) as d:
        yield d


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
