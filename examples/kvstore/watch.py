"""etcd's Watch service: one bidirectional stream, many watchers, events from history.

A watcher remembers the next revision it owes (``start_revision``, or the current
revision + 1). Woken by the state machine after each new revision (a listener, not
state), it sends the events of its range from that revision up to the applied one,
read from the MVCC history, so nothing is missed or repeated on this replica. A
start revision at or below the compaction point cancels the watch with etcd's
``compact_revision``. Events inside one revision come in key order (etcd uses the
order of the writes in the transaction). A watch created with ``fragment`` gets large
batches cut into pieces of at most ``FRAGMENT_BYTES_MAX``, flagged ``fragment`` but
the last, as etcd does. A watch created with ``progress_notify`` that sent nothing for
``progress_notify_s`` (etcd's 10 minutes by default) gets an empty response whose
header says the revision it has seen up to. Watches do not move across replicas: a
client reconnecting elsewhere resumes from its last revision (``start_revision``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aetcd.rpc import rpc_pb2 as pb
from aetcd.rpc import rpc_pb2_grpc as stubs

from scriba.examples.kvstore.machine import KvMachine

QUEUE_MAX = 1024
EVENTS_PER_RESPONSE_MAX = 1000
FRAGMENT_BYTES_MAX = 1536 * 1024  # etcd's default --max-request-bytes
PROGRESS_NOTIFY_S = 600.0  # etcd's default progress-notify interval (10 minutes)
NOPUT, NODELETE = 0, 1


def split(events: list[Any], fragment: bool) -> list[tuple[list[Any], bool]]:
    """The responses for ``events``: (events, more fragments follow). With ``fragment``,
    etcd's rule: cut where a response would pass ``FRAGMENT_BYTES_MAX``, every piece but
    the last flagged so the client joins them; without, at most ``EVENTS_PER_RESPONSE_MAX``
    events per response, none flagged."""
    if not fragment:
        return [(events[i:i + EVENTS_PER_RESPONSE_MAX], False) for i in range(0, len(events), EVENTS_PER_RESPONSE_MAX)]
    out: list[tuple[list[Any], bool]] = []
    chunk: list[Any] = []
    size = 0
    for event in events:
        event_bytes = event.ByteSize()
        if chunk and size + event_bytes > FRAGMENT_BYTES_MAX:
            out.append((chunk, True))
            chunk, size = [], 0
        chunk.append(event)
        size += event_bytes
    if chunk:
        out.append((chunk, False))
    return out


class Watcher:
    def __init__(self, watch_id: int, req: Any, machine: KvMachine, out: asyncio.Queue[Any], node: Any,
                 progress_notify_s: float = PROGRESS_NOTIFY_S) -> None:
        self.watch_id = watch_id
        self.req = req
        self.machine = machine
        self.out = out
        self.node = node
        self.next_rev = req.start_revision or machine.revision + 1
        self.woken = asyncio.Event()
        self.filters = set(req.filters)
        self.progress_notify_s = progress_notify_s if req.progress_notify else None

    async def run(self) -> None:
        machine = self.machine
        machine.listeners.append(self.woken.set)
        try:
            if self.req.start_revision and self.req.start_revision <= machine.compact_revision:
                await self.out.put(pb.WatchResponse(header=self.node.header(), watch_id=self.watch_id, canceled=True,
                                                    compact_revision=machine.compact_revision,
                                                    cancel_reason="etcdserver: mvcc: required revision has been "
                                                                  "compacted"))
                return
            while True:
                self.woken.clear()
                last = machine.revision
                if self.next_rev <= last:
                    events = [e for e in machine.events(self.req.key, self.req.range_end, self.next_rev, last,
                                                        self.req.prev_kv)
                              if not (e.type == e.PUT and NOPUT in self.filters)
                              and not (e.type == e.DELETE and NODELETE in self.filters)]
                    self.next_rev = last + 1
                    for chunk, more in split(events, self.req.fragment):
                        await self.out.put(pb.WatchResponse(header=self.node.header(last), watch_id=self.watch_id,
                                                            events=chunk, fragment=more))
                try:
                    await asyncio.wait_for(self.woken.wait(), self.progress_notify_s)
                except TimeoutError:  # idle for the interval: tell the client how far it is (no events)
                    seen = min(self.next_rev - 1, machine.revision)
                    await self.out.put(pb.WatchResponse(header=self.node.header(seen), watch_id=self.watch_id))
        finally:
            machine.listeners.remove(self.woken.set)


class Watch(stubs.WatchServicer):  # type: ignore[misc]
    def __init__(self, node: Any, progress_notify_s: float = PROGRESS_NOTIFY_S) -> None:
        self.node = node
        self.progress_notify_s = progress_notify_s

    async def Watch(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        out: asyncio.Queue[Any] = asyncio.Queue(maxsize=QUEUE_MAX)
        watchers: dict[int, asyncio.Task[None]] = {}
        reader = asyncio.get_running_loop().create_task(self._read(request_iterator, out, watchers))
        try:
            while True:
                getter = asyncio.ensure_future(out.get())
                done, _ = await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    return
                yield getter.result()
        finally:
            for task in [reader, *watchers.values()]:
                task.cancel()
            for task in [reader, *watchers.values()]:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _read(self, requests: AsyncIterator[Any], out: asyncio.Queue[Any],
                    watchers: dict[int, asyncio.Task[None]]) -> None:
        next_id = 0
        async for request in requests:
            kind = request.WhichOneof("request_union")
            if kind == "create_request":
                req = request.create_request
                watch_id = req.watch_id or next_id
                next_id = max(next_id, watch_id) + 1
                await out.put(pb.WatchResponse(header=self.node.header(), watch_id=watch_id, created=True))
                watcher = Watcher(watch_id, req, self.node.machine, out, self.node, self.progress_notify_s)
                watchers[watch_id] = asyncio.get_running_loop().create_task(watcher.run())
            elif kind == "cancel_request":
                watch_id = request.cancel_request.watch_id
                task = watchers.pop(watch_id, None)
                if task is not None:
                    task.cancel()
                await out.put(pb.WatchResponse(header=self.node.header(), watch_id=watch_id, canceled=True))
            elif kind == "progress_request":
                await out.put(pb.WatchResponse(header=self.node.header(), watch_id=-1))
