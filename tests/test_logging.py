"""Logging: a program embedding Scriba without configuring logging sees warnings only;
the ``scriba`` commands and a program that configures structlog see what they asked for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# A program that embeds the client: a memory:// store, a ledger record deleted through the
# client (which logs ``ledger_deleted`` at info), a debug line and a warning of its own.
EMBEDDER = """
import asyncio, sys
import structlog
from scriba.client import Client
from scriba.log import get_logger
from scriba.meta import connect
from scriba.meta.records import ledger_key

if sys.argv[1] == "configured":
    structlog.configure()  # the embedding program's own choice: structlog's defaults, every level

log = get_logger("embedder").bind(ledger_id=7)

async def main() -> None:
    store = await connect("memory://embedded-logging")
    await store.create(ledger_key(7), b"{}")
    async with Client.connect("memory://embedded-logging", store=store) as client:
        await client.delete_ledger(7)
    await store.close()
    log.debug("probe_debug")
    log.info("probe_info")
    log.warning("probe_warning")
    print("done", flush=True)

asyncio.run(main())
"""


def run_embedder(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "embedder.py"
    script.write_text(EMBEDDER)
    return subprocess.run([sys.executable, "-P", str(script), mode], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)


def test_embedded_without_configuration_logs_warnings_only(tmp_path: Path) -> None:
    done = run_embedder(tmp_path, "unconfigured")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n", "a library never writes its logs to the program's stdout"
    assert "probe_warning" in done.stderr and "ledger_id=7" in done.stderr  # warnings still show
    for quiet in ("ledger_deleted", "probe_info", "probe_debug"):
        assert quiet not in done.stderr, done.stderr


def test_embedded_with_structlog_configured_follows_that_configuration(tmp_path: Path) -> None:
    """The control: the same program, configuring structlog, sees the client's info line."""
    done = run_embedder(tmp_path, "configured")
    assert done.returncode == 0, done.stderr
    text = done.stdout + done.stderr
    for shown in ("ledger_deleted", "probe_info", "probe_debug", "probe_warning"):
        assert shown in text, text


@pytest.mark.parametrize(("level", "shown", "hidden"), [
    ("info", ["probe_info", "probe_warning"], ["probe_debug"]),
    ("debug", ["probe_debug", "probe_info"], []),
    ("error", [], ["probe_info", "probe_warning"]),
])
def test_cli_configure_sets_the_level_for_loggers_made_before_it(
        level: str, shown: list[str], hidden: list[str]) -> None:
    code = (
        "import io, sys\n"
        "from scriba.log import configure, get_logger\n"
        "log = get_logger('early').bind(ledger_id=1)\n"  # made at import time, before configure
        f"configure(level={level!r}, stream=sys.stdout)\n"
        "log.debug('probe_debug'); log.info('probe_info'); log.warning('probe_warning')\n"
    )
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for word in shown:
        assert word in done.stdout, done.stdout
    for word in hidden:
        assert word not in done.stdout, done.stdout
