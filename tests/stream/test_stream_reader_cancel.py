"""A bug of the stream layer found by the RSM work (#13), fixed in ``stream/reader.py``
(``_stop``: the cancelled children are awaited with ``asyncio.wait``); this test keeps it fixed.

(a) ``StreamReader._tail`` awaited its two child tasks in a ``finally`` under
``contextlib.suppress(asyncio.CancelledError)``. When the producer task is cancelled
(``close()``) while it waits there — after ``asyncio.wait`` returned because the
segment's record changed, while the cancelled tailer is still unwinding — the
producer's OWN CancelledError comes out of ``await tailer`` and is swallowed: the
producer loops on (starts a new tailer) and ``close()``, which awaits it, never
returns. The same ``suppress`` also re-raises a failed tailer's exception from the
``finally``, so the ``NoSuchLedgerError`` branch after it (``_explain_missing``) is
never reached. One fix: ``await asyncio.wait({tailer, closed})`` in the ``finally``
(it propagates the caller's cancellation and leaves the children's exceptions to the
code after it).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from scriba.stream.reader import StreamReader


async def _uninterruptible(event: asyncio.Event) -> None:
    while not event.is_set():
        try:
            await event.wait()
        except asyncio.CancelledError:
            continue


async def test_cancel_while_tail_waits_for_its_cancelled_tailer_ends_the_producer() -> None:
    reader: Any = StreamReader.__new__(StreamReader)
    segment = SimpleNamespace(seq=1, is_open=True)
    reader._record = SimpleNamespace(segment=lambda seq: segment)  # the segment stays open: _tail loops
    cleanup_started, release, closed_once = asyncio.Event(), asyncio.Event(), asyncio.Event()
    tailers = 0

    async def open_ledger(_segment: Any) -> object:
        return object()

    async def tail_entries(_reader: Any, _segment: Any) -> None:
        nonlocal tailers
        tailers += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cleanup_started.set()
            await _uninterruptible(release)  # a cleanup that takes a while (e.g. a long poll winding down)
            raise

    async def until_closed(_seq: int) -> None:
        if not closed_once.is_set():
            closed_once.set()
            return  # the record changed: asyncio.wait returns, the finally cancels the tailer
        await asyncio.Event().wait()

    reader._open, reader._tail_entries, reader._until_closed = open_ledger, tail_entries, until_closed
    producer = asyncio.get_running_loop().create_task(reader._tail(segment))
    async with asyncio.timeout(5):
        await cleanup_started.wait()
    producer.cancel()  # what StreamReader.close() does
    release.set()
    done, _ = await asyncio.wait({producer}, timeout=2.0)
    try:
        assert producer in done and producer.cancelled(), f"the producer ran on ({tailers} tailers started)"
    finally:
        producer.cancel()
        release.set()
        await asyncio.wait({producer}, timeout=2.0)
