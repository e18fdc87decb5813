"""Shared pytest setup: fixtures live in the shipped test kit (``scriba.testing``).

No silent escapes (RELIABILITY.md, harness 8): an exception that reaches an event
loop's exception handler ("Task exception was never retrieved", "Future exception was
never retrieved", an exception in a ``call_soon`` callback, an error while a loop shuts
down) fails the test that caused it. ``BaseEventLoop.call_exception_handler`` is wrapped
once for the whole session, so every loop in every thread is covered: the tests' own,
``asyncio.run`` inside a test, ``SyncClient``'s thread and in-process servers. The
wrapper still calls the loop's handler (the message is logged as before) and records
the context; the autouse fixture collects garbage at the end of a test that ran an
event loop (an unretrieved task is reported when it is destroyed) and fails the test
if anything was recorded. A test
that provokes an escape on purpose takes the ``loop_exceptions`` fixture and clears
what it expected (``tests/test_no_silent_escapes.py``).

Exceptions Python cannot raise (in ``__del__``, in a generator's close) reach
``sys.unraisablehook``; pytest turns them into ``PytestUnraisableExceptionWarning``,
an error under ``filterwarnings = error`` (pyproject.toml).

No leftovers (``scriba.testing.hygiene``): a test module that leaves a child process
running, a run that ends with one, or a test that changes structlog's process-wide
configuration fails, naming the process (pid, command line) or the test
(``tests/testing/test_hygiene.py``).
"""

from __future__ import annotations

import asyncio.base_events
import contextlib
import functools
import gc
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from scriba.grpc_runtime import apply_defaults

apply_defaults()  # tests run gRPC the way the scriba commands do (before anything imports it)

pytest_plugins = ["scriba.testing.fixtures", "scriba.testing.hygiene", "pytester"]


class LoopExceptions:
    """Contexts passed to any loop's exception handler since the test began."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._contexts: list[dict[str, Any]] = []
        self.loops_run = 0  # event loops started (run_forever) so far

    def record(self, context: dict[str, Any]) -> None:
        with self._lock:
            self._contexts.append(dict(context))

    def take(self, *, collect: bool = True) -> list[dict[str, Any]]:
        """The recorded contexts; the record is cleared. ``collect``: collect garbage
        first (an unretrieved task or future is reported when it is destroyed)."""
        if collect:
            gc.collect()
        with self._lock:
            contexts, self._contexts = self._contexts, []
        return contexts


def describe(context: dict[str, Any]) -> str:
    exc = context.get("exception")
    what = context.get("message", "")
    if exc is not None:
        what += f": {type(exc).__name__}: {exc}"
    source = context.get("task") or context.get("future") or context.get("handle")
    if source is not None:
        what += f" (in {source!r:.200})"
    return what


LOOP_EXCEPTIONS = LoopExceptions()
_call_exception_handler = asyncio.base_events.BaseEventLoop.call_exception_handler


_run_forever = asyncio.base_events.BaseEventLoop.run_forever


def stdlib_false_alarm(context: dict[str, Any]) -> bool:
    """CPython before 3.12: when a ``start_server`` connection handler task is cancelled,
    the stream protocol's done-callback calls ``task.exception()``, which raises
    CancelledError inside the callback ("Exception in callback ... connection_made...").
    Noise, not an escape: gh-113538, fixed in 3.12.2 (never backported to 3.11)."""
    handle = context.get("handle")
    callback = getattr(handle, "_callback", None)
    return (
        sys.version_info < (3, 12, 2)
        and isinstance(context.get("exception"), asyncio.CancelledError)
        and getattr(callback, "__qualname__", "") == "StreamReaderProtocol.connection_made.<locals>.callback"
    )


GRPC_POLLER_CALLBACK = "PollerCompletionQueue._handle_events"


def grpc_false_alarm(context: dict[str, Any]) -> bool:
    """gRPC aio in a process that runs one event loop after another: ``Channel.close()``
    cancels its calls without waiting for the cancelled operations' completion events,
    which a poller thread then hands to the call's loop. When that loop has been closed
    in between (a test's loop, right after its teardown closed the store), gRPC's reader
    callback raises "Event loop is closed" in whichever loop runs next. The call was
    already cancelled and its loop is gone: noise, not an escape. A process that runs one
    loop for its life (every scriba command) never sees it. One CI run in many hit it.
    gRPC schedules that callback bare or as ``functools.partial(_handle_events, loop)``
    (seen at the teardown of a paused-leader test): both are recognised."""
    handle = context.get("handle")
    callback = getattr(handle, "_callback", None)
    if isinstance(callback, functools.partial):
        callback = callback.func
    exc = context.get("exception")
    return (
        isinstance(exc, RuntimeError)
        and str(exc) == "Event loop is closed"
        and getattr(callback, "__qualname__", "") == GRPC_POLLER_CALLBACK
    )


def _recording_call_exception_handler(
    self: asyncio.base_events.BaseEventLoop, context: dict[str, Any]
) -> None:
    if not (stdlib_false_alarm(context) or grpc_false_alarm(context)):
        LOOP_EXCEPTIONS.record(context)
    _call_exception_handler(self, context)


def _counting_run_forever(self: asyncio.base_events.BaseEventLoop) -> None:
    LOOP_EXCEPTIONS.loops_run += 1
    _run_forever(self)


asyncio.base_events.BaseEventLoop.call_exception_handler = (  # type: ignore[method-assign]
    _recording_call_exception_handler
)
asyncio.base_events.BaseEventLoop.run_forever = _counting_run_forever  # type: ignore[method-assign]


@pytest.fixture
def loop_exceptions() -> LoopExceptions:
    """For tests that provoke an escape on purpose: ``take()`` what was expected."""
    return LOOP_EXCEPTIONS


@pytest.fixture(autouse=True)
def _fail_on_loop_exceptions() -> Iterator[None]:
    # Left by an earlier test's teardown or a wider-scoped fixture: reported here.
    before = LOOP_EXCEPTIONS.take(collect=False)
    loops_run = LOOP_EXCEPTIONS.loops_run
    yield
    # Collecting garbage costs ~0.1 s: only after a test that ran an event loop.
    escaped = before + LOOP_EXCEPTIONS.take(collect=LOOP_EXCEPTIONS.loops_run != loops_run)
    if escaped:
        pytest.fail(
            f"{len(escaped)} unhandled exception(s) in an event loop:\n"
            + "\n".join(f"- {describe(c)}" for c in escaped),
            pytrace=False,
        )


class _SparkSessions:
    """The run's one SparkSession, launched again if its JVM is gone.

    Two CI runs lost the JVM mid-run: once it exited while launching ("Java gateway
    process exited before sending its port number", nothing on its stderr), once between
    the namenode's and the pipeline's modules. Neither happened with those modules run
    alone, and the cause is not found yet, so each test gets a live session: a dead JVM
    is reported (with its exit status, on the terminal) and replaced, and a launch that
    fails is tried again, up to three times."""

    LAUNCHES = 3

    def __init__(self) -> None:
        self.session: Any = None
        self.deaths: list[str] = []

    @staticmethod
    def _jvm() -> Any:
        from pyspark import SparkContext

        gateway = SparkContext._gateway
        return getattr(gateway, "proc", None) if gateway is not None else None

    @staticmethod
    def _forget() -> None:
        """pyspark's process-wide handles on a dead JVM (else getOrCreate hands it back)."""
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        SparkContext._gateway = None
        SparkContext._jvm = None
        SparkContext._active_spark_context = None
        SparkSession._instantiatedSession = None
        SparkSession._activeSession = None

    def get(self, report: Callable[[str], None]) -> Any:
        from scriba.pipeline import local_session, stop_session
        from scriba.testing.hygiene import own

        if self.session is not None:
            jvm = self._jvm()
            if jvm is None or jvm.poll() is None:
                return self.session
            self.deaths.append(f"the Spark JVM (pid {jvm.pid}) exited with {jvm.returncode}")
            report(self.deaths[-1] + "; a new session is launched")
            with contextlib.suppress(Exception):
                stop_session(self.session, timeout_s=5.0)
            if jvm.stdin is not None:
                jvm.stdin.close()  # stop_session gave up on the dead gateway before this
            self.session = None
            self._forget()
        for attempt in range(1, self.LAUNCHES + 1):
            try:
                session = local_session("local[2]", "scriba-tests")
            except Exception as exc:  # pyspark's PySparkRuntimeError (JAVA_GATEWAY_EXITED)
                if attempt == self.LAUNCHES:
                    raise
                report(f"Spark launch {attempt} failed: {exc}")
                self._forget()
                continue
            jvm = self._jvm()
            if jvm is not None:
                own(jvm.pid, "the spark fixture")
            self.session = session
            return session
        raise AssertionError("unreachable")

    def stop(self) -> None:
        if self.session is not None:
            from scriba.pipeline import stop_session

            session, self.session = self.session, None
            stop_session(session)  # and its JVM: session.stop() leaves it running to the end


_SPARK = _SparkSessions()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Launch the Spark JVM before the first test when any selected test uses ``spark``:
    pyspark forks this process to start it, and a fork taken now, before the tests have
    gRPC channels, servers and threads running here, is the plainest one it can get."""
    if any("spark" in getattr(item, "fixturenames", ()) for item in session.items):
        try:
            import pyspark  # noqa: F401
        except ImportError:
            return  # the fixture skips those tests
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        _SPARK.get(lambda line: reporter.write_line(line, yellow=True) if reporter is not None else None)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _SPARK.stop()


@pytest.fixture
def spark(request: pytest.FixtureRequest) -> Any:
    """One SparkSession (local[2], loopback binds) for the whole run — the pipeline tests and
    the namenode's ``webhdfs://`` test share it: a session costs 9-15 s (more on a busy machine)."""
    pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]'")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")

    def report(line: str) -> None:
        if reporter is not None:
            reporter.write_line(f"{request.node.nodeid}: {line}", yellow=True)

    return _SPARK.get(report)
