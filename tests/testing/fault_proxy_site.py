"""What the fault proxy's tests (``test_testing_faults*.py``) share: a threaded TCP echo
server (``EchoServer``: closes its side when the client half-closes, and counts the bytes
each connection brought) and plain-socket helpers, each wait with a deadline (``WAIT_S``
unless told). The fixtures (``echo``, ``proxy_server``, ``tp``) are in ``conftest.py``.
"""

from __future__ import annotations

import select
import socket
import threading
import time

WAIT_S = 5.0


class EchoServer:
    """A threaded TCP echo server; closes its side when the client half-closes."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.conns: list[socket.socket] = []
        self.bytes_in: list[int] = []  # per connection, final once it is in `finished`
        self.finished: set[int] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.conns.append(conn)
                self.bytes_in.append(0)
                index = len(self.conns) - 1
            threading.Thread(target=self._echo, args=(conn, index), daemon=True).start()

    def _echo(self, conn: socket.socket, index: int) -> None:
        try:
            while data := conn.recv(65536):
                with self._lock:
                    self.bytes_in[index] += len(data)
                conn.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self.finished.add(index)
            conn.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone does not
        except OSError:
            pass
        self.sock.close()
        with self._lock:
            for conn in self.conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()
        self._thread.join(WAIT_S)


def addr(listen: str) -> tuple[str, int]:
    host, port = listen.rsplit(":", 1)
    return host, int(port)


def connect(listen: str) -> socket.socket:
    sock = socket.create_connection(addr(listen), timeout=WAIT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exactly(sock: socket.socket, n: int, timeout_s: float = WAIT_S) -> bytes:
    deadline = time.monotonic() + timeout_s
    out = b""
    while len(out) < n:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        data = sock.recv(n - len(out))
        if not data:
            raise EOFError(f"EOF after {len(out)} of {n} bytes")
        out += data
    return out


def recv_until_eof(sock: socket.socket, timeout_s: float = WAIT_S) -> bytes:
    deadline = time.monotonic() + timeout_s
    out = b""
    while True:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        data = sock.recv(65536)
        if not data:
            return out
        out += data


def round_trip_s(sock: socket.socket, payload: bytes = b"ping") -> float:
    start = time.monotonic()
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - start


def still_open_without_data(sock: socket.socket, wait_s: float) -> bool:
    """True if within ``wait_s`` nothing is readable (no data and no EOF/reset)."""
    readable, _, _ = select.select([sock], [], [], wait_s)
    return not readable
