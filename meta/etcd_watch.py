"""Watches on etcd v3: the state at one revision, then a stream that resumes where it stopped.

Watch: read the current state at revision R (paged, every page at R), deliver it,
SYNCED, then watch from R+1; after a broken stream resume from the last revision
delivered + 1; if that revision was compacted, re-read and deliver the difference
(:meth:`EtcdWatcher._resync`). A stream silent for ``WATCH_IDLE_S`` is asked for a
progress report; one that does not answer within ``WATCH_PROGRESS_TIMEOUT_S`` is taken
for dead (its connection's pings may still pass) and resumed likewise. Streams ask for
``hasleader``: a member that loses the leader cancels them, and they resume elsewhere.

The stream resumes by hand, not through ``scriba.retry``: it lives as long as its
reader wants it, bounded by the outage time (``WATCH_OUTAGE_S_MAX`` without an answer:
``MetadataUnavailableError``), not by attempts. A watch holds only the versions it
delivered, never the records: a watch lives as long as its reader, and every record
deleted later would otherwise stay in memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, Final

import grpc
import grpc.aio
from aetcd import rpc  # type: ignore[import-untyped]

from scriba.errors import MetadataUnavailableError
from scriba.log import get_logger
from scriba.meta.etcd_rpc import (
    LIST_PAGE_MAX,
    RETRY_DELAY_S_MAX,
    RETRY_DELAY_S_MIN,
    EtcdRpc,
    prefix_end,
    versioned,
)
from scriba.meta.store import (
    EventKind,
    Versioned,
    WatchEvent,
    check_key,
    check_prefix,
    is_direct_child,
)

log = get_logger(__name__)

WATCH_OUTAGE_S_MAX: Final = 60.0
WATCH_IDLE_S: Final = 5.0
"""Silence on a watch stream after which the watch asks etcd for a progress report."""
WATCH_PROGRESS_TIMEOUT_S: Final = 10.0
"""No answer this long after asking: the stream is dead, though its connection may look alive."""

_WATCH_METADATA: Final = (("hasleader", "true"),)  # the server cancels the watch if its member loses the leader


class EtcdWatcher:
    """The watches of one store: ``stub`` opens their streams."""

    def __init__(self, conn: EtcdRpc) -> None:
        self._conn = conn
        self.stub = rpc.WatchStub(conn.channel)

    async def read_state(self, key: str, prefix: bool) -> tuple[dict[str, Versioned[bytes]], int]:
        """The watched key(s) at one revision R, and R."""
        conn = self._conn
        kb = conn.k(key)
        end = prefix_end(kb) if prefix else b""
        state: dict[str, Versioned[bytes]] = {}
        revision = 0
        start = kb
        for _ in range(1_000_000):
            request = rpc.RangeRequest(key=start, range_end=end, limit=LIST_PAGE_MAX, revision=revision)
            resp = await conn.call(f"watch {key}", conn.kv.Range, request, idempotent=True)
            revision = revision or int(resp.header.revision)
            for kv in resp.kvs:
                k = conn.unk(kv.key)
                if k == key or (prefix and is_direct_child(key, k)):
                    state[k] = versioned(kv)
            if not prefix or not resp.more or not resp.kvs:
                break
            start = bytes(resp.kvs[-1].key) + b"\x00"
        return state, revision

    async def watch(self, key: str, *, prefix: bool = False) -> AsyncGenerator[WatchEvent, None]:
        """``MetadataStore.watch``: the current state, SYNCED, then every change."""
        conn = self._conn
        conn.check_open()
        if prefix:
            check_prefix(key)
        else:
            check_key(key)
        state, revision = await self.read_state(key, prefix)
        known = {k: v.version for k, v in state.items()}
        for k in sorted(state):
            yield WatchEvent(EventKind.PUT, k, state[k].value, state[k].version)
        # This generator lives as long as its reader: it must hold no record it delivered
        # (``known`` keeps versions only), or every record deleted later stays in memory.
        del state
        yield WatchEvent(EventKind.SYNCED)
        loop = asyncio.get_running_loop()
        next_revision = revision + 1
        outage_since: float | None = None
        delay_s = RETRY_DELAY_S_MIN
        # Hand-written, not scriba.retry: a stream that resumes from its revision for as long as
        # its reader wants it, bounded by the outage time rather than by attempts.
        while not conn.closed:
            call = self.stub.Watch(metadata=_WATCH_METADATA, wait_for_ready=True)
            conn.calls.add(call)
            compacted = False
            try:
                kb = conn.k(key)
                create = rpc.WatchCreateRequest(
                    key=kb, range_end=prefix_end(kb) if prefix else b"", start_revision=next_revision
                )
                await call.write(rpc.WatchRequest(create_request=create))
                while True:
                    resp = await self._next_response(call)
                    if resp is None:
                        log.warning("etcd_watch_stalled", key=key, revision=next_revision, hosts=conn.hosts_text)
                        break
                    if resp is grpc.aio.EOF:
                        break
                    outage_since, delay_s = None, RETRY_DELAY_S_MIN
                    if resp.compact_revision:
                        compacted = True
                        break
                    if resp.canceled:
                        break
                    for ev in resp.events:
                        next_revision = ev.kv.mod_revision + 1
                        k = conn.unk(ev.kv.key)
                        if prefix and not is_direct_child(key, k):
                            continue
                        if ev.type == rpc.Event.DELETE:
                            known.pop(k, None)
                            yield WatchEvent(EventKind.DELETE, k, None, ev.kv.mod_revision)
                        else:
                            known[k] = ev.kv.mod_revision
                            yield WatchEvent(EventKind.PUT, k, bytes(ev.kv.value), ev.kv.mod_revision)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:  # the stream broke
                if conn.closed:
                    return
                why = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else "stream finished"
                log.info("etcd_watch_broken", key=key, error=why, hosts=conn.hosts_text)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if conn.closed and task is not None and not task.cancelling():
                    return  # close() cancelled our call, not our caller
                raise
            finally:
                call.cancel()
                conn.calls.discard(call)
            if conn.closed:
                return
            if compacted:
                events, next_revision = await self._resync(key, prefix, known)
                events.reverse()
                while events:  # popped as delivered: nothing of them stays held after
                    yield events.pop()
                continue
            now = loop.time()
            outage_since = outage_since if outage_since is not None else now
            if now - outage_since > WATCH_OUTAGE_S_MAX:
                raise MetadataUnavailableError(
                    f"watch {key}: etcd at {conn.hosts_text} unreachable for {WATCH_OUTAGE_S_MAX:.0f}s"
                )
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, RETRY_DELAY_S_MAX * 2)

    async def _next_response(self, call: Any) -> Any:
        """The stream's next response (or EOF); None if the stream went silent for good.

        A watch on a quiet key is silent by design, so silence alone proves nothing: after
        :data:`WATCH_IDLE_S` the watch asks for a progress report, which etcd answers at once
        on a live stream. No answer within :data:`WATCH_PROGRESS_TIMEOUT_S` means the server no
        longer serves this stream (lost frames, a half-dead connection, a watch etcd dropped)
        even if the connection's keep-alive pings pass; the caller then resumes on a new stream.
        """
        read = asyncio.ensure_future(call.read())
        try:
            done, _ = await asyncio.wait({read}, timeout=WATCH_IDLE_S)
            if not done:
                probe = rpc.WatchRequest(progress_request=rpc.WatchProgressRequest())
                await asyncio.wait_for(call.write(probe), WATCH_PROGRESS_TIMEOUT_S)
                done, _ = await asyncio.wait({read}, timeout=WATCH_PROGRESS_TIMEOUT_S)
                if not done:
                    return None
            return read.result()
        except TimeoutError:
            return None
        finally:
            if not read.done():
                read.cancel()

    async def _resync(
        self, key: str, prefix: bool, known: dict[str, int]
    ) -> tuple[list[WatchEvent], int]:
        """After a compaction: the events from ``known`` to now, and the revision to watch from."""
        state, revision = await self.read_state(key, prefix)
        events = [WatchEvent(EventKind.DELETE, k, None, revision) for k in sorted(known.keys() - state.keys())]
        for k in sorted(state):
            if known.get(k) != state[k].version:
                events.append(WatchEvent(EventKind.PUT, k, state[k].value, state[k].version))
        known.clear()
        known.update({k: v.version for k, v in state.items()})
        log.info("etcd_watch_resynced", key=key, revision=revision)
        return events, revision + 1
