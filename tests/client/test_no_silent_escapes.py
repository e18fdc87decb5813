"""Negative controls of the no-silent-escapes rule (``tests/conftest.py``).

Each test provokes one kind of escape and shows it is recorded; the last runs an inner
pytest session with the same conftest and shows that a test leaking an exception fails.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from pathlib import Path
from typing import Any

import pytest
from grpc._cython import cygrpc

CONFTEST = Path(__file__).resolve().parent.parent / "conftest.py"


class Boom(Exception):
    pass


async def _raise() -> None:
    raise Boom("escaped")


def _messages(contexts: list[dict[str, Any]]) -> list[tuple[str, type[BaseException] | None]]:
    return [(c.get("message", ""), type(c.get("exception")) if c.get("exception") else None) for c in contexts]


async def test_task_exception_never_retrieved_is_recorded(loop_exceptions: Any) -> None:
    task = asyncio.get_running_loop().create_task(_raise())
    await asyncio.wait([task])
    del task  # destroyed without anyone asking for its exception
    assert _messages(loop_exceptions.take()) == [("Task exception was never retrieved", Boom)]


async def test_exception_in_callback_is_recorded(loop_exceptions: Any) -> None:
    def callback() -> None:
        raise Boom("in a callback")

    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.call_soon(callback)
    loop.call_soon(done.set)
    await asyncio.wait_for(done.wait(), 5)
    (context,) = loop_exceptions.take()
    assert context["message"].startswith("Exception in callback") and isinstance(context["exception"], Boom)


def test_exception_on_a_loop_in_another_thread_is_recorded(loop_exceptions: Any) -> None:
    def run() -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.call_soon(lambda: 1 / 0)
            loop.call_soon(loop.stop)
            loop.run_forever()
        finally:
            loop.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert [type(c["exception"]) for c in loop_exceptions.take()] == [ZeroDivisionError]


def test_nothing_recorded_without_an_escape(loop_exceptions: Any) -> None:
    async def fine() -> int:
        task = asyncio.get_running_loop().create_task(asyncio.sleep(0, 7))
        return await task

    assert asyncio.run(fine()) == 7
    assert loop_exceptions.take() == []


LEAKY_TESTS = '''
import asyncio

async def _raise():
    raise RuntimeError("leaked on purpose")

async def test_leaks_a_task_exception():
    task = asyncio.get_running_loop().create_task(_raise())
    await asyncio.wait([task])

def test_leaks_in_a_callback():
    async def main():
        asyncio.get_running_loop().call_soon(lambda: 1 / 0)
        await asyncio.sleep(0.01)
    asyncio.run(main())

async def test_clean():
    await asyncio.sleep(0)
'''


def test_a_leaking_test_fails(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_leaky=LEAKY_TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-o", "asyncio_mode=auto",
        "-o", "asyncio_default_fixture_loop_scope=function",
    )
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_leaks_a_task_exception*",
        "1 unhandled exception(s) in an event loop:",
        "- Task exception was never retrieved: RuntimeError: leaked on purpose*",
    ])
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_leaks_in_a_callback*",
        "1 unhandled exception(s) in an event loop:",
        "- Exception in callback *ZeroDivisionError: division by zero*",
    ])


async def test_a_cancelled_stream_handler_is_no_escape_but_a_cancelled_callback_is(loop_exceptions: Any) -> None:
    """The one known false alarm (CPython < 3.12.2, gh-113538: a cancelled start_server
    handler makes asyncio's own done-callback raise CancelledError) is not recorded; any
    other callback that raises CancelledError still is."""
    started = asyncio.Event()
    server_side: list[asyncio.StreamWriter] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server_side.append(writer)
        started.set()
        await asyncio.sleep(3600)  # holds the connection until cancelled

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await asyncio.wait_for(started.wait(), 5)
    handlers = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == handler.__qualname__]  # type: ignore[union-attr]
    assert len(handlers) == 1
    handlers[0].cancel()
    await asyncio.wait(handlers)
    await asyncio.sleep(0.01)  # the done-callbacks run
    for w in (writer, *server_side):  # 3.11 leaves the cancelled handler's transport open
        w.close()
        await w.wait_closed()
    server.close()
    await server.wait_closed()
    assert loop_exceptions.take() == []

    def cancelled() -> None:
        raise asyncio.CancelledError

    done = asyncio.Event()
    asyncio.get_running_loop().call_soon(cancelled)
    asyncio.get_running_loop().call_soon(done.set)
    await asyncio.wait_for(done.wait(), 5)
    assert [type(c["exception"]) for c in loop_exceptions.take()] == [asyncio.CancelledError]


GRPC_POLLER_CALLBACK = "PollerCompletionQueue._handle_events"  # as in tests/conftest.py (``conftest``
# names whichever directory's conftest was imported first: not importable from here)


class PollerCompletionQueue:
    """Stands in for gRPC's cython poller (same qualified name of the reader callback)."""

    def _handle_events(self) -> None:
        raise RuntimeError("Event loop is closed")


def test_grpc_stale_event_for_a_closed_loop_is_no_escape_but_other_errors_are(loop_exceptions: Any) -> None:
    """gRPC's late completion event for a loop closed since (``grpc_false_alarm`` in the
    conftest) is not recorded; another error from the same callback, or the same error
    from another callback, still is."""
    assert cygrpc.PollerCompletionQueue._handle_events.__qualname__ == GRPC_POLLER_CALLBACK  # still gRPC's name
    assert PollerCompletionQueue._handle_events.__qualname__ == GRPC_POLLER_CALLBACK

    def other() -> None:
        raise RuntimeError("Event loop is closed")

    loop = asyncio.new_event_loop()
    try:
        poller = PollerCompletionQueue()
        for callback, exc in (
            (poller._handle_events, RuntimeError("Event loop is closed")),  # the false alarm
            (functools.partial(poller._handle_events), RuntimeError("Event loop is closed")),  # as gRPC also calls it
            (poller._handle_events, RuntimeError("something else")),
            (other, RuntimeError("Event loop is closed")),
        ):
            loop.call_exception_handler({
                "message": "Exception in callback", "exception": exc,
                "handle": asyncio.Handle(callback, (), loop),
            })
    finally:
        loop.close()
    assert [(str(c["exception"]), c["handle"]._callback.__qualname__) for c in loop_exceptions.take()] == [
        ("something else", GRPC_POLLER_CALLBACK),
        ("Event loop is closed", other.__qualname__),
    ]
