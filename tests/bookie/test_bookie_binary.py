"""The bookie's binary listener (R21 for the binary decoder): malformed, truncated,
oversized and generated frames never crash it; a protocol error closes that connection
with an ERROR frame and a logged reason, and the bookie keeps serving everyone else.

One in-process bookie (memory:// metadata, in-memory storage) on a private event loop,
as in test_bookie_fuzz.py; Hypothesis drives the generated frames.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import struct
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scriba.bookie.config import BookieConfig
from scriba.bookie.memory_storage import InMemoryLedgerStorage
from scriba.bookie.server import Bookie
from scriba.bookie.storage_api import LedgerStorage, StorageConfig
from scriba.entry import Crc32cDigest, master_key, pack_entry
from scriba.errors import Status
from scriba.proto import binary as wire
from scriba.proto.binary import FrameReader, FrameType
from scriba.testing.hygiene import captured_logs

KEY = master_key(b"pw")
STATUSES = {int(s) for s in Status if int(s) <= int(Status.UNAVAILABLE)}
FRAME_CAP = 1024 * 1024 + 8192  # the in-process bookie's cap (inflight bound + 1 MiB)


class Harness:
    """The bookie and its private loop."""

    def __init__(self, tmp_path: Path, binary_ssl: ssl.SSLContext | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)

        async def factory(config: StorageConfig) -> LedgerStorage:
            return InMemoryLedgerStorage(entry_size_max=4096)

        config = BookieConfig(
            metadata_uri=f"memory://bin-{uuid.uuid4().hex[:8]}", data_dir=tmp_path / "data", listen_port=0,
            bookie_id="bin", entry_size_max=4096, long_poll_timeout_ms_max=20, read_range_bytes_max=8192,
            read_range_entries_max=16, inflight_bytes_per_connection_max=4096 * 2,
        )
        self.bookie = Bookie(config, storage_factory=factory, binary_ssl=binary_ssl)
        self.loop.run_until_complete(self.bookie.start())
        host, _, port = self.bookie.binary_address.rpartition(":")
        self.host, self.port = host, int(port)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, 20))

    async def exchange(self, data: bytes, *, hello: bool = True, close_after_send: bool = False,
                       want: int = 1) -> tuple[list[tuple[wire.Header, memoryview]], bool]:
        """Send ``data`` on a fresh connection (after HELLO); the frames received until
        ``want`` non-HELLO frames came or the bookie closed, and whether it closed."""
        reader, writer = await asyncio.open_connection(self.host, self.port)
        frames: list[tuple[wire.Header, memoryview]] = []
        closed = False
        try:
            if hello:
                writer.write(b"".join(bytes(p) for p in wire.encode_hello()))
            writer.write(data)
            if close_after_send:
                writer.write_eof()
            parser = FrameReader()
            errored = False  # after an ERROR frame: read on to the bookie's close
            while errored or sum(1 for h, _ in frames if h.type != FrameType.HELLO_OK) < want:
                chunk = await reader.read(65536)
                if not chunk:
                    closed = True
                    break
                frames += parser.feed(chunk)
                errored = any(h.type == FrameType.ERROR for h, _ in frames)
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass
        return frames, closed

    def close(self) -> None:
        self.loop.run_until_complete(self.bookie.stop())
        self.loop.close()
        asyncio.set_event_loop(None)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    try:
        yield h
    finally:
        h.close()


def b(parts: list[wire.Buffer]) -> bytes:
    return b"".join(bytes(p) for p in parts)


def add_frame(ledger_id: int, entry_ids: list[int], rid: int = 7, key: bytes = KEY) -> bytes:
    entries = [pack_entry(Crc32cDigest(), ledger_id, e, e - 1, 0, b"x" * 10) for e in entry_ids]
    parts: list[wire.Buffer] = []
    wire.encode_run(ledger_id, 0, key, entry_ids, entries, parts)
    return b(wire.encode_frame(FrameType.ADD, rid, parts))


def answered_ok(h: Harness, ledger_id: int, entry_id: int) -> bool:
    frames, _ = h.run(h.exchange(add_frame(ledger_id, [entry_id])))
    answers = [a for hd, body in frames if hd.type == FrameType.ADD_ACK for a in wire.decode_add_ack(body)]
    return [(a.ledger_id, list(a.entry_ids), a.status) for a in answers] == [(ledger_id, [entry_id], 0)]


BAD_INPUTS = {
    "garbage": (b"\xde\xad\xbe\xef" * 10, True, "bad magic"),
    "bad_version": (struct.pack("<HBBHIQ", wire.MAGIC, 77, FrameType.ADD, 0, 0, 1), True, "unsupported version"),
    "unknown_type": (struct.pack("<HBBHIQ", wire.MAGIC, 1, 99, 0, 0, 1), True, "unknown frame type"),
    "oversized": (struct.pack("<HBBHIQ", wire.MAGIC, 1, FrameType.ADD, 0, FRAME_CAP + 1, 1), True, "exceeds the cap"),
    "answer_type_sent": (b(wire.encode_add_ack(1, [(1, [0], 0, "")])), True, "not a request"),
    "add_body_garbage": (b(wire.encode_frame(FrameType.ADD, 3, [b"\x01\x02\x03"])), True, "truncated"),
    "add_before_hello": (add_frame(5, [0]), False, "expected HELLO"),
    "no_common_version": (b(wire.encode_frame(FrameType.HELLO, 0, [struct.pack("<BB", 9, 12)], version=1)), False,
                          "no common version"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_protocol_errors_close_the_connection_with_a_logged_reason(harness: Harness, name: str) -> None:
    data, hello, reason = BAD_INPUTS[name]
    with captured_logs() as logs:
        frames, closed = harness.run(harness.exchange(data, hello=hello))
    assert closed, f"{name}: the connection stayed open"
    errors = [wire.decode_error(body) for hd, body in frames if hd.type == FrameType.ERROR]
    assert len(errors) == 1 and errors[0][0] == Status.BAD_REQUEST and reason in errors[0][1], errors
    rejected = [e for e in logs if e["event"] == "binary_frame_rejected"]
    assert len(rejected) == 1 and reason in rejected[0]["reason"], logs
    assert answered_ok(harness, 11, 0), "the bookie stopped serving after a bad connection"


def test_truncated_frame_then_hangup_leaves_the_bookie_serving(harness: Harness) -> None:
    whole = add_frame(12, [0, 1, 2])
    for cut in (5, wire.HEADER_SIZE, len(whole) - 1):
        frames, closed = harness.run(harness.exchange(whole[:cut], close_after_send=True))
        assert closed and not [f for f in frames if f[0].type == FrameType.ADD_ACK]  # nothing half-parsed is stored
    assert answered_ok(harness, 12, 0)


def test_requests_get_typed_statuses_not_protocol_errors(harness: Harness) -> None:
    """Request-level problems travel as statuses on an open connection, as on gRPC."""
    assert answered_ok(harness, 13, 0)
    wrong_key, _ = harness.run(harness.exchange(add_frame(13, [1], key=master_key(b"other"))))
    (answer,) = wire.decode_add_ack(wrong_key[-1][1])
    assert answer.status == Status.UNAUTHORIZED and answer.message
    read, closed = harness.run(harness.exchange(b(wire.encode_read_entry(4, 999, 0, 0, b""))))
    status, _, message, _ = wire.decode_entry_answer(read[-1][1])
    assert status == Status.NO_SUCH_LEDGER and message and not closed
    fence, _ = harness.run(harness.exchange(b(wire.encode_read_lac(5, 13, wire.READ_FENCE, -1, 0, b""))))
    assert wire.decode_lac_answer(fence[-1][1]).status == Status.BAD_REQUEST  # FENCE needs the key
    chunks, _ = harness.run(harness.exchange(b(wire.encode_read_range(6, 13, 0, 5, 100, 1 << 20, KEY)), want=2))
    (h1, c1), (h2, c2) = [(hd, wire.decode_range_chunk(body)) for hd, body in chunks if hd.type == FrameType.RANGE_CHUNK]
    assert (c1.status, c1.first_entry_id, len(c1.sizes), bool(h1.flags & wire.FLAG_MORE)) == (0, 0, 1, True)
    assert (c2.status, c2.first_entry_id, len(c2.sizes), bool(h2.flags & wire.FLAG_MORE)) == (
        Status.NO_SUCH_ENTRY, 1, 0, False)


def test_write_lac_raises_the_lac_on_a_version_2_link_and_is_refused_on_a_version_1_link(harness: Harness) -> None:
    """The writer's explicit LAC push over the binary path (version 2): a hint raises the
    LAC a plain LAC read then shows; a wrong key is a status; a link negotiated at
    version 1 (an older client) never sends it, and a bookie treats it as a protocol error."""
    frames, _ = harness.run(harness.exchange(add_frame(15, [0, 1, 2])))
    assert [a.status for hd, bd in frames if hd.type == FrameType.ADD_ACK for a in wire.decode_add_ack(bd)] == [0]
    push = b(wire.encode_write_lac(21, 15, 2, wire.LAC_HINT_ONLY, KEY)) + b(wire.encode_read_lac(22, 15, 0, -1, 0, KEY))
    frames, closed = harness.run(harness.exchange(push, want=2))
    (written,) = [wire.decode_lac_written(bd) for hd, bd in frames if hd.type == FrameType.LAC_WRITTEN]
    (lac,) = [wire.decode_lac_answer(bd) for hd, bd in frames if hd.type == FrameType.LAC]
    assert written == (0, "") and (lac.status, lac.lac) == (0, 2) and not closed
    frames, _ = harness.run(harness.exchange(b(wire.encode_write_lac(23, 15, 2, wire.LAC_HINT_ONLY, b"other"))))
    status, message = wire.decode_lac_written(frames[-1][1])
    assert status == Status.UNAUTHORIZED and message
    old_client = b(wire.encode_hello(1, 1)) + b(wire.encode_write_lac(24, 15, 2, wire.LAC_HINT_ONLY, KEY))
    frames, closed = harness.run(harness.exchange(old_client, hello=False))
    (hello,) = [wire.decode_hello_ok(bd) for hd, bd in frames if hd.type == FrameType.HELLO_OK]
    errors = [wire.decode_error(bd) for hd, bd in frames if hd.type == FrameType.ERROR]
    assert hello[:2] == (0, 1) and closed and len(errors) == 1 and "version 1" in errors[0][1], (hello, errors)


u64 = st.one_of(st.integers(0, 5), st.integers(0, (1 << 64) - 1))
i64 = st.one_of(st.integers(-3, 10), st.integers(-(1 << 63), (1 << 63) - 1))
u32 = st.one_of(st.integers(0, 3), st.integers(0, (1 << 32) - 1))


@st.composite
def add_body(draw: st.DrawFn) -> bytes:
    """Runs of well-formed or damaged entries, counts and sizes that may not add up."""
    parts: list[wire.Buffer] = []
    for _ in range(draw(st.integers(1, 3))):
        lid = draw(st.integers(0, 5))
        eids = draw(st.lists(st.integers(0, 10), max_size=4))
        entries = [pack_entry(Crc32cDigest(), lid, e, e - 1, 0, draw(st.binary(max_size=50)))
                   if draw(st.booleans()) else draw(st.binary(max_size=60)) for e in eids]
        key = draw(st.sampled_from([KEY, b"", b"k"]))
        wire.encode_run(lid, draw(u32), key, eids, entries, parts)
    body = b"".join(bytes(p) for p in parts)
    if draw(st.integers(0, 3)) == 0:  # damage: cut or extend the body
        body = body[: draw(st.integers(0, len(body)))] + draw(st.binary(max_size=8))
    return body


frames = st.one_of(
    st.tuples(st.just(FrameType.ADD), add_body()),
    st.tuples(st.just(FrameType.READ_ENTRY), st.builds(lambda *a: struct.pack("<QqIH", *a, 0), u64, i64, u32)),
    st.tuples(st.just(FrameType.READ_RANGE), st.builds(lambda *a: struct.pack("<QqqIQ", *a), u64, i64, i64, u32,
                                                        st.one_of(st.integers(0, 5000), u64))),
    st.tuples(st.just(FrameType.READ_LAC), st.builds(lambda *a: struct.pack("<QIqIH", *a, 0), u64, u32, i64,
                                                      st.integers(0, 30))),
    st.tuples(st.sampled_from(list(FrameType)), st.binary(max_size=64)),
)


def test_generated_frames_are_answered_or_refused_and_the_bookie_keeps_serving(harness: Harness) -> None:
    outcomes: set[str] = set()

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(frames)
    def check(item: tuple[int, bytes]) -> None:
        ftype, body = item
        got, closed = harness.run(harness.exchange(b(wire.encode_frame(ftype, 9, [body]))))
        answers = [(hd, bd) for hd, bd in got if hd.type != FrameType.HELLO_OK]
        if closed and not answers:
            return  # nothing to answer (a frame type the bookie never answers gets ERROR first)
        assert answers, "neither answered nor closed"
        hd, bd = answers[-1]
        if hd.type == FrameType.ERROR:
            outcomes.add("refused")
            status, message = wire.decode_error(bd)
            assert closed and status == Status.BAD_REQUEST and message
            return
        outcomes.add("answered")
        assert hd.request_id == 9
        if hd.type == FrameType.ADD_ACK:
            runs = wire.decode_add(body)
            answered = sorted((a.ledger_id, e) for a in wire.decode_add_ack(bd) for e in a.entry_ids)
            assert answered == sorted((r.ledger_id, e) for r in runs for e in r.entry_ids)  # every add once
            assert all(a.status in STATUSES for a in wire.decode_add_ack(bd))
        elif hd.type == FrameType.RANGE_CHUNK:
            assert wire.decode_range_chunk(bd).status in STATUSES
        elif hd.type == FrameType.LAC:
            assert wire.decode_lac_answer(bd).status in STATUSES
        elif hd.type == FrameType.LAC_WRITTEN:
            assert wire.decode_lac_written(bd)[0] in STATUSES
        else:
            assert hd.type == FrameType.ENTRY and wire.decode_entry_answer(bd)[0] in STATUSES

    check()
    assert outcomes == {"answered", "refused"}, outcomes
    assert answered_ok(harness, 14, 0)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for a test certificate")
def test_tls_hook_serves_the_binary_path_over_tls(tmp_path: Path) -> None:
    """The TLS hook: an ``ssl.SSLContext`` on the bookie's binary listener and on the
    client's links (TLS configuration itself is issue 21's)."""
    from scriba.client.binary_transport import BinaryTransport
    from scriba.ids import BookieId, EntryId, LedgerId

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    h = Harness(tmp_path, binary_ssl=server_ctx)
    try:
        # plain TCP to a TLS listener: no answer, and a clean close (the alert, then a FIN: no reset),
        # even with more bytes sent than OpenSSL's read-ahead takes in (scriba.tls_read_ahead)
        plain, closed = h.run(h.exchange(add_frame(15, [0]) + bytes(256 * 1024)))
        assert closed and not [f for f in plain if f[0].type == FrameType.ADD_ACK]

        async def over_tls() -> tuple[Status, bytes, str]:
            b = BookieId("bin")
            t = BinaryTransport(lambda _: h.bookie.address, resolve_binary=lambda _: h.bookie.binary_address,
                                ssl_context=client_ctx)
            done: asyncio.Future[Status] = asyncio.get_running_loop().create_future()
            data = pack_entry(Crc32cDigest(), 15, 0, -1, 0, b"secret")
            try:
                t.add(b, LedgerId(15), EntryId(0), KEY, data, lambda *a: done.set_result(a[3]))
                status = await asyncio.wait_for(done, 10)
                return status, await t.read_entry(b, LedgerId(15), EntryId(0), master_key=KEY), t.wire_of(b)
            finally:
                await t.close()

        status, got, used = h.run(over_tls())
        assert status == Status.OK and got == pack_entry(Crc32cDigest(), 15, 0, -1, 0, b"secret") and used == "binary"
    finally:
        h.close()


def test_long_poll_carries_the_confirmed_entries_and_none_beyond_the_lac(harness: Harness) -> None:
    frames, _ = harness.run(harness.exchange(add_frame(30, [0, 1, 2, 3, 4])))  # entry 4 carries lac 3
    assert [a.status for hd, body in frames if hd.type == FrameType.ADD_ACK for a in wire.decode_add_ack(body)] == [0]
    poll, _ = harness.run(harness.exchange(b(wire.encode_read_lac(8, 30, wire.LAC_LONG_POLL, 0, 1000, KEY, 8))))
    answer = wire.decode_lac_answer(poll[-1][1])
    assert (answer.status, answer.lac) == (0, 3)
    expected = [pack_entry(Crc32cDigest(), 30, e, e - 1, 0, b"x" * 10) for e in (1, 2, 3)]
    assert [bytes(e) for e in answer.piggybacked_entries] == expected
    plain, _ = harness.run(harness.exchange(b(wire.encode_read_lac(9, 30, wire.LAC_LONG_POLL, 0, 1000, KEY))))
    assert wire.decode_lac_answer(plain[-1][1]).piggybacked_entries == ()  # none asked, none sent


def test_a_long_poll_nothing_satisfies_is_answered_at_its_deadline(harness: Harness) -> None:
    """The bookie caps the wait (20 ms here); then it answers with the LAC it has."""
    harness.run(harness.exchange(add_frame(31, [0, 1])))  # entry 1 carries lac 0
    poll, _ = harness.run(harness.exchange(b(wire.encode_read_lac(8, 31, wire.LAC_LONG_POLL, 0, 60_000, KEY))))
    answer = wire.decode_lac_answer(poll[-1][1])
    assert (answer.status, answer.lac) == (0, 0)


class _Transport(asyncio.Transport):
    """What a connection writes, kept (no socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        self.written.append(b"".join(bytes(p) for p in parts))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def test_an_idle_bookie_answers_an_add_within_the_read_that_brought_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests start eagerly (scriba.eager): on the journal's idle path (a real journal
    on disk) an add's acknowledgement is written before ``data_received`` returns, with no
    task left behind; a long poll that must wait goes on in a task and is answered when
    the entry comes. (The idle path's slow-disk rule is pinned off: on a busy machine a
    sync over 2 ms would send the add to the journal's thread; that rule has its own
    tests in test_bookie_journal_idle.py.)"""
    from scriba.bookie import journal
    from scriba.bookie.binary_server import BinaryConnection

    monkeypatch.setattr(journal, "INLINE_SYNC_S_MAX", 3600.0)
    loop = asyncio.new_event_loop()
    config = BookieConfig(metadata_uri=f"memory://eager-{uuid.uuid4().hex[:8]}", data_dir=tmp_path / "data",
                          listen_port=0, bookie_id="eager")
    bookie = Bookie(config)

    async def main() -> None:
        await bookie.start()
        try:
            conn = BinaryConnection(bookie._binary)  # type: ignore[arg-type]
            transport = _Transport()
            conn.connection_made(transport)
            loop = asyncio.get_running_loop()

            def answers() -> list[tuple[int, Any]]:
                frames = [f for data in transport.written for f in FrameReader().feed(data)]
                transport.written.clear()
                return [(h.type, body) for h, body in frames]

            async def feed(data: bytes) -> tuple[list[tuple[int, Any]], int]:
                """``data_received`` from a plain loop callback, as the transport calls it
                (outside any task; scriba.eager starts ordinary tasks inside one): the
                frames written before it returned, and the tasks it left running."""
                fed: asyncio.Future[tuple[list[tuple[int, Any]], int]] = loop.create_future()

                def call() -> None:
                    conn.data_received(data)
                    fed.set_result((answers(), len(conn._tasks)))

                loop.call_soon(call)
                return await fed

            hello, _ = await feed(b(wire.encode_hello()))
            assert [t for t, _ in hello] == [FrameType.HELLO_OK]
            added, left = await feed(add_frame(5, [0]))
            assert [t for t, _ in added] == [FrameType.ADD_ACK] and left == 0
            assert [(a.ledger_id, list(a.entry_ids), a.status) for a in wire.decode_add_ack(added[0][1])] == [
                (5, [0], 0)]

            poll = wire.encode_read_lac(11, 5, wire.LAC_LONG_POLL, 0, 5000, KEY, 4)
            polled, left = await feed(b(poll))
            assert polled == [] and left == 1  # waits for LAC > 0, in a task
            later = (await feed(add_frame(5, [1])))[0] + (await feed(b(wire.encode_write_lac(12, 5, 1, 0, KEY))))[0]
            await asyncio.wait_for(asyncio.gather(*conn._tasks), 10)
            assert FrameType.LAC in [t for t, _ in later + answers()]
        finally:
            await bookie.stop()

    try:
        loop.run_until_complete(asyncio.wait_for(main(), 30))
    finally:
        loop.close()
