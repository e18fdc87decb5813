"""The binary data path's codec (scriba.proto.binary): round trips, reassembly at any
split, and typed refusal of anything malformed (R21: the decoder's side)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scriba.proto import binary as wire
from scriba.proto.binary import FrameError, FrameReader, FrameType


def frame_bytes(parts: list[wire.Buffer]) -> bytes:
    return b"".join(bytes(p) for p in parts)


def single(data: bytes, frame_bytes_max: int = wire.FRAME_BYTES_MAX) -> tuple[wire.Header, memoryview]:
    frames = FrameReader(frame_bytes_max).feed(data)
    assert len(frames) == 1
    return frames[0]


def test_add_frame_round_trip_keeps_runs_ids_sizes_and_bytes() -> None:
    parts: list[wire.Buffer] = []
    wire.encode_run(7, wire.ADD_RECOVERY, b"key", [3, 4], [b"abc", b"defg"], parts)
    wire.encode_run(9, 0, b"k2", [0], [b""], parts)
    header, body = single(frame_bytes(wire.encode_frame(FrameType.ADD, 42, parts)))
    assert (header.type, header.request_id, header.version) == (FrameType.ADD, 42, wire.FRAME_VERSION)
    runs = wire.decode_add(body)
    assert [(r.ledger_id, r.flags, r.master_key, list(r.entry_ids), list(r.sizes), r.entries) for r in runs] == [
        (7, 1, b"key", [3, 4], [3, 4], b"abcdefg"),
        (9, 0, b"k2", [0], [0], b""),
    ]


def test_answers_round_trip() -> None:
    _, body = single(frame_bytes(wire.encode_add_ack(5, [(7, [1, 2, 3], 0, ""), (8, [9], 3, "fenced")])))
    answers = wire.decode_add_ack(body)
    assert [(a.ledger_id, list(a.entry_ids), a.status, a.message) for a in answers] == [
        (7, [1, 2, 3], 0, ""), (8, [9], 3, "fenced")]
    _, body = single(frame_bytes(wire.encode_entry_answer(6, 2, 11, "no entry", b"")))
    assert wire.decode_entry_answer(body)[:3] == (2, 11, "no entry")
    _, body = single(frame_bytes(wire.encode_range_chunk(7, 0, 10, [b"a", b"bc"], more=True)))
    chunk = wire.decode_range_chunk(body)
    assert (chunk.first_entry_id, list(chunk.sizes), bytes(chunk.blob)) == (10, [1, 2], b"abc")
    _, body = single(frame_bytes(wire.encode_lac_answer(8, 0, 4, 5, True, "", b"last", [b"pig", b"gy", b""])))
    lac = wire.decode_lac_answer(body)
    assert (lac.lac, lac.last_entry_id, lac.fenced, bytes(lac.last_entry)) == (4, 5, True, b"last")
    assert [bytes(e) for e in lac.piggybacked_entries] == [b"pig", b"gy", b""]
    _, body = single(frame_bytes(wire.encode_lac_answer(8, 0, 4, 5, False, "", b"")))
    assert wire.decode_lac_answer(body).piggybacked_entries == ()
    _, body = single(frame_bytes(wire.encode_read_lac(9, 3, wire.LAC_LONG_POLL, 17, 250, b"k", 8)))
    assert wire.decode_read_lac(body) == (3, wire.LAC_LONG_POLL, 17, 250, 8, b"k")
    _, body = single(frame_bytes(wire.encode_read_range(10, 3, 0, 99, 16, 4096)))
    assert wire.decode_read_range(body) == (3, 0, 99, 16, 4096, b"")  # the form before version 3
    _, body = single(frame_bytes(wire.encode_read_range(10, 3, 0, 99, 16, 4096, b"key")))
    assert wire.decode_read_range(body) == (3, 0, 99, 16, 4096, b"key")
    _, body = single(frame_bytes(wire.encode_read_entry(11, 3, -1, wire.READ_FENCE, b"k")))
    assert wire.decode_read_entry(body) == (3, -1, wire.READ_FENCE, b"k")
    header, body = single(frame_bytes(wire.encode_write_lac(12, 3, 41, wire.LAC_HINT_ONLY, b"key")))
    assert header.type == FrameType.WRITE_LAC and wire.decode_write_lac(body) == (3, 41, wire.LAC_HINT_ONLY, b"key")
    header, body = single(frame_bytes(wire.encode_lac_written(12, 7, "master key mismatch")))
    assert header.type == FrameType.LAC_WRITTEN and wire.decode_lac_written(body) == (7, "master key mismatch")
    with pytest.raises(FrameError):
        wire.decode_write_lac(frame_bytes(wire.encode_write_lac(1, 3, 41, 0, b"key"))[wire.HEADER_SIZE:-1])  # cut short


def test_version_negotiation_picks_the_highest_common_version() -> None:
    assert wire.negotiate(1, 1) == 1  # a version-1 peer: no WRITE_LAC on that link
    assert wire.negotiate(1, 2) == 2 == wire.WRITE_LAC_VERSION
    assert wire.negotiate(1, 9) == wire.VERSION
    assert wire.negotiate(wire.VERSION + 1, wire.VERSION + 3) is None
    _, body = single(frame_bytes(wire.encode_hello(1, 4)))
    assert wire.decode_hello(body) == (1, 4)


@given(st.lists(st.integers(1, 40), min_size=1, max_size=8))
def test_reader_reassembles_frames_split_anywhere(cuts: list[int]) -> None:
    frames = [wire.encode_add_ack(i, [(i, list(range(i)), 0, "m" * i)]) for i in range(1, 6)]
    stream = b"".join(frame_bytes(f) for f in frames)
    reader = FrameReader()
    got: list[tuple[wire.Header, memoryview]] = []
    pos = 0
    for cut in cuts * 20:
        got += reader.feed(stream[pos : pos + cut])
        pos += cut
    got += reader.feed(stream[pos:])
    assert [h.request_id for h, _ in got] == [1, 2, 3, 4, 5]
    assert [len(wire.decode_add_ack(b)[0].entry_ids) for _, b in got] == [1, 2, 3, 4, 5]
    assert reader.buffered_bytes == 0


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (struct.pack("<HBBHIQ", 0xBEEF, 1, 3, 0, 0, 1), "bad magic"),
        (struct.pack("<HBBHIQ", wire.MAGIC, 99, 3, 0, 0, 1), "unsupported version"),
        (struct.pack("<HBBHIQ", wire.MAGIC, 1, 200, 0, 0, 1), "unknown frame type"),
        (struct.pack("<HBBHIQ", wire.MAGIC, 1, 3, 0, 1 << 30, 1), "exceeds the cap"),
    ],
)
def test_bad_headers_are_refused_as_soon_as_they_arrive(header: bytes, reason: str) -> None:
    with pytest.raises(FrameError, match=reason):
        FrameReader(1024 * 1024).feed(header)  # no body needed: refused from the header


def test_truncated_and_stray_bodies_are_frame_errors() -> None:
    parts: list[wire.Buffer] = []
    wire.encode_run(7, 0, b"key", [3, 4], [b"abc", b"defg"], parts)
    body = frame_bytes(parts)
    for cut in range(1, len(body)):
        with pytest.raises(FrameError):
            wire.decode_add(body[:cut])
    with pytest.raises(FrameError, match="stray"):
        wire.decode_read_range(frame_bytes([struct.pack("<QqqIQH", 1, 0, 1, 1, 1, 1)]) + b"kx")
    with pytest.raises(FrameError, match="truncated"):
        wire.decode_read_range(frame_bytes([struct.pack("<QqqIQ", 1, 0, 1, 1, 1)]) + b"x")
    with pytest.raises(FrameError, match="sizes add up"):
        wire.decode_range_chunk(struct.pack("<HqIH", 0, 0, 1, 0) + struct.pack("<I", 5) + b"abc")


@settings(max_examples=400)
@given(st.binary(max_size=200))
def test_garbage_bodies_raise_only_frame_errors(body: bytes) -> None:
    decoders = [wire.decode_add, wire.decode_add_ack, wire.decode_read_entry, wire.decode_read_range,
                wire.decode_read_lac, wire.decode_hello, wire.decode_hello_ok, wire.decode_error,
                wire.decode_range_chunk, wire.decode_lac_answer, wire.decode_entry_answer]
    for decode in decoders:
        try:
            decode(memoryview(body))  # type: ignore[operator]
        except FrameError:
            pass


def test_announced_counts_larger_than_the_body_are_refused_before_allocation() -> None:
    huge = struct.pack("<QIIH", 1, 0, 0xFFFFFFFF, 0)  # 4 G adds announced in a 18-byte run
    with pytest.raises(FrameError, match="announced"):
        wire.decode_add(huge)
