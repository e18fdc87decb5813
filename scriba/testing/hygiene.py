"""Test-suite hygiene: no test leaves a child process running or structlog reconfigured.

A pytest plugin (``pytest_plugins = ["scriba.testing.hygiene"]``, as ``tests/conftest.py``
does). Two leaks that only show in a full run, long after the test that caused them:

**Child processes.** A test that starts a server (bookie, etcd, a ``scriba`` command, a
console browser, a Spark JVM) and forgets it leaves the process running to the end of the
session, where ``Popen.__del__`` prints ``ResourceWarning: subprocess N is still running``
with no hint of the culprit. Here every test module is checked: the pytest process's
running descendants (read from ``/proc``: pid, parent, state, command line) are taken
before its first test and again after its last test's teardown; what is new and still
running after a grace period (a child that was just signalled gets time to exit) is
reported with its pid and command line as an error of that module, then stopped by PID
(SIGTERM, then SIGKILL) so the rest of the run starts clean. The same list is taken when the
session finishes: anything still running then fails the run.

Servers that belong to the whole run are not leaks: whatever a ``session`` or ``package``
scoped fixture starts while it is set up (the shared SparkSession's JVM, the session etcd,
the pipeline tests' bookies) is recorded as *owned* by that fixture, with its whole
subtree (Spark's Python workers are the JVM's children), and is listed, not flagged.
:func:`own` records one more process by hand (a session server a test restarts).
A process started later with the same command line as an owned one (a session etcd or
ZooKeeper member a test kills and restarts on the same data and ports) is owned too.
Zombies are not running and are not reported (their ``Popen`` reaps them when polled).

**structlog's configuration.** structlog's configuration is process-global, and
:mod:`scriba.log` prints through it whenever ``structlog.is_configured()``. A test that
configures it (a CLI ``main()`` called in-process, or ``structlog.testing.capture_logs``,
which restores the processors but leaves structlog *configured*: with its defaults, every
level, to stdout) changes what every later test's library code prints. An autouse
fixture snapshots the configuration before each test and compares it after; a change is
undone and fails that test. Capture logs with :func:`captured_logs`, which restores it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Generator, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog

PROC = Path("/proc")
LEAK_GRACE_S = 10.0  # a child signalled just before the check gets this long to exit
LEAK_GRACE_ENV = "SCRIBA_LEAK_GRACE_S"  # overrides it (the negative controls use a short one)
STOP_GRACE_S = 5.0  # a leaked child gets this long after SIGTERM before SIGKILL


# ---------------------------------------------------------------------------------------
# processes


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str  # /proc/<pid>/stat's state letter: R, S, D, Z (zombie), T, ...
    cmdline: str

    def describe(self) -> str:
        return f"pid {self.pid}: {self.cmdline or '?'}"


def _read_proc(pid: int) -> Proc | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:  # gone meanwhile
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses
    fields = stat[stat.rindex(")") + 2 :].split()
    cmdline = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    return Proc(pid=pid, ppid=int(fields[1]), state=fields[0], cmdline=cmdline[:300])


def process_table() -> dict[int, Proc]:
    """Every process this user can see, by pid (one pass over /proc)."""
    table: dict[int, Proc] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            proc = _read_proc(int(entry.name))
            if proc is not None:
                table[proc.pid] = proc
    return table


def descendants(root: int, table: dict[int, Proc] | None = None) -> dict[int, Proc]:
    """``root``'s children, their children and so on (zombies included)."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: dict[int, Proc] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found[pid] = table[pid]
            todo.extend(children.get(pid, []))
    return found


class ChildWatch:
    """The running descendants of this process, less those owned by the whole run."""

    def __init__(self, root: int | None = None) -> None:
        self.root = os.getpid() if root is None else root
        self.owned: dict[int, str] = {}  # pid -> who owns it (its subtree goes with it)
        self._owned_cmdlines: dict[str, str] = {}  # the same server restarted (same argv)

    def all_running(self) -> dict[int, Proc]:
        return {pid: p for pid, p in descendants(self.root).items() if p.state != "Z"}

    def unowned(self) -> dict[int, Proc]:
        """Running descendants outside every owned process's subtree."""
        table = process_table()
        running = {pid: p for pid, p in descendants(self.root, table).items() if p.state != "Z"}
        excluded: set[int] = set()
        for pid, proc in running.items():
            if pid in self.owned or proc.cmdline in self._owned_cmdlines:
                excluded.add(pid)
                excluded.update(descendants(pid, table))
        return {pid: p for pid, p in running.items() if pid not in excluded}

    def own(self, pid: int, owner: str) -> None:
        """``pid``, its subtree, and a later process with its command line (a test that
        restarts a member of a session server starts it with the same arguments)."""
        self.owned[pid] = owner
        proc = _read_proc(pid)
        if proc is not None and proc.cmdline:
            self._owned_cmdlines.setdefault(proc.cmdline, owner)

    def new_since(
        self, before: set[int], grace_s: float | None = None, *, owned_too: bool = False
    ) -> list[Proc]:
        """Running descendants (unowned ones unless ``owned_too``) not in ``before``, once
        they have had ``grace_s`` to exit (returns as soon as there are none)."""
        if grace_s is None:
            grace_s = float(os.environ.get(LEAK_GRACE_ENV, LEAK_GRACE_S))
        deadline = time.monotonic() + grace_s
        while True:
            running = self.all_running() if owned_too else self.unowned()
            new = [p for pid, p in sorted(running.items()) if pid not in before]
            if not new or time.monotonic() >= deadline:
                return new
            time.sleep(0.1)


WATCH = ChildWatch()


def own(pid: int, owner: str) -> None:
    """Record ``pid`` (and its subtree) as a server of the whole run, not a leak."""
    WATCH.own(pid, owner)


def stop(procs: list[Proc], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM each, SIGKILL what is still running after ``grace_s``; by PID only."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            try:
                os.kill(proc.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            alive = {p.pid for p in procs} & set(WATCH.all_running())
            if not alive:
                return
            time.sleep(0.05)


def _leak_report(what: str, leaked: list[Proc]) -> str:
    return f"{what} left {len(leaked)} child process(es) running (stopped now):\n" + "\n".join(
        f"- {p.describe()}" for p in leaked
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: pytest.FixtureRequest) -> Generator[None, Any, None]:
    if fixturedef.scope not in ("session", "package"):
        yield
        return
    before = set(WATCH.all_running())
    yield
    for pid in set(WATCH.all_running()) - before:
        if pid not in WATCH.owned:
            WATCH.own(pid, f"{fixturedef.scope} fixture {fixturedef.argname!r}")


@pytest.fixture(scope="module", autouse=True)
def _no_leaked_children(request: pytest.FixtureRequest) -> Iterator[None]:
    before = set(WATCH.unowned())
    yield
    leaked = WATCH.new_since(before)
    if leaked:
        stop(leaked)
        pytest.fail(_leak_report(f"module {request.node.nodeid}", leaked), pytrace=False)


_SESSION_BEFORE = pytest.StashKey[set[int]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    # a session run inside a test (pytester, in-process) judges only what it started
    session.stash[_SESSION_BEFORE] = set(WATCH.all_running())


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # the run's own servers too: their fixtures were torn down before this
    leaked = WATCH.new_since(session.stash.get(_SESSION_BEFORE, set()), owned_too=True)
    if not leaked:
        return
    owned = ", ".join(f"pid {pid} ({owner})" for pid, owner in sorted(WATCH.owned.items()))
    text = _leak_report("the session", leaked) + f"\nowned by the run: {owned or 'none'}"
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(text, red=True)
    stop(leaked)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ---------------------------------------------------------------------------------------
# structlog


@dataclass(frozen=True)
class StructlogState:
    configured: bool
    config: dict[str, Any]


def structlog_state() -> StructlogState:
    return StructlogState(structlog.is_configured(), structlog.get_config())


def restore_structlog(state: StructlogState) -> None:
    structlog.reset_defaults()  # also "not configured"
    if state.configured:
        structlog.configure(**state.config)


@contextmanager
def captured_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """``structlog.testing.capture_logs`` that leaves structlog exactly as it found it
    (structlog's own leaves it configured, with its defaults, printing to stdout)."""
    state = structlog_state()
    try:
        with structlog.testing.capture_logs() as logs:
            yield logs
    finally:
        restore_structlog(state)


@pytest.fixture(autouse=True)
def _structlog_untouched(request: pytest.FixtureRequest) -> Iterator[None]:
    before = structlog_state()
    yield
    after = structlog_state()
    if after != before:
        restore_structlog(before)
        pytest.fail(
            f"{request.node.nodeid} changed structlog's process-wide configuration "
            f"(configured {before.configured} -> {after.configured}; it is restored now). "
            "Capture logs with scriba.testing.hygiene.captured_logs; call a CLI main() "
            "without its logging setup.",
            pytrace=False,
        )
