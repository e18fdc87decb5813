"""What the metadata contract suite (``test_meta_contract*.py``) waits on, each with a deadline.

Watch events (``next_event``, ``read_until_synced``, ``collect_until``), another client's
read settling on a completed write (``read_settles``: at once on memory and etcd, within a
deadline on ZooKeeper, whose reads are sequentially consistent), a watch's changes as each
backend may deliver them (``assert_changes``: ZooKeeper may coalesce intermediate versions
per key), and a client in a process of its own (``client_process``, for clients killed
without closing). Session timeouts are 2 s (conftest's default), so waits for expiry are
``EXPIRY_WAIT_S``.
"""

from __future__ import annotations

import asyncio
import sys
from asyncio.subprocess import Process
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from scriba.errors import NoSuchKeyError
from scriba.meta.store import EventKind, MetadataStore, WatchEvent
from scriba.testing.waiting import eventually

if TYPE_CHECKING:
    from conftest import Backend

SESSION_TIMEOUT_S = 2.0  # conftest's default for every store

EVENT_WAIT_S = 10.0
EXPIRY_WAIT_S = SESSION_TIMEOUT_S + 3.0  # "within the session timeout", plus slack for a loaded machine


async def next_event(events: AsyncIterator[WatchEvent], timeout_s: float = EVENT_WAIT_S) -> WatchEvent:
    return await asyncio.wait_for(anext(events), timeout_s)


async def read_until_synced(events: AsyncIterator[WatchEvent]) -> list[WatchEvent]:
    initial: list[WatchEvent] = []
    while True:
        event = await next_event(events)
        if event.kind is EventKind.SYNCED:
            return initial
        initial.append(event)


Change = tuple[str, str, bytes | None]  # (kind name, key, value)


async def read_settles(backend: Backend, read: Callable[[], Awaitable[object]], expected: object) -> None:
    """Another client's read sees a completed write: at once on memory/etcd; on ZooKeeper
    (sequential consistency: that client's server may lag) within a short deadline."""
    if backend.fresh_reads:
        assert await read() == expected
        return

    async def settled() -> bool:
        try:
            got = await read()
        except NoSuchKeyError:
            got = NoSuchKeyError
        return bool(got == expected)

    await eventually(settled, EVENT_WAIT_S, what=f"another client's read returns {expected!r}", interval_s=0.02)


async def value_of(store: MetadataStore, key: str) -> bytes:
    return (await store.get(key)).value


def assert_changes(backend: Backend, got: Sequence[Change], expected: Sequence[Change]) -> None:
    """memory/etcd: exactly ``expected``. ZooKeeper: per key an in-order subsequence ending at the same last change."""
    if backend.exact_watch:
        assert got == expected
        return
    for key in {k for _, k, _ in expected}:
        want = [e for e in expected if e[1] == key]
        have = [e for e in got if e[1] == key]
        assert have, f"no event for {key}"
        assert have[-1] == want[-1], f"{key}: last event {have[-1]} != {want[-1]}"
        it = iter(want)
        assert all(e in it for e in have), f"{key}: {have} is not an in-order subsequence of {want}"


async def collect_until(events: AsyncIterator[WatchEvent], last: tuple[str, str, bytes | None]) -> list[tuple[str, str, bytes | None]]:
    got: list[tuple[str, str, bytes | None]] = []
    while not got or got[-1] != last:
        event = await next_event(events)
        got.append((event.kind.name, event.key, event.value))
    return got


async def client_process(script: str, *args: str, ready: Callable[[bytes], bool]) -> tuple[Process, bytes]:
    """Run ``script`` as a client in its own process; return it once it printed a ``ready`` line."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert child.stdout is not None
        async with asyncio.timeout(30.0):  # unconfigured structlog may print log lines first
            while (line := await child.stdout.readline()) and not ready(line):
                pass
    except BaseException:
        child.kill()
        await asyncio.wait_for(child.wait(), 10.0)
        raise
    return child, line
