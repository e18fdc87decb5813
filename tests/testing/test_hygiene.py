"""Negative controls of the suite's hygiene checks (``scriba.testing.hygiene``): a test
that leaves a child process running or structlog reconfigured is reported, by name."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from scriba.embedded.process import wait_until
from scriba.log import get_logger
from scriba.testing.hygiene import (
    LEAK_GRACE_ENV,
    ChildWatch,
    captured_logs,
    descendants,
    restore_structlog,
    structlog_state,
)

CONFTEST = Path(__file__).resolve().parent.parent / "conftest.py"
SLEEPER = "import sys, time; time.sleep(120)"  # argv[1] marks which test started it


def test_structlogs_own_capture_leaves_structlog_configured() -> None:
    """Why :func:`captured_logs` exists: after ``structlog.testing.capture_logs`` structlog
    counts as configured (defaults: every level, to stdout), so the library logs to stdout."""
    before = structlog_state()
    assert not before.configured, "the suite runs with structlog unconfigured, as an embedding program"
    with structlog.testing.capture_logs():
        pass
    changed = structlog_state()
    restore_structlog(before)
    assert changed.configured and structlog_state() == before


def test_captured_logs_captures_and_restores() -> None:
    before = structlog_state()
    with captured_logs() as logs:
        get_logger("hygiene-test").info("probe_info", ledger_id=3)
    assert [(e["event"], e["ledger_id"]) for e in logs] == [("probe_info", 3)]
    assert structlog_state() == before


def test_descendants_lists_a_running_child_with_its_command_line() -> None:
    children = [subprocess.Popen([sys.executable, "-c", SLEEPER, tag])
                for tag in ("hygiene-probe", "hygiene-probe", "hygiene-other")]
    first, _restarted, other = children
    try:
        watch = ChildWatch()
        wait_until(lambda: {c.pid for c in children} <= set(watch.unowned()), 30, what="the children in /proc")
        assert "hygiene-probe" in descendants(os.getpid())[first.pid].cmdline
        watch.own(first.pid, "this test")
        # owned: the process, and one with its command line (a session server restarted)
        assert set(watch.unowned()) & {c.pid for c in children} == {other.pid}
        assert {c.pid for c in children} <= set(watch.all_running())
    finally:
        for child in children:
            child.kill()
            child.wait(30)
    assert not {c.pid for c in children} & set(ChildWatch().all_running())


INNER_TESTS = f'''
import subprocess, sys
import pytest
import structlog

SLEEPER = {SLEEPER!r}

@pytest.fixture(scope="session")
def shared_server():
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, "owned-by-the-session"])
    yield proc
    proc.kill()
    proc.wait(30)

def test_leaks_a_child():
    subprocess.Popen([sys.executable, "-c", SLEEPER, "leaked-by-a-test"])

def test_uses_the_shared_server(shared_server):
    assert shared_server.poll() is None

def test_reconfigures_structlog():
    with structlog.testing.capture_logs():
        pass

def test_structlog_was_restored():
    assert not structlog.is_configured()
'''


def test_leaked_children_and_structlog_changes_are_reported(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LEAK_GRACE_ENV, "1")  # the leaked sleepers never exit: no need to wait 10 s
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_inner=INNER_TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-o", "asyncio_mode=auto",
        "-o", "asyncio_default_fixture_loop_scope=function", timeout=120,
    )
    result.assert_outcomes(passed=4, errors=2)
    out = result.stdout.str()
    # the module that leaked a child fails, naming it; the session fixture's server is not blamed
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_structlog_was_restored*",
        "module test_inner.py left 1 child process(es) running (stopped now):",
        "- pid * leaked-by-a-test",
    ])
    assert "owned-by-the-session" not in out
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_reconfigures_structlog*",
        "*changed structlog's process-wide configuration (configured False -> True*",
    ])
    assert "the session left" not in out  # the module's leak was stopped at the module's end
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # named in the error, and again in the short summary where pytest does not shorten it (CI=1)
    (pid,) = {int(p) for p in re.findall(r"- pid (\d+): .*leaked-by-a-test", out)}
    wait_until(lambda: not _running(pid), 30, what=f"pid {pid} gone")  # stopped, not left to run out


SESSION_LEAK = f'''
import subprocess, sys
import pytest

@pytest.fixture(scope="session")
def forgotten_server():
    yield subprocess.Popen([sys.executable, "-c", {SLEEPER!r}, "left-by-a-session-fixture"])

def test_uses_it(forgotten_server):
    assert forgotten_server.poll() is None
'''


def test_a_session_fixture_that_never_stops_its_server_fails_the_run(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a module's leak (the run owns it) but still running when the session ends."""
    monkeypatch.setenv(LEAK_GRACE_ENV, "1")
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_forgets=SESSION_LEAK)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "the session left 1 child process(es) running (stopped now):",
        "- pid * left-by-a-session-fixture",
        "owned by the run: *session fixture 'forgotten_server'*",
    ])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    (pid,) = [int(p) for p in re.findall(r"- pid (\d+): .*left-by-a-session-fixture", result.stdout.str())]
    wait_until(lambda: not _running(pid), 30, what=f"pid {pid} gone")


def test_a_clean_run_passes(pytester: pytest.Pytester) -> None:
    """The control: a session fixture's server, stopped at its teardown, is no leak."""
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_clean=INNER_TESTS.split("def test_leaks_a_child")[0] + (
        "def test_uses_the_shared_server(shared_server):\n    assert shared_server.poll() is None\n"
    ))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.OK and "child process" not in result.stdout.str()


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"
