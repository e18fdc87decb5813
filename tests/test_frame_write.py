"""How the binary data path's frames reach the wire (``scriba.frame_write``).

Over TLS a frame of many parts must leave as few full records, not one record per part
(asyncio's TLS transport seals each buffer of ``writelines`` on its own): a TCP relay
between a real asyncio TLS client and server parses the TLS record headers that cross
it and counts them. Over plain TCP the parts go to ``writelines`` untouched. Either
way, every byte of the frame arrives, in order.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
from collections.abc import Sequence
from typing import Any

import pytest

from scriba import tls_server, tls_socket
from scriba.frame_write import TLS_WRITE_BYTES, frame_writer, is_tls
from scriba.proto import binary as wire
from scriba.testing.pki import TestPki

DEADLINE_S = 30.0
TLS_RECORD_BYTES_MAX = 16 * 1024
_APPLICATION_DATA = 23  # TLS 1.3 seals everything after the hellos in this content type


def frame_of(entries: int, entry_bytes: int = 1024) -> list[wire.Buffer]:
    """An ADD frame of one run of ``entries`` entries, as the client hands it to the wire."""
    parts: list[wire.Buffer] = []
    wire.encode_run(7, 0, b"key", list(range(entries)),
                    [bytes([i % 251]) * entry_bytes for i in range(entries)], parts)
    return wire.encode_frame(wire.FrameType.ADD, 1, parts)


class _Transport:
    """A transport stub: records ``write`` and ``writelines`` calls."""

    def __init__(self, sslcontext: ssl.SSLContext | None) -> None:
        self.sslcontext = sslcontext
        self.writes: list[bytes] = []
        self.writelines_calls: list[list[Any]] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.sslcontext if name == "sslcontext" else default

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts: Sequence[Any]) -> None:
        self.writelines_calls.append(list(parts))


def test_over_tls_the_parts_are_joined_into_writes_of_bounded_size() -> None:
    frame = frame_of(200)
    stub = _Transport(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
    assert is_tls(stub)  # type: ignore[arg-type]
    frame_writer(stub)(frame)  # type: ignore[arg-type]
    total = sum(map(len, frame))
    assert b"".join(stub.writes) == b"".join(frame)  # every byte, in order
    assert not stub.writelines_calls
    assert len(stub.writes) == -(-total // TLS_WRITE_BYTES)  # few writes, not one per part (203 parts)
    assert all(len(w) < TLS_WRITE_BYTES + 1024 for w in stub.writes)  # none grows with the message


def test_over_plain_tcp_the_parts_go_to_writelines_as_they_are() -> None:
    frame = frame_of(20)
    stub = _Transport(None)
    assert not is_tls(stub)  # type: ignore[arg-type]
    frame_writer(stub)(frame)  # type: ignore[arg-type]
    assert stub.writelines_calls == [frame]
    assert not stub.writes


def test_a_small_frame_is_one_write() -> None:
    frame = wire.encode_hello()
    stub = _Transport(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
    frame_writer(stub)(frame)  # type: ignore[arg-type]
    assert stub.writes == [b"".join(frame)]


class _Sink(asyncio.Protocol):
    """The TLS server's side: collects the plaintext."""

    def __init__(self, received: bytearray, got: asyncio.Event, want: list[int]) -> None:
        self.received, self.got, self.want = received, got, want

    def data_received(self, data: bytes) -> None:
        self.received += data
        if self.want and len(self.received) >= self.want[0]:
            self.got.set()


class _Relay:
    """A TCP relay client -> server that counts the TLS records it carries that way."""

    def __init__(self, server_port: int) -> None:
        self.server_port = server_port
        self.records: list[tuple[int, int]] = []  # (content type, length)
        self._pending = b""
        self._tasks: set[asyncio.Task[None]] = set()

    def count(self, data: bytes) -> None:
        buf = self._pending + data
        pos = 0
        while len(buf) - pos >= 5:
            ctype, _version, length = struct.unpack_from("!BHH", buf, pos)
            if len(buf) - pos < 5 + length:
                break
            self.records.append((ctype, length))
            pos += 5 + length
        self._pending = buf[pos:]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counted: bool) -> None:
        try:
            while data := await reader.read(65536):
                if counted:
                    self.count(data)
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.server_port)
        await asyncio.gather(self._pipe(reader, up_writer, True), self._pipe(up_reader, writer, False))


@pytest.mark.parametrize("how", ["sslproto", "tls_socket"])
async def test_a_frame_of_many_entries_crosses_tls_in_full_records(pki: TestPki, how: str) -> None:
    """Through asyncio's TLS transport and through ``scriba.tls_socket``'s (the data path's)."""
    loop = asyncio.get_running_loop()
    received, got, want = bytearray(), asyncio.Event(), [0]
    server_context = pki.server_tls().load().server_ssl_context()
    client_context = pki.client_tls(pki.client).load().client_ssl_context()
    server: asyncio.Server | tls_server.TlsServer
    if how == "sslproto":
        server = await loop.create_server(lambda: _Sink(received, got, want), "127.0.0.1", 0, ssl=server_context)
    else:
        server = await tls_server.start_server(lambda: _Sink(received, got, want), "127.0.0.1", 0,
                                               ssl_context=server_context)
    relay = _Relay(server.sockets[0].getsockname()[1])
    relay_server = await asyncio.start_server(relay.serve, "127.0.0.1", 0)
    transport: asyncio.BaseTransport | None = None
    try:
        async with asyncio.timeout(DEADLINE_S):
            relay_port = relay_server.sockets[0].getsockname()[1]
            if how == "sslproto":
                transport, _ = await loop.create_connection(
                    asyncio.Protocol, "127.0.0.1", relay_port, ssl=client_context, server_hostname="localhost")
            else:
                transport, _ = await tls_socket.open_connection(
                    asyncio.Protocol, "127.0.0.1", relay_port, ssl_context=client_context,
                    server_hostname="localhost")
            hello = wire.encode_hello()  # one small frame first: the handshake's records are then behind us
            want[0] = sum(map(len, hello))
            frame_writer(transport)(hello)  # type: ignore[arg-type]
            await got.wait()
            before = len(relay.records)
            frame = frame_of(200)
            total = sum(map(len, frame))
            got.clear()
            want[0] += total
            frame_writer(transport)(frame)  # type: ignore[arg-type]
            await got.wait()
        assert bytes(received) == b"".join(hello) + b"".join(frame)
        sealed = [length for ctype, length in relay.records[before:] if ctype == _APPLICATION_DATA]
        writes = -(-total // TLS_WRITE_BYTES)
        # full records: at most one short record per write (written part by part: 203 records)
        assert len(sealed) <= -(-total // TLS_RECORD_BYTES_MAX) + writes, sealed
    finally:
        if transport is not None:
            transport.abort()
        relay_server.close()
        server.close()
        await relay_server.wait_closed()
        await server.wait_closed()


@pytest.mark.parametrize("entries", [1, 63, 64, 65, 500])
def test_joined_writes_keep_every_byte_in_order(entries: int) -> None:
    frame = frame_of(entries, entry_bytes=1000)
    stub = _Transport(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
    frame_writer(stub)(frame)  # type: ignore[arg-type]
    assert b"".join(stub.writes) == b"".join(frame)
