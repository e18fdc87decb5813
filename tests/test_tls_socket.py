"""TLS on a non-blocking ``SSLSocket`` (``scriba.tls_socket``): the transport of the
binary data path's TLS connections, between real sockets on 127.0.0.1.

Every byte arrives, in order, through writes that OpenSSL made wait; a protocol that
pauses its reading while OpenSSL still holds decrypted bytes gets them on resuming;
``close`` sends what is queued (and what the write buffer holds) before its
close_notify; the records of one write leave with one system call; failed and silent
handshakes end on the server without stopping it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from pathlib import Path

import pytest

from scriba import tls_server, tls_socket, tls_write_buffer
from scriba.testing.pki import TestPki
from scriba.tls_read_ahead import read_ahead

DEADLINE_S = 30.0


class Collect(asyncio.BufferedProtocol):
    """Keeps what arrives; optionally reads through a tiny buffer and pauses after each read."""

    def __init__(self, *, buffer_bytes: int = 256 * 1024, pause_each: bool = False) -> None:
        self.buf = bytearray(buffer_bytes)
        self.received = bytearray()
        self.pause_each = pause_each
        self.transport: asyncio.Transport | None = None
        self.changed = asyncio.Event()
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self.eof = False
        self.paused_writing = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        self.received += self.buf[:nbytes]
        self.changed.set()
        if self.pause_each and self.transport is not None:
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self.eof = True
        return False

    def pause_writing(self) -> None:
        self.paused_writing += 1

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)
        self.changed.set()


async def _until(proto: Collect, size: int) -> None:
    while len(proto.received) < size and not proto.lost.done():
        proto.changed.clear()
        await proto.changed.wait()


async def _pair(pki: TestPki, server_proto: Collect, **server_options: float) -> tuple[
        tls_server.TlsServer, tls_socket.TlsSocketTransport, Collect]:
    server = await tls_server.start_server(lambda: server_proto, "127.0.0.1", 0,
                                           ssl_context=pki.server_tls().load().server_ssl_context(), **server_options)
    port = server.sockets[0].getsockname()[1]
    transport, client = await tls_socket.open_connection(
        Collect, "127.0.0.1", port, ssl_context=pki.client_tls(pki.client).load().client_ssl_context(),
        server_hostname="localhost")
    return server, transport, client


async def test_bursts_of_writes_arrive_whole_and_in_order_under_flow_control(pki: TestPki) -> None:
    server_proto = Collect()
    server, transport, client = await _pair(pki, server_proto)
    try:
        async with asyncio.timeout(DEADLINE_S):
            rng = __import__("random").Random(7)
            sent = bytearray()
            for _ in range(400):  # ~25 MiB without waiting: OpenSSL must hold and retry writes
                chunk = os.urandom(rng.randint(1, 128 * 1024))
                sent += chunk
                transport.write(chunk)
            assert client.paused_writing >= 1, "the queue never passed the high-water mark"
            assert transport.get_write_buffer_size() > 0
            await _until(server_proto, len(sent))
        assert bytes(server_proto.received) == bytes(sent)
        assert transport.get_write_buffer_size() == 0
        assert server_proto.transport is not None
        assert server_proto.transport.get_extra_info("peercert") is not None  # mutual TLS: the client's certificate
        assert transport.get_extra_info("sslcontext") is not None
    finally:
        transport.abort()
        server.close()
        await server.wait_closed()


async def test_resuming_a_paused_reader_delivers_what_openssl_already_holds(pki: TestPki) -> None:
    server_proto = Collect(buffer_bytes=100, pause_each=True)  # a 16 KiB record is read 100 bytes at a time
    server, transport, _client = await _pair(pki, server_proto)
    try:
        payload = os.urandom(40_000)
        transport.write(payload)  # then nothing more: the socket falls silent once OpenSSL has the records
        async with asyncio.timeout(DEADLINE_S):
            while len(server_proto.received) < len(payload):
                await _until(server_proto, len(server_proto.received) + 1)
                assert server_proto.transport is not None
                assert not server_proto.transport.is_reading()
                server_proto.transport.resume_reading()
        assert bytes(server_proto.received) == payload
    finally:
        transport.abort()
        server.close()
        await server.wait_closed()


async def test_records_read_ahead_with_the_handshake_reach_the_protocol(pki: TestPki) -> None:
    """The client's Finished and its first record arrive in one segment; the server's
    handshake reads both (read-ahead), and the socket never signals the record again."""
    server_proto = Collect()
    server_ctx = pki.server_tls().load().server_ssl_context()
    server = await tls_server.start_server(lambda: server_proto, "127.0.0.1", 0, ssl_context=server_ctx)
    assert read_ahead(server_ctx) is True
    loop = asyncio.get_running_loop()
    raw = socket.create_connection(server.sockets[0].getsockname()[:2])
    raw.setblocking(False)
    try:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = pki.client_tls(pki.client).load().client_ssl_context().wrap_bio(
            incoming, outgoing, server_hostname="localhost")
        payload = os.urandom(1000)
        async with asyncio.timeout(DEADLINE_S):
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    await loop.sock_sendall(raw, outgoing.read())
                    data = await loop.sock_recv(raw, 65536)
                    assert data, "the server closed during the handshake"
                    incoming.write(data)
            tls.write(payload)
            await loop.sock_sendall(raw, outgoing.read())  # the Finished and the record, in one write
            await _until(server_proto, len(payload))
        assert bytes(server_proto.received) == payload
    finally:
        raw.close()
        server.close()
        await server.wait_closed()


async def test_close_sends_what_is_queued_then_ends_cleanly(pki: TestPki) -> None:
    server_proto = Collect()
    server, transport, _client = await _pair(pki, server_proto)
    try:
        payload = os.urandom(32 * 1024 * 1024)  # more than loopback socket buffers hold
        transport.write(payload)
        assert transport.get_write_buffer_size() > 0, "all of it left at once: nothing queued to test"
        transport.close()
        assert transport.is_closing()
        async with asyncio.timeout(DEADLINE_S):
            exc = await server_proto.lost
        assert bytes(server_proto.received) == payload
        assert server_proto.eof and exc is None  # a close_notify: the end, not an error
    finally:
        server.close()
        await server.wait_closed()


async def test_a_refused_handshake_leaves_the_server_serving(pki: TestPki) -> None:
    server_proto = Collect()
    made: list[Collect] = []

    def factory() -> Collect:
        made.append(server_proto)
        return server_proto

    server = await tls_server.start_server(factory, "127.0.0.1", 0,
                                           ssl_context=pki.server_tls().load().server_ssl_context())
    port = server.sockets[0].getsockname()[1]
    try:
        async with asyncio.timeout(DEADLINE_S):
            stranger_trust = pki.client_tls(pki.client, ca=pki.stranger.cert).load().client_ssl_context()
            with pytest.raises(ssl.SSLCertVerificationError):  # the client does not trust the server
                await tls_socket.open_connection(Collect, "127.0.0.1", port, ssl_context=stranger_trust,
                                                 server_hostname="localhost")
            no_cert = pki.client_tls().load().client_ssl_context()  # the server requires a certificate
            try:
                transport, client = await tls_socket.open_connection(Collect, "127.0.0.1", port,
                                                                     ssl_context=no_cert, server_hostname="localhost")
            except OSError:
                pass  # refused during the handshake
            else:  # TLS 1.3: the client finishes first; the server's alert ends the connection
                transport.write(b"not for you")
                assert isinstance(await client.lost, ssl.SSLError)
            assert not made, "a connection without a trusted certificate reached the protocol"
            good, client = await tls_socket.open_connection(
                Collect, "127.0.0.1", port, ssl_context=pki.client_tls(pki.client).load().client_ssl_context(),
                server_hostname="localhost")
            good.write(b"hello")
            await _until(server_proto, 5)
        assert bytes(server_proto.received) == b"hello" and len(made) == 1
        good.abort()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_silent_client_is_dropped_after_the_handshake_timeout(pki: TestPki) -> None:
    server = await tls_server.start_server(Collect, "127.0.0.1", 0, handshake_timeout_s=0.5,
                                           ssl_context=pki.server_tls().load().server_ssl_context())
    port = server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    raw = socket.socket()
    raw.setblocking(False)
    try:
        async with asyncio.timeout(DEADLINE_S):
            await loop.sock_connect(raw, ("127.0.0.1", port))
            assert await loop.sock_recv(raw, 100) == b""  # the server hung up on a handshake that never came
    finally:
        raw.close()
        server.close()
        await server.wait_closed()


async def test_a_closed_server_refuses_new_connections(pki: TestPki) -> None:
    server = await tls_server.start_server(Collect, "127.0.0.1", 0,
                                           ssl_context=pki.server_tls().load().server_ssl_context())
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(ConnectionRefusedError):
        async with asyncio.timeout(DEADLINE_S):
            await tls_socket.open_connection(Collect, "127.0.0.1", port,
                                             ssl_context=pki.client_tls(pki.client).load().client_ssl_context(),
                                             server_hostname="localhost")


def test_the_data_path_can_be_put_back_on_sslproto(monkeypatch: pytest.MonkeyPatch) -> None:
    assert tls_socket.use_tls_socket()
    monkeypatch.setenv("SCRIBA_TLS_TRANSPORT", "asyncio")
    assert not tls_socket.use_tls_socket()


def _write_calls_of_this_thread() -> int:
    """The ``write`` system calls this thread has made (``syscw`` in /proc/thread-self/io).
    OpenSSL writes its socket with ``write``, counted there (Python's ``send`` is not)."""
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    raise AssertionError("no syscw in /proc/thread-self/io")


@pytest.mark.parametrize("buffered", [True, False], ids=["write-buffer", "no-write-buffer"])
async def test_the_records_of_one_write_leave_with_one_system_call(pki: TestPki, monkeypatch: pytest.MonkeyPatch,
                                                                   buffered: bool) -> None:
    """``scriba.tls_write_buffer``; without it (the counter's negative control) OpenSSL
    makes one call per record."""
    if not buffered:
        monkeypatch.setattr(tls_socket, "attach_write_buffer", lambda sock, context: None)
    server_proto = Collect()
    server, transport, _client = await _pair(pki, server_proto)
    try:
        assert (transport._write_buffer is not None) is buffered
        payload = os.urandom(64 * 1024)  # four records of 16 KiB
        before = _write_calls_of_this_thread()
        transport.write(payload)
        calls = _write_calls_of_this_thread() - before
        async with asyncio.timeout(DEADLINE_S):
            await _until(server_proto, len(payload))
        assert bytes(server_proto.received) == payload
        assert calls == (1 if buffered else 4)
    finally:
        transport.abort()
        server.close()
        await server.wait_closed()


class _Stalled(Collect):
    """Does not read until told to: what is written piles up in the socket buffers."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        transport.pause_reading()  # type: ignore[attr-defined]
        self.changed.set()


async def test_close_sends_what_the_write_buffer_holds_first(pki: TestPki) -> None:
    """A write OpenSSL took whole, whose flush the full socket stopped: nothing is queued,
    the rest is in the write buffer, and ``close`` must still send it before the end."""
    server_proto = _Stalled()
    server, transport, _client = await _pair(pki, server_proto)
    try:
        async with asyncio.timeout(DEADLINE_S):
            while server_proto.transport is None:
                server_proto.changed.clear()
                await server_proto.changed.wait()
        assert transport._write_buffer is not None
        sent = bytearray()
        for _ in range(2000):  # at most 125 MiB; loopback's socket buffers hold a few MiB
            chunk = os.urandom(64 * 1024)
            transport.write(chunk)
            sent += chunk
            if transport._flush_pending:
                break
        assert transport._flush_pending, "the socket took everything: nothing left in the buffer to test"
        assert transport.get_write_buffer_size() == 0  # nothing queued: the rest is in the write buffer
        assert transport._write_buffer.pending() > 0
        transport.close()
        server_proto.transport.resume_reading()  # type: ignore[union-attr]
        async with asyncio.timeout(DEADLINE_S):
            exc = await server_proto.lost
        assert len(server_proto.received) == len(sent)
        assert bytes(server_proto.received) == bytes(sent)
        assert server_proto.eof and exc is None  # a close_notify after the data, not an error
    finally:
        transport.abort()
        server.close()
        await server.wait_closed()


async def test_a_pointer_that_is_not_proved_leaves_openssl_writing_the_socket(
        pki: TestPki, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tls_write_buffer._load()
    assert lib is not None
    monkeypatch.setattr(lib, "get_fd", lambda pointer: -1)  # (a layout not recognised)
    monkeypatch.setattr(tls_write_buffer, "_unavailable", None)
    swapped: list[object] = []
    monkeypatch.setattr(lib, "set0_wbio", lambda *args: swapped.append(args))
    server_proto = Collect()
    server, transport, _client = await _pair(pki, server_proto)
    try:
        assert transport._write_buffer is None
        assert swapped == []  # nothing was written through the unproved pointer
        assert tls_write_buffer._unavailable == "PySSLSocket layout not recognised"
        payload = os.urandom(256 * 1024)
        transport.write(payload)
        async with asyncio.timeout(DEADLINE_S):
            await _until(server_proto, len(payload))
        assert bytes(server_proto.received) == payload
    finally:
        transport.abort()
        server.close()
        await server.wait_closed()
