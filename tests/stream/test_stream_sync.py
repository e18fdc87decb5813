"""``scriba.stream.sync``: the blocking stream API on a SyncClient's loop (in-process bookies)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator

import pytest

from scriba.client import SyncClient
from scriba.client.client import ClientConfig
from scriba.errors import (
    ConfigError,
    DeadlineExceededError,
    NamespaceNotFoundError,
    PositionTruncatedError,
    RecordTooLargeError,
    StreamNotFoundError,
    WriterLockedError,
)
from scriba.stream import Position, WriterOptions
from scriba.stream.sync import SyncNamespace, sync_delete_namespace, sync_list_namespaces
from scriba.testing.sim import StorageTransport, register_bookies

BOOKIES = ["bk0", "bk1", "bk2"]


@pytest.fixture
def client() -> Iterator[SyncClient]:
    uri = f"memory://sync-{uuid.uuid4().hex[:10]}"
    transport = StorageTransport(BOOKIES)
    c = SyncClient.connect(uri, transport=transport, config=ClientConfig(add_timeout_s=2.0, bookie_wait_s=5.0),
                           call_timeout_s=20.0)
    asyncio.run_coroutine_threadsafe(register_bookies(c.client.store, BOOKIES), c.loop).result(10)
    try:
        yield c
    finally:
        c.close()


def test_write_read_tail_cursors_truncate_and_delete(client: SyncClient) -> None:
    ns = SyncNamespace.open(client, "spark/jobs", create=True, segment_records_max=4, call_timeout_s=30)
    assert "spark/jobs" in sync_list_namespaces(client)
    with ns.open_writer("events", create=True) as writer:
        first = writer.append(b"e0", headers={"k": b"v"})
        many = writer.append_many([b"e1", (b"e2", {"h": b"x"}), b"e3"])
        futures = [writer.append_async(b"e%d" % i) for i in range(4, 20)]  # pipelined, in order
        later = [f.result(10) for f in futures]
        with pytest.raises(RecordTooLargeError):
            writer.append_many([b"ok", b"x" * (2 * 1024 * 1024)])
    positions = [first, *many, *later]
    assert positions == sorted(positions) and len(set(positions)) == 20
    assert ns.last_position("events") == positions[-1]
    records = list(ns.read_range("events"))
    assert [r.payload for r in records] == [b"e%d" % i for i in range(20)]
    assert [r.position for r in records] == positions
    assert dict(records[0].headers) == {"k": b"v"} and dict(records[2].headers) == {"h": b"x"}
    assert [r.payload for r in ns.read_range("events", positions[5], count=3)] == [b"e5", b"e6", b"e7"]
    assert len({p.segment_seq for p in positions}) >= 2  # crossed a roll (sets overshoot by one)

    # a tailing reader blocks for new records; batches take what is read ahead
    with ns.open_reader("events", positions[-1]) as reader:
        assert [r.payload for r in reader.read_batch(10, timeout_s=5.0)] == [b"e19"]
        assert reader.read_next(timeout_s=0.05) is None
        with ns.open_writer("events") as writer:
            done = threading.Event()
            got: list[bytes] = []

            def consume() -> None:
                for record in reader:  # tails
                    got.append(record.payload)
                    if len(got) == 3:
                        done.set()
                        return

            thread = threading.Thread(target=consume)
            thread.start()
            writer.append_many([b"n0", b"n1", b"n2"])
            assert done.wait(10.0)
            thread.join(10.0)
    assert got == [b"n0", b"n1", b"n2"]

    ns.commit_cursor("events", "spark", positions[10])
    assert ns.cursor("events", "spark") == positions[10] and ns.cursors("events") == {"spark": positions[10]}
    deleted = ns.truncate("events", positions[10])
    assert deleted and ns.info("events").record.truncated_before == positions[10]
    with pytest.raises(PositionTruncatedError):
        list(ns.read_range("events", positions[0]))
    assert next(iter(ns.read_range("events"))).payload == b"e10"
    ns.delete_stream("events")
    with pytest.raises(StreamNotFoundError):
        ns.open_reader("events")
    sync_delete_namespace(client, "spark/jobs")
    with pytest.raises(NamespaceNotFoundError):
        SyncNamespace.open(client, "spark/jobs")


def test_errors_deadlines_and_the_loop_thread(client: SyncClient) -> None:
    ns = SyncNamespace.open(client, "spark/errs", create=True, call_timeout_s=1.0)
    with pytest.raises(ConfigError, match="stream name"):
        ns.open_writer("bad/name", create=True)
    writer = ns.open_writer("s", create=True)
    # a second writer waits for the lock past the call's deadline: a typed timeout, not a hang
    with pytest.raises((DeadlineExceededError, WriterLockedError)):
        ns.open_writer("s", options=WriterOptions(lock_timeout_s=5.0))
    assert writer.append(b"still the writer") == Position(writer.segment_seq, 0, 0)
    writer.close()

    async def from_inside() -> None:
        ns.list_streams()  # the facade called on its own loop

    with pytest.raises(ConfigError, match="own event loop"):
        asyncio.run_coroutine_threadsafe(from_inside(), client.loop).result(5)
    assert [r.payload for r in ns.read_range("s")] == [b"still the writer"]
