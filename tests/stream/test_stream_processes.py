"""Streams on real bookie processes and real etcd and ZooKeeper.

Writers that are killed or paused run in their own processes
(``stream_writer_proc.py``); the test process is the next writer and the reader.
The bookies (3) are shared by the tests of one metadata backend; each test uses
its own namespace.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from stream_checks import check_stream

from scriba.client import Client, ClientConfig
from scriba.errors import NoSuchLedgerError, WriterLockedError
from scriba.meta.connect import connect
from scriba.stream import Namespace, Position, Record, WriterOptions, open_namespace
from scriba.stream.segments import SegmentState
from scriba.testing.cluster import BookieCluster
from scriba.testing.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PROC = str(Path(__file__).with_name("stream_writer_proc.py"))
CONFIG = ClientConfig(add_timeout_s=5.0, bookie_wait_s=20.0)


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from scriba.embedded.zookeeper import ZooKeeperEnsemble

    server = ZooKeeperEnsemble(tmp_path_factory.mktemp("zk"), 1)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module", params=["etcd", "zk"])
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A metadata URI with 3 bookie processes registered on it."""
    server = request.getfixturevalue("etcd_cluster" if request.param == "etcd" else "zk_server")
    uri = str(server.uri(f"s{uuid.uuid4().hex[:8]}"))
    bookies = BookieCluster(tmp_path_factory.mktemp(f"bookies-{request.param}"), uri)
    bookies.start_bookies(3, zones=["z1", "z2", "z3"])
    try:
        yield uri
    finally:
        bookies.stop_all()


@pytest.fixture
async def client(backend: str) -> AsyncIterator[Client]:
    store = await connect(backend, session_timeout_s=2.0)
    async with Client.connect(backend, store=store, config=CONFIG) as c:
        await c.registry.wait_for_bookies(3, 20.0)
        yield c
    await store.close()


async def _ns(client: Client, **settings: Any) -> Namespace:
    return await open_namespace(client, f"t{uuid.uuid4().hex[:8]}/x", create=True, **settings)


class WriterProcess:
    """``stream_writer_proc.py`` as a child: its confirmed and failed values, read as they come."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.confirmed: dict[Position, bytes] = {}
        self.errors: list[str] = []
        self.opened = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def start(cls, uri: str, namespace: str, stream: str, tag: str, records_max: int) -> WriterProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, PROC, uri, namespace, stream, tag, str(records_max),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            kind, _, rest = raw.decode().strip().partition(" ")
            if kind == "OK":
                pos, value = rest.split(" ", 1)
                self.confirmed[Position.parse(pos)] = value.encode()
            elif kind == "ERR":
                self.errors.append(rest)
            elif kind == "OPEN":
                self.opened.set()

    async def wait_confirmed(self, n: int, timeout_s: float = 60.0) -> None:

        def confirmed() -> bool:
            if len(self.confirmed) >= n:
                return True
            if self.proc.returncode is not None:
                raise AssertionError(f"writer process exited {self.proc.returncode}")
            return False

        await eventually(confirmed, timeout_s, what=f"{n} appends confirmed", interval_s=0.02)

    async def wait_error(self, timeout_s: float = 30.0) -> None:
        await eventually(lambda: bool(self.errors), timeout_s, what="an append failed", interval_s=0.02)

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)  # our own child, by its PID

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.signal(signal.SIGKILL)
        await self.proc.wait()
        try:  # the pipe is closed: read what is left in it, bounded
            await asyncio.wait_for(self._reader, 10.0)
        except TimeoutError:
            self._reader.cancel()


async def _read_to_end(ns: Namespace, name: str, start: Any = "earliest") -> list[Record]:
    info = await ns.info(name)
    assert info.record.segments[-1].state is SegmentState.CLOSED
    ends = [s.last_position for s in info.record.segments if s.last_position is not None]
    out: list[Record] = []
    async with await ns.open_reader(name, start) as reader:
        while ends and (not out or out[-1].position < ends[-1]):
            rec = await reader.read_next(timeout_s=20.0)
            assert rec is not None, f"reader stalled after {len(out)} records"
            out.append(rec)
        assert await reader.read_next(timeout_s=0.1) is None
    return out


def _pairs(records: list[Record]) -> list[tuple[Position, bytes]]:
    return [(r.position, r.payload) for r in records]


async def test_sigkill_writer_failover_gap_free_and_every_confirmed_record(client: Client, backend: str) -> None:
    ns = await _ns(client)
    tailer_ns = await open_namespace(client, ns.name)
    old = await WriterProcess.start(backend, ns.name, "orders", "a", 20)
    try:
        await old.wait_confirmed(300)
        tailer = await tailer_ns.open_reader("orders")
        old.signal(signal.SIGKILL)
        await old.proc.wait()
    finally:
        await old.stop()
    new = await ns.open_writer("orders", options=WriterOptions(lock_timeout_s=30.0))
    confirmed = dict(old.confirmed)
    for i in range(100):
        value = b"b-%d" % i
        confirmed[await new.append(value)] = value
    await new.close()
    seen = []
    async with tailer:
        while len(seen) < len(confirmed):  # the tailer started mid-stream and followed the fail-over
            rec = await tailer.read_next(timeout_s=20.0)
            if rec is None:
                break
            seen.append(rec)
    everything = await _read_to_end(ns, "orders")
    a_max = max(int(v.split(b"-")[1]) for v in old.confirmed.values())
    attempted = [b"a-%d" % i for i in range(a_max + 64)] + [b"b-%d" % i for i in range(100)]
    result = check_stream({"catch-up": _pairs(everything)}, confirmed, attempted=attempted)
    assert result.ok, result.explain()
    tail_result = check_stream({"tailer": _pairs(seen), "catch-up": _pairs(everything)}, {},
                               complete=False)
    assert tail_result.ok, tail_result.explain()
    a_values = [int(r.payload.split(b"-")[1]) for r in everything if r.payload.startswith(b"a-")]
    assert a_values == list(range(len(a_values)))  # the old writer's records: a prefix, in order
    assert everything[-1].payload == b"b-99"


async def test_sigstop_old_writer_is_fenced_and_nothing_later_is_read(client: Client, backend: str) -> None:
    ns = await _ns(client)
    old = await WriterProcess.start(backend, ns.name, "paused", "a", 1000)
    try:
        await old.wait_confirmed(100)
        old.signal(signal.SIGSTOP)
        new = await ns.open_writer("paused", options=WriterOptions(lock_timeout_s=30.0))
        b_pos = await new.append(b"b-0")
        old.signal(signal.SIGCONT)
        await old.wait_error()
        await new.append(b"b-1")
        await new.close()
    finally:
        await old.stop()
    assert any("WriterFencedError" in e for e in old.errors), old.errors[:3]
    # Every confirmation the old writer printed is read by now (some were still in the
    # pipe at SIGSTOP); none came after the new writer opened (``late`` below), so the
    # largest is where it stood when it was paused.
    stopped_at = max(int(v.split(b"-")[1]) for v in old.confirmed.values())
    everything = await _read_to_end(ns, "paused")
    a_values = [int(r.payload.split(b"-")[1]) for r in everything if r.payload.startswith(b"a-")]
    # only what was sent before the pause (at most one window in flight) made it
    assert a_values and max(a_values) < stopped_at + 16
    assert a_values == list(range(len(a_values)))
    result = check_stream({"r": _pairs(everything)}, {**old.confirmed, b_pos: b"b-0"})
    assert result.ok, result.explain()
    late = [p for p in old.confirmed if p > b_pos]
    assert not late, f"the old writer confirmed {late[:3]} after the new writer opened"


async def test_writers_racing_to_open_50_trials(client: Client, backend: str) -> None:
    ns = await _ns(client)
    await ns.create_stream("race")
    others = []
    for _ in range(2):
        store = await connect(backend, session_timeout_s=2.0)
        others.append(await Client.connect(backend, store=store, config=CONFIG))
    try:
        spaces = [ns, *[await open_namespace(c, ns.name) for c in others]]
        tokens = []
        for trial in range(50):
            opened = await asyncio.gather(
                *[s.open_writer("race", options=WriterOptions(lock_timeout_s=0.2)) for s in spaces],
                return_exceptions=True,
            )
            winners = [w for w in opened if not isinstance(w, BaseException)]
            assert len(winners) == 1, opened
            assert all(isinstance(e, WriterLockedError) for e in opened if isinstance(e, BaseException)), opened
            await winners[0].append(b"%d" % trial)
            tokens.append(winners[0].token)
            await winners[0].close()
        assert tokens == sorted(set(tokens)), tokens
        assert [r.payload for r in await _read_to_end(ns, "race")] == [b"%d" % t for t in range(50)]
    finally:
        for c in others:
            await c.close()
            await c.store.close()


async def test_rolls_under_load_300_segments_and_truncation_frees_ledgers(client: Client) -> None:
    ns = await _ns(client, segment_records_max=3, record_set_bytes_max=1024)
    w = await ns.open_writer("rolls", create=True)
    tailer = await ns.open_reader("rolls")
    confirmed: dict[Position, bytes] = {}
    payloads = [b"r%05d" % i for i in range(960)]
    for start in range(0, len(payloads), 3):
        chunk = payloads[start:start + 3]
        confirmed.update(zip(await asyncio.gather(*[w.append_async(p) for p in chunk]), chunk, strict=True))
    seen = []
    while len(seen) < len(payloads):
        rec = await tailer.read_next(timeout_s=20.0)
        assert rec is not None, f"tailer stalled after {len(seen)}"
        seen.append(rec)
    await tailer.close()
    await w.close()
    segments = (await ns.info("rolls")).record.segments
    assert len(segments) >= 300
    everything = await _read_to_end(ns, "rolls")
    result = check_stream({"tailer": _pairs(seen), "catch-up": _pairs(everything)}, confirmed, attempted=payloads)
    assert result.ok, result.explain()
    # truncation and retention free the ledgers; a cursor holds retention back
    cut = everything[600].position
    await ns.commit_cursor("rolls", "eu", everything[300].position)
    gone = await ns.truncate("rolls", before=everything[150].position)
    assert gone
    live = set(await client.list_ledgers())
    assert not set(gone) & live
    for ledger_id in gone:
        with pytest.raises(NoSuchLedgerError):
            await client.ledger_metadata(ledger_id)
    held = await open_namespace(client, ns.name, retention_bytes_max=1, retain_unconsumed=True)
    point = await held.apply_retention("rolls")
    assert point == Position(everything[300].position.segment_seq, 0, 0)
    await held.commit_cursor("rolls", "eu", cut)
    assert await held.apply_retention("rolls") == Position(cut.segment_seq, 0, 0)
    remaining = (await ns.info("rolls")).record.segments
    assert remaining[0].seq == cut.segment_seq
    assert {s.ledger_id for s in segments if s.seq < cut.segment_seq}.isdisjoint(set(await client.list_ledgers()))
