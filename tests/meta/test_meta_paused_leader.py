"""A paused leader (SIGSTOP past its session timeout) is replaced by a leader with a larger
token, and once it runs again it learns it lost leadership within a bounded time (R7's core)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from typing import TYPE_CHECKING

import pytest

from scriba.meta.election import Election
from scriba.meta.store import MetadataStore

if TYPE_CHECKING:
    from conftest import Backend

SESSION_TIMEOUT_S = 2.0
NOTICE_S_MAX = SESSION_TIMEOUT_S + 3.0

_LEADER = """
import asyncio, sys
from scriba.meta import connect
from scriba.meta.election import Election

async def main() -> None:
    store = await connect(sys.argv[1], session_timeout_s=float(sys.argv[2]))
    lead = await Election(store, "paused").campaign("old")
    print("token", lead.token, flush=True)
    await lead.lost.wait()
    print("lost", lead.reason.replace(" ", "_"), flush=True)
    await store.close()

asyncio.run(main())
"""


async def read_line(stream: asyncio.StreamReader, word: bytes, timeout_s: float) -> list[bytes]:
    """The next line starting with ``word`` (skipping log lines), split in words."""
    async with asyncio.timeout(timeout_s):
        while True:
            line = await stream.readline()
            if not line:
                pytest.fail(f"leader process ended before printing {word!r}")
            if line.startswith(word + b" "):
                return line.split()


async def test_a_paused_leader_is_replaced_and_learns_it_lost(backend: Backend, store: MetadataStore) -> None:
    if backend.cluster is None:
        pytest.skip("memory:// cannot be paused from outside")
    if backend.members > 1:
        pytest.skip("the client side of the fault is the same on 3 members: single-member backends suffice")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _LEADER, backend.uri, str(SESSION_TIMEOUT_S),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        old_token = int((await read_line(proc.stdout, b"token", 30.0))[1])
        proc.send_signal(signal.SIGSTOP)  # the fault: the leader stops running, its session ages
        try:
            new = await asyncio.wait_for(Election(store, "paused").campaign("new"), SESSION_TIMEOUT_S + 10.0)
        finally:
            proc.send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        assert new.token > old_token
        words = await read_line(proc.stdout, b"lost", NOTICE_S_MAX)
        noticed_s = time.monotonic() - resumed
        print(f"{backend.name}: old leader noticed after {noticed_s:.2f}s: {words[1].decode()}")
        assert noticed_s < NOTICE_S_MAX, f"the old leader noticed after {noticed_s:.1f}s ({words})"
        assert await Election(store, "paused").leader() == ("new", new.token)
        assert not new.lost.is_set()
        await asyncio.wait_for(proc.wait(), 10.0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
