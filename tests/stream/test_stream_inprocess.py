"""The stream layer on the public client API, against in-process bookies and ``memory://``
(``stream_site.py``): appends, positions, headers, record sets, rolls, and bad input.

The single writer (``test_stream_single_writer.py``), crashes at each roll and truncation
step (``test_stream_crash_steps.py``), readers (``test_stream_readers.py``) and cursors,
truncation, retention and deletion (``test_stream_retention.py``) have files of their
own; real processes run in ``test_stream_processes.py``.
"""

from __future__ import annotations

import asyncio

import pytest
from stream_checks import check_stream
from stream_site import Env, open_ns, pairs, read_all

from scriba.errors import (
    ConfigError,
    InvalidPositionError,
    NamespaceNotFoundError,
    PositionOutOfRangeError,
    RecordSetCorruptError,
    RecordTooLargeError,
    StreamNotFoundError,
    StreamWriterClosedError,
    TooManyRequestsError,
)
from scriba.stream import (
    Position,
    ReaderOptions,
    StreamReader,
    WriterOptions,
    list_namespaces,
    open_namespace,
)
from scriba.stream.segments import SegmentState
from scriba.testing.waiting import eventually


# --- basics --------------------------------------------------------------------------------
async def test_append_read_positions_headers_and_record_sets(env: Env) -> None:
    ns = await open_ns(env)
    w = await ns.open_writer("orders", create=True)
    p0 = await w.append(b"first", headers={"origin": b"eu"})
    many = await w.append_many([b"a", b"b", (b"c", {"k": b"v"})])
    futures = [w.append_async(b"x%d" % i) for i in range(100)]
    later = await asyncio.gather(*futures)
    await w.close()
    assert p0 == Position(w.segment_seq, 0, 0)
    # append_many packs one record set: one entry, slots 0..2
    assert [(p.entry_id, p.slot) for p in many] == [(1, 0), (1, 1), (1, 2)]
    # appends queued in one loop turn share a record set
    assert len({p.entry_id for p in later}) < len(later)
    assert list(later) == sorted(later)
    records = await read_all(ns, "orders")
    assert [r.payload for r in records] == [b"first", b"a", b"b", b"c"] + [b"x%d" % i for i in range(100)]
    assert dict(records[0].headers) == {"origin": b"eu"} and dict(records[3].headers) == {"k": b"v"}
    assert [r.position for r in records] == [p0, *many, *later]
    assert all(r.publish_time_ms > 0 for r in records)
    assert records == sorted(records, key=lambda r: r.position)
    # positions resume: start at a slot in the middle of a set
    tail = await read_all(ns, "orders", start=many[1])
    assert [r.payload for r in tail][:2] == [b"b", b"c"]
    assert next(r.payload for r in await read_all(ns, "orders", start=str(many[2].successor()))) == b"x0"


async def test_append_many_larger_than_the_waiting_bound_queues_as_room_frees(env: Env) -> None:
    ns = await open_ns(env)
    w = await ns.open_writer("big", create=True, options=WriterOptions(records_waiting_max=10, sets_inflight_max=2),
                             record_set_bytes_max=1024)
    payloads = [b"b%03d" % i for i in range(100)]
    positions = await w.append_many(payloads)
    assert positions == sorted(positions) and len(set(positions)) == 100
    single = await w.append(b"after")
    assert single > positions[-1]
    await w.close()
    assert [r.payload for r in await read_all(ns, "big")] == [*payloads, b"after"]


async def test_rolls_with_tiny_limits_reader_crosses_every_boundary(env: Env) -> None:
    ns = await open_ns(env)
    w = await ns.open_writer("rolls", create=True, segment_records_max=3, record_set_bytes_max=1024)
    tailer = await ns.open_reader("rolls", "earliest")
    confirmed: dict[Position, bytes] = {}
    payloads = [b"r%04d" % i + b"." * (i % 50) for i in range(1000)]
    for start in range(0, len(payloads), 3):  # 3 records per set, 3 per segment
        chunk = payloads[start:start + 3]
        positions = await asyncio.gather(*[w.append_async(p) for p in chunk])
        confirmed.update(zip(positions, chunk, strict=True))
    await w.close()
    info = await ns.info("rolls")
    segments = info.record.segments
    assert len(segments) >= 300
    assert all(s.state is SegmentState.CLOSED for s in segments)
    assert sum(s.summary.record_count for s in segments) == len(payloads)
    seen = []
    while len(seen) < len(payloads):
        rec = await tailer.read_next(timeout_s=5.0)
        assert rec is not None, f"tailing reader stopped after {len(seen)} records"
        seen.append(rec)
    await tailer.close()
    catch_up = await read_all(ns, "rolls")
    result = check_stream({"tailer": pairs(seen), "catch-up": pairs(catch_up)}, confirmed, attempted=payloads)
    assert result.ok, result.explain()
    assert [r.payload for r in catch_up] == payloads
    assert len({r.position.segment_seq for r in catch_up}) >= 300


async def test_the_writers_lac_push_delay_holds_for_every_segment(env: Env) -> None:
    """``WriterOptions.lac_push_delay_s`` is the delay of every segment's ledger writer,
    the first and each rolled one; without it, the client's (0 here)."""
    ns = await open_ns(env)
    w = await ns.open_writer("lacdelay", create=True, segment_records_max=2,
                             options=WriterOptions(lac_push_delay_s=0.25))
    seen = set()
    for i in range(7):
        await w.append(b"%d" % i)
        assert w.current_ledger is not None
        seen.add((w.current_ledger.ledger_id, w.current_ledger.explicit_lac_delay_s))
    await w.close()
    assert len(seen) >= 3 and {delay for _, delay in seen} == {0.25}, seen
    plain = await ns.open_writer("lacdelay")
    assert plain.current_ledger is not None and plain.current_ledger.explicit_lac_delay_s == 0.0
    await plain.close()


async def test_append_many_nowait_sends_at_once_and_queues_all_or_nothing(env: Env) -> None:
    """``append_many_nowait`` (an RSM leader's group commit) hands its record set to the
    ledger before it returns (no loop turn), and resolves to the positions in order; a
    batch that does not fit now is refused whole (TooManyRequestsError, nothing queued),
    as is a bad record (typed error)."""
    ns = await open_ns(env)
    w = await ns.open_writer("nowait", create=True, options=WriterOptions(records_waiting_max=4))
    assert w.current_ledger is not None
    before = w.current_ledger.pending
    future = w.append_many_nowait([b"a", b"b", b"c"])
    assert w.current_ledger.pending == before + 1, "the set was appended to the ledger before the call returned"
    positions = await asyncio.wait_for(future, 10)
    assert [(p.entry_id, p.slot) for p in positions] == [(positions[0].entry_id, s) for s in range(3)]
    with pytest.raises(TooManyRequestsError):
        w.append_many_nowait([b"x"] * 5)
    with pytest.raises(RecordTooLargeError):
        w.append_many_nowait([b"y", b"z" * (w.settings.record_bytes_max + 1)])
    assert w.pending == 0, "nothing queued by the refused calls"
    assert await asyncio.wait_for(w.append_many_nowait([]), 1) == []
    await w.close()
    assert [r.payload for r in await read_all(ns, "nowait")] == [b"a", b"b", b"c"]


async def test_reader_options_are_checked(env: Env) -> None:
    """A bad ``ReaderOptions`` is a ConfigError naming the field, before anything is read;
    ``tail_poll_replicas`` 1 tails like 2 (one bookie per long poll instead of two)."""
    ns = await open_ns(env)
    w = await ns.open_writer("opts", create=True)
    for bad, field in ((ReaderOptions(tail_poll_replicas=3), "tail_poll_replicas"),
                       (ReaderOptions(read_ahead_entries=0), "read_ahead_entries")):
        with pytest.raises(ConfigError, match=field):
            await ns.open_reader("opts", "earliest", options=bad)
    reader = await ns.open_reader("opts", "earliest", options=ReaderOptions(tail_poll_replicas=1))
    positions = [await w.append(b"%d" % i) for i in range(3)]
    assert [(await reader.read_next(10.0)).position for _ in range(3)] == positions  # type: ignore[union-attr]
    await reader.close()
    await w.close()


async def test_roll_by_bytes_and_record_set_split(env: Env) -> None:
    ns = await open_ns(env)
    w = await ns.open_writer("bytes", create=True, segment_bytes_max=4096, record_set_bytes_max=1024)
    payloads = [bytes([65 + i % 26]) * 300 for i in range(60)]
    positions = await w.append_many(payloads)
    await w.close()
    # 60 x 306 bytes cannot share one 1 KiB set: at most 3 per set
    per_entry: dict[tuple[int, int], int] = {}
    for p in positions:
        per_entry[(p.segment_seq, p.entry_id)] = per_entry.get((p.segment_seq, p.entry_id), 0) + 1
    assert max(per_entry.values()) == 3
    assert len({p.segment_seq for p in positions}) > 1
    assert [r.payload for r in await read_all(ns, "bytes")] == payloads


# --- bad input -----------------------------------------------------------------------------
async def test_bad_input_is_typed_and_writes_nothing(env: Env) -> None:
    client = await env.client()
    with pytest.raises(NamespaceNotFoundError):
        await open_namespace(client, "no/such")
    with pytest.raises(ConfigError, match="namespace name"):
        await open_namespace(client, "bad name", create=True)
    with pytest.raises(ConfigError, match="unknown stream setting"):
        await open_namespace(client, "ok", create=True, segment_recs=3)
    with pytest.raises(ConfigError, match="quorums"):
        await open_namespace(client, "ok", create=True, ack_quorum_size=5)
    assert await list_namespaces(client) == []
    ns = await open_ns(env, record_bytes_max=100)
    with pytest.raises(StreamNotFoundError):
        await ns.open_writer("missing")
    with pytest.raises(StreamNotFoundError):
        await ns.open_reader("missing")
    with pytest.raises(ConfigError, match="stream name"):
        await ns.open_writer("bad/name", create=True)
    w = await ns.open_writer("s", create=True)
    with pytest.raises(RecordTooLargeError):
        w.append_async(b"x" * 200)
    with pytest.raises(RecordTooLargeError):
        await w.append_many([b"ok", b"x" * 200])
    with pytest.raises(ConfigError):
        w.append_async("text")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        w.append_async(b"x", headers={"k": "not bytes"})  # type: ignore[dict-item]
    p = await w.append(b"only")
    with pytest.raises(InvalidPositionError):
        await ns.open_reader("s", "1:2")
    with pytest.raises(InvalidPositionError):
        await ns.open_reader("s", "nonsense")
    with pytest.raises(PositionOutOfRangeError):
        await ns.open_reader("s", Position(p.segment_seq, p.entry_id + 5, 0))
    with pytest.raises(PositionOutOfRangeError):
        await ns.open_reader("s", Position(p.segment_seq + 3, 0, 0))
    with pytest.raises(InvalidPositionError):
        await ns.commit_cursor("s", "c", "x:y:z")
    with pytest.raises(ConfigError, match="cursor name"):
        await ns.commit_cursor("s", "bad cursor", p)
    await w.close()
    with pytest.raises(StreamWriterClosedError):
        w.append_async(b"after close")
    assert [r.payload for r in await read_all(ns, "s")] == [b"only"]


async def test_reader_of_corrupt_record_set_gets_typed_error(env: Env) -> None:
    """A segment whose ledger holds something that is not a record set (a foreign or buggy writer)."""
    import dataclasses

    from scriba.stream import record_set
    from scriba.stream.segments import Segment, SegmentSummary

    ns = await open_ns(env)
    await ns.create_stream("raw")
    ledger = await ns.client.create_ledger(3, 3, 2)
    good = record_set.encode([(b"good", record_set.NO_HEADERS)], records_before=0, bytes_before=0,
                             publish_time_ms=1)
    await ledger.append(good)
    await ledger.append(b"not a record set")
    await ledger.close()
    segment = Segment(0, ledger.ledger_id, SegmentState.CLOSED, 0, 0, 1, SegmentSummary(1, 0, 2, 10, 1))
    await ns.catalog.update_stream("raw", lambda r: True,
                                   lambda r: dataclasses.replace(r, next_seq=1, segments=(segment,)))
    reader: StreamReader = await ns.open_reader("raw")
    assert (await reader.read_next(2.0)).payload == b"good"  # type: ignore[union-attr]
    with pytest.raises(RecordSetCorruptError):
        await reader.read_next(2.0)
    await reader.close()
    batched: StreamReader = await ns.open_reader("raw")
    await eventually(lambda: batched._queue.qsize() >= 2, 5.0,
                     what="both chunks read ahead: the good record, then the error")
    assert [r.payload for r in await batched.read_batch(10, 2.0)] == [b"good"]  # the error waits
    with pytest.raises(RecordSetCorruptError):
        await batched.read_batch(10, 2.0)
    await batched.close()
