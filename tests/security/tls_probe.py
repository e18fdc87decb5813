"""Protocol-blind probes of a TCP port: does it speak only mutual TLS?

- :func:`handshake_error`: a TLS 1.2 handshake (1.2 so that a server refusing the
  client's certificate says so *inside* the handshake: with 1.3 the refusal comes after
  it, as an alert on the first read) trusting ``ca`` and presenting ``cert`` (or none);
  None when it completes, else the error. The server's name is not checked here (other
  tests check names); its chain is.
- :func:`plaintext_reply`: what the port answers a plaintext HTTP request: a TLS port
  closes, sends a TLS alert (a record of type 21), or (Go's servers) a plaintext
  ``400`` saying an HTTP request reached an HTTPS server. :func:`served_plaintext` says
  whether a reply is anything else (the port served plaintext).
- :func:`listening_ports`: the TCP ports the given processes (and their children)
  listen on, read from ``/proc``: what a deployment really opened, not what it says.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from collections.abc import Iterable
from pathlib import Path

from scriba.certs import Issued
from scriba.testing.pki import TestPki

PROBE_TIMEOUT_S = 20.0
PLAINTEXT_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
TLS_ALERT = 0x15
_LISTEN = "0A"


def handshake_error(port: int, ca: Path, cert: Path | None = None, key: Path | None = None) -> str | None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # the chain is verified (CERT_REQUIRED); names are other tests' business
    ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(cafile=str(ca))
    ctx.set_alpn_protocols(["h2", "http/1.1"])  # gRPC servers want h2
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT_S) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1"):
            return None
    except (ssl.SSLError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"


def plaintext_reply(port: int) -> bytes | None:
    """The bytes a plaintext request gets back until the server closes (None: no close
    within the deadline: the server waits for more, as a plaintext server would)."""
    got = b""
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT_S) as s:
        try:
            s.sendall(PLAINTEXT_REQUEST)
            while (left := deadline - time.monotonic()) > 0:
                s.settimeout(left)
                chunk = s.recv(4096)
                if not chunk:
                    return got
                got += chunk
        except (ConnectionResetError, BrokenPipeError):
            return got
        except TimeoutError:
            return None if not got else got
    return None


def served_plaintext(reply: bytes | None) -> bool:
    if reply is None:
        return True  # it kept waiting: not a TLS server's answer to garbage
    if not reply or reply[0] == TLS_ALERT:
        return False
    return not (reply.startswith(b"HTTP/1.0 400") and b"HTTPS server" in reply)


def refusals(port: int, pki: TestPki, good: Issued | None = None) -> list[str]:
    """What is wrong with ``port`` as a mutual-TLS port (empty: nothing): it must serve
    ``good`` (default: the test CA's client certificate) and refuse plaintext, no
    certificate and a certificate from another CA."""
    problems = []
    own = good or pki.client
    if (error := handshake_error(port, pki.ca.cert, own.cert, own.key)) is not None:
        problems.append(f"refused a certificate the CA signed ({error})")
    if handshake_error(port, pki.ca.cert) is None:
        problems.append("accepted a client without a certificate")
    if handshake_error(port, pki.ca.cert, pki.stranger.cert, pki.stranger.key) is None:
        problems.append("accepted a certificate from another CA")
    reply = plaintext_reply(port)
    if served_plaintext(reply):
        problems.append(f"served plaintext: {reply[:80] if reply is not None else 'kept the connection open'}")
    return problems


# --- what is listening ----------------------------------------------------------------------


def _children(pids: Iterable[int]) -> set[int]:
    """``pids`` and all their descendants."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent_of[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found = set(pids)
    grew = True
    while grew:
        more = {p for p, parent in parent_of.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return found


def _listening_inodes() -> dict[int, int]:
    """Socket inode -> port of every listening TCP socket (v4 and v6)."""
    out: dict[int, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == _LISTEN:
                out[int(fields[9])] = int(fields[1].rsplit(":", 1)[1], 16)
    return out


def listening_ports(pids: Iterable[int]) -> dict[int, int]:
    """Port -> pid of every TCP port the processes ``pids`` (and their children) listen on."""
    inodes = _listening_inodes()
    ports: dict[int, int] = {}
    for pid in _children(pids):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and int(target[8:-1]) in inodes:
                ports[inodes[int(target[8:-1])]] = pid
    return ports
