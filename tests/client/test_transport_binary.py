"""The binary data path's fallbacks: a mixed cluster (a bookie without a binary address
is written and read over gRPC, the others over binary links) and a bookie that refuses
every version the client speaks (the client falls back to gRPC for it)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from scriba.client import Client
from scriba.client.binary_transport import BinaryTransport
from scriba.client.transport import TransportConfig
from scriba.entry import Crc32cDigest, master_key, pack_entry, unpack_entry
from scriba.errors import ScribaError, Status
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.proto import binary as wire

PASSWORD = b"mixed"


async def test_mixed_cluster_writes_and_reads_every_bookie_over_its_own_wire(
    bookie_cluster: Any, metadata_uri: str
) -> None:
    bookie_cluster.start_bookies(2)
    old = bookie_cluster.add_bookie(binary=False)  # as a bookie that predates the binary path
    async with Client.connect(metadata_uri) as client:
        transport = client.transport
        assert isinstance(transport, BinaryTransport)
        writer = await client.create_ledger(3, 3, 2, password=PASSWORD)
        ids = await asyncio.gather(*(writer.append(f"m-{k}".encode()) for k in range(200)))
        assert list(ids) == list(range(200))
        await writer.close()
        assert len(writer.metadata.ensembles) == 1, "no bookie was replaced"
        wires = {b.bookie_id: transport.wire_of(BookieId(b.bookie_id)) for b in bookie_cluster.bookies}
        assert wires == {**{b.bookie_id: "binary" for b in bookie_cluster.bookies}, old.bookie_id: "grpc"}
        # the gRPC-only bookie holds every entry (W3): read one straight from it
        raw = await transport.read_entry(BookieId(old.bookie_id), LedgerId(writer.ledger_id), EntryId(199),
                                         master_key=master_key(PASSWORD))
        assert unpack_entry(Crc32cDigest(), raw).payload == b"m-199"
        reader = await client.open_ledger(writer.ledger_id, password=PASSWORD)
        payloads = [e.payload async for e in reader.read(0, 199)]
        assert payloads == [f"m-{k}".encode() for k in range(200)]


async def test_a_bookie_refusing_every_version_is_served_over_grpc(bookie_cluster: Any) -> None:
    (bookie,) = bookie_cluster.start_bookies(1)
    hellos: list[bytes] = []

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hellos.append(await reader.read(64))
        writer.write(b"".join(bytes(p) for p in wire.encode_error(0, int(Status.BAD_REQUEST), "no common version")))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    fake = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    t = BinaryTransport(lambda _: bookie.address, TransportConfig(add_timeout_s=10), resolve_binary=lambda _: fake)
    b = BookieId(bookie.bookie_id)
    key = master_key(b"pw")
    done: asyncio.Future[Status] = asyncio.get_running_loop().create_future()
    try:
        data = pack_entry(Crc32cDigest(), 21, 0, -1, 0, b"fallback")
        t.add(b, LedgerId(21), EntryId(0), key, data, lambda *a: done.set_result(a[3]))
        assert await asyncio.wait_for(done, 20) == Status.OK
        assert hellos and hellos[0][:2] == wire.MAGIC.to_bytes(2, "little")  # it did try binary first
        assert t.wire_of(b) == "grpc" and t.links_opened == 0
        got = await t.read_entry(b, LedgerId(21), EntryId(0), master_key=key)
        assert unpack_entry(Crc32cDigest(), got).payload == b"fallback"
    finally:
        await t.close()
        server.close()
        await server.wait_closed()


async def test_garbage_from_a_bookie_fails_the_link_and_its_adds_unavailable() -> None:
    """The client's decoder (R21): a bookie that answers HELLO, then garbage, breaks the
    link; the adds on it are answered UNAVAILABLE at once (the write core's cue for an
    ensemble change), not after the add timeout."""
    got_add = asyncio.Event()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(wire.HEADER_SIZE + 2)  # HELLO
        writer.write(b"".join(bytes(p) for p in wire.encode_hello_ok(0, wire.VERSION)))
        await reader.read(wire.HEADER_SIZE)  # the ADD's first bytes
        got_add.set()
        writer.write(b"\xff" * 64)
        await writer.drain()
        await reader.read()  # until the client hangs up
        writer.close()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    t = BinaryTransport(lambda _: "127.0.0.1:1", TransportConfig(add_timeout_s=30), resolve_binary=lambda _: address)
    done: asyncio.Future[Status] = asyncio.get_running_loop().create_future()
    try:
        data = pack_entry(Crc32cDigest(), 22, 0, -1, 0, b"x")
        t.add(BookieId("b"), LedgerId(22), EntryId(0), master_key(b"pw"), data, lambda *a: done.set_result(a[3]))
        assert await asyncio.wait_for(done, 10) == Status.UNAVAILABLE  # well before add_timeout_s
        assert got_add.is_set()
    finally:
        await t.close()
        server.close()
        await server.wait_closed()


async def test_explicit_lac_pushes_travel_on_a_version_2_link_and_over_grpc_to_an_older_bookie() -> None:
    """``write_lac`` goes as WRITE_LAC on a link negotiated at version 2; a bookie whose
    link speaks only version 1 gets it over gRPC instead (here a dead gRPC address: the
    push fails there, and the version-1 link never saw a WRITE_LAC)."""
    got: dict[int, list[tuple[int, int, int, bytes]]] = {1: [], 2: []}

    def bookie(version: int) -> Any:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readexactly(wire.HEADER_SIZE + 2)  # HELLO
            writer.write(b"".join(bytes(p) for p in wire.encode_hello_ok(0, version)))
            frames = wire.FrameReader()
            while chunk := await reader.read(65536):
                for header, body in frames.feed(chunk):
                    if header.type == wire.FrameType.WRITE_LAC:
                        got[version].append(wire.decode_write_lac(body))
                        writer.write(b"".join(bytes(p) for p in wire.encode_lac_written(header.request_id, 0)))
            writer.close()
        return serve

    servers = {v: await asyncio.start_server(bookie(v), "127.0.0.1", 0) for v in (1, 2)}
    binary = {BookieId(f"v{v}"): f"127.0.0.1:{s.sockets[0].getsockname()[1]}" for v, s in servers.items()}
    t = BinaryTransport(lambda _: "127.0.0.1:1", TransportConfig(read_timeout_s=3.0), resolve_binary=binary.__getitem__)
    key = master_key(b"pw")
    try:
        await asyncio.wait_for(t.write_lac(BookieId("v2"), LedgerId(31), EntryId(7), key, hint_only=True), 10)
        assert got[2] == [(31, 7, wire.LAC_HINT_ONLY, key)]
        with pytest.raises(ScribaError):  # tried over gRPC: nothing listens there
            await asyncio.wait_for(t.write_lac(BookieId("v1"), LedgerId(31), EntryId(7), key, hint_only=True), 20)
        assert t.wire_of(BookieId("v1")) == "binary" and got[1] == []
    finally:
        await t.close()
        for s in servers.values():
            s.close()
            await s.wait_closed()
