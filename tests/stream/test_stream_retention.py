"""Cursors, truncation, retention and deletion on the public client API (``stream_site.py``):
cursors never go back, truncation and retention delete whole segments, a writer applies
retention in its own process, streams and namespaces are deleted (recursively) and
settings inherited.
"""

from __future__ import annotations

import pytest
from stream_site import Env, open_ns, read_all

from scriba.errors import (
    ConfigError,
    CursorRegressionError,
    NamespaceNotEmptyError,
    NamespaceNotFoundError,
    NoSuchLedgerError,
    PositionTruncatedError,
    StreamNotFoundError,
    StreamWriterClosedError,
    WriterFencedError,
)
from scriba.stream import Position, list_namespaces, open_namespace
from scriba.testing.waiting import eventually


async def test_cursors_truncate_and_retention(env: Env) -> None:
    ns = await open_ns(env)
    w = await ns.open_writer("ret", create=True, segment_records_max=2, retention_bytes_max=1,
                             retain_unconsumed=True)
    positions = [await w.append(b"r%d" % i) for i in range(10)]
    await ns.commit_cursor("ret", "eu", positions[3])
    with pytest.raises(CursorRegressionError):
        await ns.commit_cursor("ret", "eu", positions[1])
    assert await ns.cursor("ret", "eu") == positions[3]
    await ns.commit_cursor("ret", "eu", positions[1], force=True)
    await ns.commit_cursor("ret", "eu", positions[4])
    assert await ns.cursors("ret") == {"eu": positions[4]}
    before = {s.seq: s.ledger_id for s in (await ns.info("ret")).record.segments}
    point = await ns.apply_retention("ret")
    # held back by the cursor: only segments the cursor passed are gone
    assert point == Position(positions[4].segment_seq, 0, 0)
    after = (await ns.info("ret")).record
    assert after.segments[0].seq == positions[4].segment_seq
    for seq, ledger_id in before.items():
        if seq < positions[4].segment_seq:
            with pytest.raises(NoSuchLedgerError):
                await ns.client.ledger_metadata(ledger_id)
    with pytest.raises(PositionTruncatedError):
        await ns.open_reader("ret", positions[0])
    await ns.delete_cursor("ret", "eu")
    assert await ns.apply_retention("ret") is not None  # no cursor holds it now
    await w.close()
    remaining = (await ns.info("ret")).record.segments
    assert len(remaining) <= 2
    assert (await read_all(ns, "ret"))[-1].payload == b"r9"


async def test_writer_applies_retention_every_interval_in_its_own_process(env: Env) -> None:
    ns = await open_ns(env)
    with pytest.raises(ConfigError, match="retention_interval_s"):
        await ns.open_writer("bad-interval", create=True, retention_interval_s=0)
    periodic = await ns.open_writer("periodic", create=True, segment_records_max=2, retention_bytes_max=1,
                                    retention_interval_s=0.05)
    manual = await ns.open_writer("manual", create=True, segment_records_max=2, retention_bytes_max=1)
    made: list[int] = []  # each segment's ledger (retention may drop some while we append)
    for i in range(10):
        await periodic.append(b"p%d" % i)
        await manual.append(b"m%d" % i)
        current = periodic.current_ledger
        assert current is not None
        if current.ledger_id not in made:
            made.append(current.ledger_id)
    assert len(made) >= 5

    async def only_the_open_segment_left() -> bool:
        record = (await ns.info("periodic")).record
        return [s.seq for s in record.segments] == [periodic.segment_seq] and not record.deleting

    await eventually(only_the_open_segment_left, 10.0, interval_s=0.02,
                     what="the writer's own retention dropped every CLOSED segment")
    record = (await ns.info("periodic")).record
    assert record.truncated_before == Position(periodic.segment_seq, 0, 0)
    assert periodic.retention_passes >= 1
    last = periodic.current_ledger
    assert last is not None and record.segments[0].ledger_id == last.ledger_id
    for ledger_id in (m for m in made if m != last.ledger_id):
        with pytest.raises(NoSuchLedgerError):
            await ns.client.ledger_metadata(ledger_id)
    # the same stream without an interval: nothing dropped until someone applies retention
    assert manual.retention_passes == 0
    assert len((await ns.info("manual")).record.segments) >= 5
    assert (await periodic.append(b"after")).segment_seq == periodic.segment_seq
    await periodic.close()
    await manual.close()
    got = [r.payload for r in await read_all(ns, "periodic")]  # what the current segment held
    assert got[-1] == b"after" and got[:-1] == [b"p%d" % i for i in range(10)][10 - (len(got) - 1):]
    assert len(got) <= 3


async def test_delete_stream_and_namespace(env: Env) -> None:
    ns = await open_ns(env)
    w = await ns.open_writer("gone", create=True, segment_records_max=2)
    await w.append_many([b"a", b"b", b"c"])
    await w.append(b"d")
    reader = await ns.open_reader("gone")
    ledgers = [s.ledger_id for s in (await ns.info("gone")).record.segments]
    with pytest.raises(NamespaceNotEmptyError):
        await ns.delete()
    await ns.delete_stream("gone")
    with pytest.raises((WriterFencedError, StreamWriterClosedError, StreamNotFoundError)):
        await w.append(b"e")
    await w.abort()
    for ledger_id in ledgers:
        with pytest.raises(NoSuchLedgerError):
            await ns.client.ledger_metadata(ledger_id)
    with pytest.raises(StreamNotFoundError):
        await ns.open_reader("gone")
    with pytest.raises(StreamNotFoundError):
        for _ in range(100):
            await reader.read_next(timeout_s=2.0)
    await reader.close()
    assert "prod/payments" in await list_namespaces(ns.client)
    await ns.delete()
    with pytest.raises(NamespaceNotFoundError):
        await open_namespace(ns.client, "prod/payments")


async def test_recursive_namespace_delete_and_settings_inheritance(env: Env) -> None:
    ns = await open_ns(env, segment_records_max=5)
    await ns.create_stream("inherit")
    await ns.create_stream("override", segment_records_max=9)
    assert (await ns.stream_settings("inherit")).segment_records_max == 5
    assert (await ns.stream_settings("override")).segment_records_max == 9
    assert sorted(await ns.list_streams()) == ["inherit", "override"]
    await ns.delete(recursive=True)
    assert "prod/payments" not in await list_namespaces(ns.client)
