"""Coalescing ZooKeeper writes into multis: one round trip for the writes of one loop tick.

Why: kazoo spends ~250-350 µs of client CPU per request (its connection thread
wakes, selects and sends once per request, reads once per answer, and a completion
thread hands each answer back), so 64 creators doing create + close were bound by
kazoo, not by ZooKeeper. A ZooKeeper ``multi`` carries many writes in one request
and one answer.

Theory of operation: every ``create`` and ``set`` the store issues becomes a
:class:`ZkWrite` queued here; the first write of a tick schedules a flush for the end
of that tick (``loop.call_soon``), so everything issued meanwhile goes out together.
A flush cuts the queue into batches of at most :data:`BATCH_OPS_MAX` writes and
:data:`BATCH_BYTES_MAX` bytes (ZooKeeper refuses a request over ``jute.maxbuffer``,
~1 MiB, by closing the connection), with at most :data:`BATCHES_INFLIGHT_MAX`
batches in flight; what waits meanwhile simply joins a later, larger batch. A batch
of one write is sent as that plain request (no multi overhead, no all-or-nothing).

A multi is all-or-nothing, but the writes here are unrelated to each other, so
:func:`sort_results` gives each write its own outcome: on success every write gets
its result; on failure ZooKeeper names the first write that failed (its error goes to
that write's caller alone, exactly as a plain request would have failed) and marks
the others rolled back — nothing of them was applied, so they are queued again and
sent in a later batch. Each round settles at least one write, so the retries end;
a write is re-queued at most :data:`REQUEUES_MAX` times (an invariant). A lost
connection or a time-out leaves the outcome of every write in the batch unknown;
each caller gets that error, as it would for its own request.

The planning and the sorting are pure functions; the store (``meta/zookeeper.py``)
owns the queue and the kazoo calls.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from scriba.invariant import invariant

BATCH_OPS_MAX: Final = 128
BATCH_BYTES_MAX: Final = 512 * 1024
BATCHES_INFLIGHT_MAX: Final = 4
REQUEUES_MAX: Final = BATCH_OPS_MAX
OP_OVERHEAD_BYTES: Final = 64
"""Per-write framing in a multi (headers, version, flags, ACL), counted generously."""


class WriteKind(enum.Enum):
    CREATE = "create"
    SET = "set"


@dataclass(slots=True, eq=False)
class ZkWrite:
    """One write a caller waits for; ``future`` gets the new version or the write's error."""

    kind: WriteKind
    path: str
    value: bytes
    future: asyncio.Future[int]
    version: int = -1  # SET: the expected version
    ephemeral: bool = False  # CREATE
    requeues: int = 0

    @property
    def size_bytes(self) -> int:
        return len(self.value) + len(self.path) + OP_OVERHEAD_BYTES


def take_batch(
    pending: deque[ZkWrite], *, ops_max: int = BATCH_OPS_MAX, bytes_max: int = BATCH_BYTES_MAX
) -> list[ZkWrite]:
    """Pop the next batch off ``pending``: in order, within both limits, never empty."""
    invariant(bool(pending), "take_batch on an empty queue")
    batch = [pending.popleft()]  # a write alone is always sent, whatever its size
    size = batch[0].size_bytes
    while pending and len(batch) < ops_max and size + pending[0].size_bytes <= bytes_max:
        write = pending.popleft()
        size += write.size_bytes
        batch.append(write)
    return batch


@dataclass(frozen=True, slots=True)
class Sorted:
    """Each write's fate after a multi: settled with a value or an error, or sent again."""

    values: list[tuple[ZkWrite, int]] = field(default_factory=list)
    errors: list[tuple[ZkWrite, BaseException]] = field(default_factory=list)
    again: list[ZkWrite] = field(default_factory=list)


def sort_results(
    batch: Sequence[ZkWrite], results: Sequence[object], rolled_back: tuple[type[BaseException], ...]
) -> Sorted:
    """Map a multi's per-write results back to the writes (see the module docstring)."""
    invariant(
        len(results) == len(batch),
        f"a multi of {len(batch)} writes answered with {len(results)} results",
    )
    out = Sorted()
    failed = any(isinstance(r, BaseException) for r in results)
    for write, result in zip(batch, results, strict=True):
        if isinstance(result, rolled_back):
            out.again.append(write)
        elif isinstance(result, BaseException):
            out.errors.append((write, result))
        elif write.kind is WriteKind.CREATE:
            out.values.append((write, 0))  # a new znode is at version 0
        else:
            out.values.append((write, int(result.version)))  # type: ignore[attr-defined]
    invariant(
        not failed or bool(out.errors),
        "a failed multi must name the write that failed; every write rolled back would loop",
    )
    return out


CommitOne = Callable[[ZkWrite], Awaitable[int]]
CommitMany = Callable[[Sequence[ZkWrite]], Awaitable[list[Any]]]


class MultiWriter:
    """The queue of one store's writes and the tasks that send them (on the event loop)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        commit_one: CommitOne,
        commit_many: CommitMany,
        rolled_back: tuple[type[BaseException], ...],
        map_error: Callable[[ZkWrite, BaseException], BaseException],
    ) -> None:
        self._loop = loop
        self._commit_one = commit_one
        self._commit_many = commit_many
        self._rolled_back = rolled_back
        self._map_error = map_error
        self._pending: deque[ZkWrite] = deque()
        self._inflight: set[asyncio.Task[None]] = set()
        self._flush_scheduled = False
        self.ops_max = BATCH_OPS_MAX  # read when opened: 1 turns coalescing off (a baseline)
        self.multis = 0  # counters for tests and benchmarks
        self.multi_writes = 0
        self.requeued = 0

    async def write(self, write: ZkWrite) -> int:
        """Queue ``write``; its new version, or its error (kazoo's, or the store's)."""
        self._queue(write)
        return await write.future

    def _queue(self, write: ZkWrite) -> None:
        self._pending.append(write)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        while self._pending and len(self._inflight) < BATCHES_INFLIGHT_MAX:
            batch = take_batch(self._pending, ops_max=self.ops_max)
            task = self._loop.create_task(self._send(batch))
            self._inflight.add(task)
            task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        if self._pending and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    async def _send(self, batch: list[ZkWrite]) -> None:
        try:
            if len(batch) == 1:
                version = await self._commit_one(batch[0])
                _settle(batch[0], version, None)
                return
            results = await self._commit_many(batch)
        except BaseException as exc:  # the outcome of every write is unknown (or its own error)
            for write in batch:
                _settle(write, 0, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        self.multis += 1
        self.multi_writes += len(batch)
        try:
            fates = sort_results(batch, results, self._rolled_back)
        except BaseException as exc:
            for write in batch:
                _settle(write, 0, exc)
            return
        for write, version in fates.values:
            _settle(write, version, None)
        for write, error in fates.errors:
            _settle(write, 0, self._map_error(write, error))
        for write in fates.again:
            write.requeues += 1
            self.requeued += 1
            if write.requeues > REQUEUES_MAX:
                _settle(write, 0, _requeue_limit(write))
            elif not write.future.done():  # its caller may have given up meanwhile
                self._queue(write)


def _requeue_limit(write: ZkWrite) -> BaseException:
    from scriba.errors import InternalError

    return InternalError(f"{write.kind.value} {write.path}: rolled back in {REQUEUES_MAX} multis in a row")


def _settle(write: ZkWrite, version: int, error: BaseException | None) -> None:
    fut = write.future
    if fut.done():  # the caller gave up (cancelled); nobody waits
        return
    if error is None:
        fut.set_result(version)
    elif isinstance(error, asyncio.CancelledError):
        fut.cancel()
    else:
        fut.set_exception(error)
