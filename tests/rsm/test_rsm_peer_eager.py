"""The replica service's connections (``scriba.rsm.peer``): frames read by a buffered
protocol, each request started inside the read that brought it (``scriba.eager``),
deadlines kept by timers, garbage ending only its own connection.

- A request that need not wait is answered before ``data_received`` returns (fed from a
  plain loop callback, as a transport does; and over a real socket, where the handler
  runs with no current task); one that waits goes on in a task and is answered later.
- ``PeerClient.call`` started outside a task (as a follower forwards a proposal from an
  eager step) keeps its deadline: the timer fires, ``DeadlineExceededError``.
- A frame over the limit, a request shorter than its header, an unknown op: each closes
  its connection; the server goes on answering others. Frames split byte by byte or
  packed together are cut right (``wire.FrameReader``).
- A connection closed cancels its requests still waiting; ``connections_max`` holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import pytest

from scriba.embedded.process import free_port
from scriba.errors import BadRequestError, DeadlineExceededError, NoSuchEntryError
from scriba.rsm import wire
from scriba.rsm.peer import PeerClient, PeerConnection, ReplicaServer
from scriba.testing.waiting import eventually

T = TypeVar("T")
DEADLINE_S = 10.0


class Recorded:
    """What the handler saw: each body, and whether it ran inside a task."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.in_task: list[bool] = []
        self.cancelled: list[bytes] = []
        self.gate: asyncio.Future[None] | None = None

    async def handler(self, op: wire.Op, flags: int, body: bytes) -> bytes:
        self.bodies.append(body)
        self.in_task.append(asyncio.current_task() is not None)
        if body.startswith(b"wait"):
            assert self.gate is not None
            try:
                await self.gate
            except asyncio.CancelledError:
                self.cancelled.append(body)
                raise
        if body == b"missing":
            raise NoSuchEntryError("no such thing")
        return b"answer:" + body


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def outside(fn: Callable[[], T]) -> T:
    """``fn()`` from a plain loop callback, outside any task (as ``data_received`` runs)."""
    result: asyncio.Future[T] = asyncio.get_running_loop().create_future()

    def callback() -> None:
        try:
            result.set_result(fn())
        except BaseException as exc:  # handed to the awaiting test
            result.set_exception(exc)

    asyncio.get_running_loop().call_soon(callback)
    return await result


def answers(written: list[bytes]) -> list[tuple[int, bool, bytes]]:
    reader = wire.FrameReader()
    return [wire.parse_response(p) for chunk in written for p in reader.feed(chunk)]


async def test_a_request_that_need_not_wait_is_answered_inside_the_read() -> None:
    seen = Recorded()
    seen.gate = asyncio.get_running_loop().create_future()
    server = ReplicaServer("127.0.0.1:0", seen.handler, 4)
    conn = PeerConnection(server)
    transport = FakeTransport()
    conn.connection_made(transport)
    frames = (wire.request(1, wire.Op.STATUS, b"now") + wire.request(2, wire.Op.PROPOSE, b"wait")
              + wire.request(3, wire.Op.READ, b"missing"))
    written = await outside(lambda: (conn.data_received(frames), list(transport.written))[1])
    # 1 and 3 answered before data_received returned; 2 waits, in a task of its own
    assert answers(written) == [(1, True, b"answer:now"), (3, False, wire.error_body(NoSuchEntryError("no such thing")))]
    assert seen.in_task == [False, False, False] and len(conn.inflight) == 1
    seen.gate.set_result(None)
    await eventually(lambda: len(transport.written) == 3, DEADLINE_S, what="the waiting request answered")
    assert answers(transport.written)[2] == (2, True, b"answer:wait")
    assert not conn.inflight


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, Recorded, ReplicaServer]]:
    seen = Recorded()
    seen.gate = asyncio.get_running_loop().create_future()
    address = f"127.0.0.1:{free_port()}"
    server = ReplicaServer(address, seen.handler, 3)
    await server.start()
    try:
        yield address, seen, server
    finally:
        await server.close()


async def call(address: str, body: bytes, timeout_s: float = DEADLINE_S) -> bytes:
    client = PeerClient(address)
    try:
        return await asyncio.wait_for(client.call(wire.Op.STATUS, body, timeout_s), DEADLINE_S * 2)
    finally:
        await client.close()


async def test_over_a_socket_the_handler_runs_inside_the_read(served: tuple[str, Recorded, ReplicaServer]) -> None:
    address, seen, _ = served
    assert await call(address, b"a") == b"answer:a"
    assert await call(address, b"b") == b"answer:b"
    assert seen.in_task == [False, False]  # no task, no loop turn between the read and the answer


async def test_a_call_started_outside_a_task_times_out_by_its_timer(
        served: tuple[str, Recorded, ReplicaServer]) -> None:
    """A follower forwards from an eager step: ``asyncio.timeout`` would raise there."""
    address, seen, _ = served
    client = PeerClient(address)
    try:
        assert await client.call(wire.Op.STATUS, b"connect", DEADLINE_S) == b"answer:connect"
        with pytest.raises(DeadlineExceededError, match=r"no answer to STATUS within 0\.05 s"):
            await asyncio.wait_for(_drive_outside(client.call(wire.Op.STATUS, b"wait-forever", 0.05)), DEADLINE_S)
        assert await client.call(wire.Op.STATUS, b"after", DEADLINE_S) == b"answer:after"  # the link goes on
    finally:
        await client.close()
    assert seen.bodies == [b"connect", b"wait-forever", b"after"]


async def _drive_outside(coro: Any) -> Any:
    """``coro``'s outcome, its first step run by ``start_eagerly`` from a plain loop callback
    (outside any task: ``asyncio.timeout`` would raise there)."""
    from scriba.eager import start_eagerly

    result: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def run() -> None:
        try:
            result.set_result(await coro)
        except Exception as exc:  # handed to the awaiting test
            result.set_exception(exc)

    asyncio.get_running_loop().call_soon(start_eagerly, run())
    return await result


async def raw_exchange(address: str, first: bytes, then: bytes = b"") -> tuple[bytes, bytes]:
    """On a fresh connection send ``first`` and read one frame back (if ``then``), then send
    ``then``: (that frame, everything else the server sends until it closes)."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(first)
        answer = b""
        if then:
            (length,) = wire.LENGTH.unpack(await asyncio.wait_for(reader.readexactly(wire.LENGTH.size), DEADLINE_S))
            answer = wire.LENGTH.pack(length) + await asyncio.wait_for(reader.readexactly(length), DEADLINE_S)
            writer.write(then)
        return answer, await asyncio.wait_for(reader.read(), DEADLINE_S)  # EOF: the server closed it
    finally:
        writer.close()


@pytest.mark.parametrize("garbage", [
    wire.LENGTH.pack(wire.FRAME_BYTES_MAX + 1) + b"x" * 64,  # over the limit: refused from the length
    wire.LENGTH.pack(3) + b"abc",  # shorter than a request header
    wire.LENGTH.pack(wire.REQUEST.size) + wire.REQUEST.pack(9, 99, 0),  # an unknown op
], ids=["oversized", "short", "unknown-op"])
async def test_garbage_closes_its_connection_and_the_server_goes_on(
        served: tuple[str, Recorded, ReplicaServer], garbage: bytes) -> None:
    address, seen, server = served
    good = wire.request(1, wire.Op.STATUS, b"first")
    got, rest = await raw_exchange(address, good, garbage + wire.request(2, wire.Op.STATUS, b"never"))
    assert answers([got]) == [(1, True, b"answer:first")] and rest == b""  # closed unanswered
    assert await call(address, b"still") == b"answer:still"
    assert seen.bodies == [b"first", b"still"]
    await eventually(lambda: not server.connections, DEADLINE_S, what="the garbage connection gone")


def test_frame_reader_joins_split_frames_and_cuts_packed_ones() -> None:
    frames = [wire.request(i, wire.Op.READ, bytes([i]) * (i * 97)) for i in range(1, 6)]
    stream = b"".join(frames)
    byte_by_byte = wire.FrameReader()
    got = [p for i in range(len(stream)) for p in byte_by_byte.feed(stream[i:i + 1])]
    assert got == [f[wire.LENGTH.size:] for f in frames] == wire.FrameReader().feed(stream)
    with pytest.raises(BadRequestError, match="exceeds 10"):
        wire.FrameReader(10).feed(wire.LENGTH.pack(11))


async def test_a_closed_connection_cancels_its_waiting_requests(served: tuple[str, Recorded, ReplicaServer]) -> None:
    address, seen, server = served
    host, port = address.rsplit(":", 1)
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(wire.request(1, wire.Op.PROPOSE, b"wait-1"))
    await eventually(lambda: seen.bodies == [b"wait-1"], DEADLINE_S, what="the handler saw the request")
    writer.close()
    await eventually(lambda: seen.cancelled == [b"wait-1"], DEADLINE_S, what="its waiting request cancelled")
    await eventually(lambda: not server.connections, DEADLINE_S, what="the connection gone")


async def test_connections_beyond_the_limit_are_closed(served: tuple[str, Recorded, ReplicaServer]) -> None:
    address, seen, server = served
    host, port = address.rsplit(":", 1)
    held = [await asyncio.open_connection(host, int(port)) for _ in range(3)]
    try:
        await eventually(lambda: len(server.connections) == 3, DEADLINE_S, what="three connections held")
        extra = await raw_exchange(address, wire.request(1, wire.Op.STATUS, b"extra"))
        assert extra == (b"", b"") and seen.bodies == []  # closed unanswered
    finally:
        for _, writer in held:
            writer.close()
    await eventually(lambda: not server.connections, DEADLINE_S, what="the connections gone")
    assert await call(address, b"room again") == b"answer:room again"
