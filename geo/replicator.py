"""``Replicator``: the asyncio shell that runs the links into one target stream.

One replicator owns one target stream (it is that stream's single writer) and runs a
link from each source cluster into it; in active-active setups the application in
the target cluster appends through :meth:`Replicator.append_local`, so local records
and replicated ones share the one writer.

A session: open the target stream's writer (the writer lock lets one replicator win;
the others wait and retry; opening fences any earlier writer and closes its segments),
find each link's resume point in the target stream itself (``progress``), open a
reader on each source stream right after it, and append the records the link core
says to ship (``link``), in source order, pipelined (``inflight_max``). Any error of
the writer or a reader ends the session; nothing of its in-memory state survives:
the next session starts again from the target's own contents, so a crash anywhere
(before, during or after an append) neither loses nor duplicates a record.

Retention (Pulsar's replication cursor): each link keeps a named cursor on its source
stream (:func:`hold_cursor_name`) at the last source position the target confirmed,
committed at most every ``hold_interval_s``. It is never read to resume (the target's
own contents say where), only to hold the source's history: the source's retention
(``retain_unconsumed``) and an RSM's snapshot truncation keep what the cursor has not
passed, so a replicator that is down for a while resumes instead of finding its
records truncated away. ``hold_interval_s=None`` keeps no cursor.

Errors that retrying cannot mend (a missing stream or namespace, a source truncated
past the resume point, bad configuration) end :meth:`run` with that error.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scriba.errors import (
    ConfigError,
    NamespaceNotFoundError,
    PositionOutOfRangeError,
    PositionTruncatedError,
    ScribaError,
    StreamNotFoundError,
    UnauthorizedError,
)
from scriba.geo.link import Lag, LinkCore
from scriba.geo.marks import check_cluster_name
from scriba.geo.scan import find_resume_points
from scriba.geo.translate import HOLD_CURSOR_PREFIX
from scriba.log import get_logger
from scriba.stream import Namespace, Position, StreamWriter, WriterOptions
from scriba.stream.settings import check_name

log = get_logger(__name__)

FATAL = (ConfigError, NamespaceNotFoundError, StreamNotFoundError, PositionTruncatedError,
         PositionOutOfRangeError, UnauthorizedError)


@dataclass(frozen=True, slots=True)
class Cluster:
    """A cluster as the replicator sees it: its stable name and the namespace there."""

    name: str
    namespace: Namespace


@dataclass(frozen=True, slots=True)
class ReplicatorOptions:
    local_only: bool = False  # ship only records that originated in the source (full mesh)
    inflight_max: int = 1024  # records appended and not yet confirmed, per link
    retry_delay_s: float = 0.1
    retry_delay_max_s: float = 5.0
    scan_timeout_s: float = 30.0  # reading the target's last segment(s) when a session starts
    writer_watch_s: float = 0.2  # how often an idle session checks that its target writer still holds the lock
    hold_interval_s: float | None = 1.0  # how often the source cursor holding the history moves (None: no cursor)
    writer: WriterOptions = field(default_factory=WriterOptions)

    def validate(self) -> ReplicatorOptions:
        if not 1 <= self.inflight_max < self.writer.records_waiting_max:
            raise ConfigError(f"inflight_max must be in [1, writer.records_waiting_max), got {self.inflight_max}")
        if not 0 < self.retry_delay_s <= self.retry_delay_max_s:
            raise ConfigError("retry delays must satisfy 0 < retry_delay_s <= retry_delay_max_s")
        if self.writer_watch_s <= 0:
            raise ConfigError(f"writer_watch_s must be > 0, got {self.writer_watch_s}")
        if self.scan_timeout_s <= 0:
            raise ConfigError(f"scan_timeout_s must be > 0, got {self.scan_timeout_s}")
        if self.hold_interval_s is not None and self.hold_interval_s <= 0:
            raise ConfigError(f"hold_interval_s must be > 0 or None, got {self.hold_interval_s}")
        return self


class Replicator:
    def __init__(self, target: Cluster, stream: str, sources: Sequence[Cluster],
                 options: ReplicatorOptions | None = None) -> None:
        check_name(stream)
        check_cluster_name(target.name)
        if not sources:
            raise ConfigError("a replicator needs at least one source cluster")
        names = [check_cluster_name(s.name) for s in sources]
        if len(set(names)) != len(names):
            raise ConfigError(f"source clusters named twice: {names}")
        if target.name in names:
            raise ConfigError(f"cluster {target.name!r} is both the target and a source")
        self.target = target
        self.stream = stream
        self.sources = tuple(sources)
        self.options = (options or ReplicatorOptions()).validate()
        self.sessions = 0
        self._cores: dict[str, LinkCore] = {}
        self._writer: StreamWriter | None = None
        self._ready = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._log = log.bind(stream=f"{target.namespace.name}/{stream}", cluster=target.name)

    # --- views -----------------------------------------------------------------------
    def lag(self, now_ms: int | None = None) -> dict[str, Lag]:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return {name: core.lag(now) for name, core in self._cores.items()}

    def links(self) -> Mapping[str, LinkCore]:
        """The current session's link cores, by source cluster (read-only use)."""
        return dict(self._cores)

    async def wait_ready(self, timeout_s: float) -> None:
        """Until a session holds the target writer (raises TimeoutError after ``timeout_s``)."""
        async with asyncio.timeout(timeout_s):
            await self._ready.wait()

    async def append_local(self, payload: bytes, headers: Mapping[str, bytes] | None = None) -> Position:
        """Append an application record in the target cluster (active-active) through the one writer."""
        writer = self._writer
        if writer is None:
            raise StreamNotFoundError(f"replicator of {self.stream}: no session holds the writer now; retry")
        return await writer.append(payload, headers)

    # --- running ---------------------------------------------------------------------
    async def run(self) -> None:
        """Run sessions until :meth:`stop`; returns then, or raises a fatal error."""
        self._task = asyncio.current_task()
        delay = self.options.retry_delay_s
        while not self._stopping:
            try:
                await self._session()
                delay = self.options.retry_delay_s
            except FATAL:
                raise
            except ScribaError as exc:
                self._log.warning("geo_session_failed", error=repr(exc), retry_s=delay)
            await asyncio.sleep(delay)  # backoff between sessions, not synchronisation
            delay = min(delay * 2, self.options.retry_delay_max_s)

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _session(self) -> None:
        writer = await self.target.namespace.open_writer(self.stream, create=True, options=self.options.writer)
        self.sessions += 1
        try:
            points = await self._recover()
            self._cores = {s.name: LinkCore(s.name, self.target.name, points.get(s.name),
                                            local_only=self.options.local_only) for s in self.sources}
            self._writer = writer
            self._ready.set()
            self._log.info("geo_session_started", token=writer.token,
                           resume={k: str(v) for k, v in points.items()})
            async with asyncio.TaskGroup() as group:
                watch = group.create_task(self._watch_writer(writer))
                links = [group.create_task(self._link(source, self._cores[source.name], writer))
                         for source in self.sources]
                await asyncio.gather(*links)
                watch.cancel()
        except* ScribaError as group:  # links nest task groups: raise a leaf, a fatal one first
            errors = leaves(group)
            raise next((e for e in errors if isinstance(e, FATAL)), errors[0]) from None
        finally:
            self._writer = None
            self._ready.clear()
            with contextlib.suppress(ScribaError):
                await writer.abort()

    async def _watch_writer(self, writer: StreamWriter) -> None:
        """End the session once its writer failed (lock lost, fenced) even while no record comes:
        an idle link would otherwise hold a dead writer (and ``append_local`` would fail) until
        the next source record. The stream writer offers no failure event, so this polls."""
        while (error := writer.error) is None:
            await asyncio.sleep(self.options.writer_watch_s)
        raise error

    async def _recover(self) -> dict[str, Position]:
        """Each link's resume point, read from the target after the writer fenced it (``scan``)."""
        return await find_resume_points(self.target.namespace, self.stream, [s.name for s in self.sources],
                                        self.options.scan_timeout_s)

    async def _link(self, source: Cluster, core: LinkCore, writer: StreamWriter) -> None:
        reader = await source.namespace.open_reader(self.stream, core.start)
        room = asyncio.Semaphore(self.options.inflight_max)
        pending: asyncio.Queue[tuple[Position, asyncio.Future[Position]] | None] = asyncio.Queue()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._confirm(core, pending, room))
                holding = group.create_task(self._hold(source, core)) if self.options.hold_interval_s else None
                async for record in reader:
                    ship = core.on_source_record(record.position, record.payload, record.headers,
                                                 record.publish_time_ms)
                    if ship is None:
                        continue
                    await room.acquire()
                    pending.put_nowait((ship.source_position, writer.append_async(ship.payload, ship.headers)))
                pending.put_nowait(None)
                if holding is not None:
                    holding.cancel()
        finally:
            while not pending.empty():  # appends never confirmed: their errors ended the session already
                if (item := pending.get_nowait()) is not None:
                    item[1].add_done_callback(_retrieve)
            await reader.close()

    async def _hold(self, source: Cluster, core: LinkCore) -> None:
        """Keep the source cursor at what the target confirmed (see the module docstring)."""
        name = hold_cursor_name(self.target.name)
        held: Position | None = None
        interval = self.options.hold_interval_s or 1.0
        while True:
            confirmed = core.lag(0).confirmed
            if confirmed is not None and confirmed != held:
                try:
                    await source.namespace.commit_cursor(self.stream, name, confirmed)
                    held = confirmed
                except ScribaError as exc:  # the hold lags; nothing of the copy depends on it
                    self._log.info("geo_hold_cursor_failed", error=str(exc))
            await asyncio.sleep(interval)

    @staticmethod
    async def _confirm(core: LinkCore, pending: asyncio.Queue[tuple[Position, asyncio.Future[Position]] | None],
                       room: asyncio.Semaphore) -> None:
        """Confirmations in shipping order (the writer confirms in order)."""
        while (item := await pending.get()) is not None:
            source_position, future = item
            await future
            core.on_confirmed(source_position)
            room.release()


def hold_cursor_name(target: str) -> str:
    """The source cursor a link into ``target`` keeps (a hash when the cluster name is not a
    valid cursor name)."""
    name = f"{HOLD_CURSOR_PREFIX}{target}"
    try:
        return check_name(name, "cursor")
    except ConfigError:
        return f"{HOLD_CURSOR_PREFIX}{hashlib.sha256(target.encode()).hexdigest()[:16]}"


def leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The exceptions in a (nested) exception group, depth first."""
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def _retrieve(future: asyncio.Future[Position]) -> None:
    """Mark an abandoned append's outcome as seen (no "exception was never retrieved")."""
    if not future.cancelled():
        future.exception()
