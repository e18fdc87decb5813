"""How the binary data path takes bytes from the transport (``scriba.frame_read``).

Reads land in one buffer per thread, reused by every connection; what arrived is handed
on as its own ``bytes``, so a frame body kept after the buffer is reused stays intact.
Real asyncio connections, plain TCP and TLS (whose ``sslproto`` reads into the buffer
through a different path), deliver every byte in order; the bookie's connections and the
client's links are such protocols.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from scriba.bookie.binary_server import BinaryConnection
from scriba.client.binary_link import BinaryLink
from scriba.frame_read import READ_BUFFER_BYTES, BufferedFrames, read_buffer
from scriba.proto import binary as wire
from scriba.testing.pki import TestPki

DEADLINE_S = 30.0


class _Collect(BufferedFrames):
    def __init__(self, *, frames: bool = False) -> None:
        self.chunks: list[bytes] = []
        self.frames: list[memoryview] = []
        self.reader = wire.FrameReader() if frames else None
        self.arrived = asyncio.Event() if _loop_running() else None
        self.want = 0

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        if self.reader is not None:
            self.frames += [body for _, body in self.reader.feed(data)]
        if self.arrived is not None and sum(map(len, self.chunks)) >= self.want:
            self.arrived.set()


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _read(proto: BufferedFrames, data: bytes) -> None:
    """What the loop does for one read: get_buffer, the bytes land in it, buffer_updated."""
    buf = proto.get_buffer(-1)
    buf[: len(data)] = data
    proto.buffer_updated(len(data))


def test_every_read_uses_the_same_buffer_and_hands_on_a_copy() -> None:
    a, b = _Collect(), _Collect()
    assert a.get_buffer(-1).obj is b.get_buffer(-1).obj is read_buffer().obj  # one per thread
    assert len(read_buffer()) == READ_BUFFER_BYTES
    first, second = os.urandom(3000), os.urandom(5000)
    _read(a, first)
    _read(b, second)  # overwrites the start of the buffer
    assert a.chunks == [first] and b.chunks == [second]
    assert all(type(c) is bytes for c in a.chunks + b.chunks)


def test_a_frame_body_outlives_the_reads_after_it() -> None:
    proto = _Collect(frames=True)
    frame = b"".join(bytes(p) for p in wire.encode_error(5, 3, "x" * 900))
    _read(proto, frame[:400])  # a frame split over two reads ...
    _read(proto, frame[400:])
    _read(proto, bytes(7))  # ... then another read (a frame's first bytes) reuses the buffer
    assert len(proto.frames) == 1
    assert wire.decode_error(proto.frames[0]) == (3, "x" * 900)


def test_the_data_path_protocols_read_into_the_reused_buffer() -> None:
    assert issubclass(BinaryConnection, BufferedFrames)
    assert issubclass(BinaryLink, BufferedFrames)
    assert isinstance(BinaryConnection.__new__(BinaryConnection), asyncio.BufferedProtocol)


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
async def test_real_connections_deliver_every_byte_in_order(tls: bool, pki: TestPki) -> None:
    loop = asyncio.get_running_loop()
    sink = _Collect()
    payload = os.urandom(3 * READ_BUFFER_BYTES + 12345)
    sink.want = len(payload)
    server = await loop.create_server(lambda: sink, "127.0.0.1", 0,
                                      ssl=pki.server_tls().load().server_ssl_context() if tls else None)
    transport: asyncio.BaseTransport | None = None
    try:
        async with asyncio.timeout(DEADLINE_S):
            transport, _ = await loop.create_connection(
                asyncio.Protocol, "127.0.0.1", server.sockets[0].getsockname()[1],
                ssl=pki.client_tls(pki.client).load().client_ssl_context() if tls else None,
                server_hostname="localhost" if tls else None)
            assert isinstance(transport, asyncio.WriteTransport)
            pos = 0
            for size in (1, 1024, 70_000, READ_BUFFER_BYTES + 1):  # small and larger than the buffer
                transport.write(payload[pos:pos + size])
                pos += size
            transport.write(payload[pos:])
            assert sink.arrived is not None
            await sink.arrived.wait()
        assert b"".join(sink.chunks) == payload
    finally:
        if transport is not None:
            transport.abort()
        server.close()
        await server.wait_closed()
