"""``StreamFollower``: a read-only replica of an RSM group, fed by a stream it never writes.

    follower = StreamFollower(namespace_b, "store", KvMachine(), locate=source_position_of)
    await follower.start()
    follower.query(request)       # a serializable read of a consistent prefix
    follower.status()             # applied position, records applied, how far behind

The group's replicas write and apply their command stream in cluster A; geo-replication
copies that stream, record for record and in order, into a stream of the same name in
cluster B (``scriba.geo``). A follower in B tails that copy and feeds every record to the
same :class:`~scriba.rsm.state.ReplicatedState` the replicas use (envelope decoding,
session table, replicated clock, the user's ``apply``), so after the record copied from
A's position ``P`` its state *is* A's replicas' state after ``P``: a consistent prefix of
A's history, never a mix. ``locate`` names the position each record applies at (for a
geo copy: its source position, from the record's replication mark), so the follower's
``applied`` compares directly with A's replicas' (equal positions, equal state) and its
snapshots would be A's.

It takes part in no election, opens no session and appends nothing: it cannot change
the group's history, and a command for it is the caller's to refuse. With a
``bootstrap`` it starts from the group's newest snapshot (:func:`newest_snapshot`,
read from the group's own cluster) and reads its stream from the position ``bootstrap``
translates the snapshot's to (records at or before the restored position are passed
over), and does the same when its stream is truncated past it; without one the stream
must hold the group's history from its first record (else it stops with
:class:`~scriba.errors.PositionTruncatedError` as its ``error``).

Staleness, exactly: every ``check_s`` the follower asks the *reference* stream (the
source cluster's, whose positions ``locate`` gives; its own copy without one) for its
last confirmed record and notes ``(when asked, that position)``. Once it has applied up
to a noted position, ``caught_up_ms`` becomes that sample's time: its state then holds
everything the reference held at ``caught_up_ms``, so ``now - caught_up_ms`` bounds how
stale its reads are, even while records keep coming (a sample is settled by a later
apply, not only when the tail is idle). A reference it cannot reach settles nothing:
the bound keeps growing, as it should. ``source_ms`` is the origin's publish time of
the newest record applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from scriba.client import Client
from scriba.errors import (
    DeadlineExceededError,
    NamespaceNotFoundError,
    PositionTruncatedError,
    ScribaError,
    StateMachineError,
    StreamNotFoundError,
)
from scriba.invariant import InvariantViolation
from scriba.log import get_logger
from scriba.rsm import membership as mb
from scriba.rsm.config import RsmConfig
from scriba.rsm.envelope import Envelope
from scriba.rsm.machine import StateMachine
from scriba.rsm.snapshot_store import load_newest
from scriba.rsm.state import ReplicatedState
from scriba.stream import Namespace, Position, Record

log = get_logger(__name__)

Locate = Callable[[Record], tuple[Position, int]]
"""``record -> (the position it applies at, its origin's publish time in ms)``; raises
``ScribaError`` for a record that does not belong to the followed group's history."""

Bootstrap = Callable[[Position | None], Awaitable["tuple[list[bytes], Position] | None"]]
"""``applied -> (snapshot chunks, where to read the followed stream from)`` for a snapshot
newer than ``applied`` (None: there is none)."""

READ_POLL_S = 0.5
BOOTSTRAP_TIMEOUT_S = 30.0  # at start: then the copy from its first record (the source may be down)
SAMPLES_MAX = 256  # freshness samples waiting to be settled (a follower far behind skips new ones)
FATAL = (StateMachineError,)


async def newest_snapshot(client: Client, namespace: str, name: str, newer_than: Position | None,
                          password: bytes = b"") -> tuple[Position, list[bytes]] | None:
    """The group's newest snapshot whose digest checks (its position and chunks), if newer
    than ``newer_than``: what a replica restores, read from the group's own cluster."""
    found = await load_newest(client, mb.catalog_key(mb.group_token(namespace, name)), newer_than, password)
    return None if found is None else (found[0].position, found[1])


def own_position(record: Record) -> tuple[Position, int]:
    """A stream read where it was written: its own position and publish time."""
    return record.position, record.publish_time_ms


class StreamFollower:
    def __init__(self, namespace: Namespace, stream: str, state_machine: StateMachine, *,
                 config: RsmConfig | None = None, locate: Locate = own_position, retry_s: float = 0.5,
                 reference: Callable[[], Awaitable[Namespace]] | None = None, check_s: float = 0.5,
                 bootstrap: Bootstrap | None = None) -> None:
        self.config = (config or RsmConfig()).validate()
        self.namespace = namespace
        self.stream = stream
        self.state = ReplicatedState(state_machine, session_ttl_ms=self.config.session_ttl_ms,
                                     session_results_max=self.config.session_results_max)
        self.locate = locate
        self.retry_s = retry_s
        # opens the namespace whose stream ``locate``'s positions are of (None: the followed stream's own)
        self.reference = reference
        self.check_s = check_s
        self.bootstrap = bootstrap
        self.restored: Position | None = None  # the position of the last snapshot restored
        self.resumed_at: Position | None = None  # where the followed stream is read from after a restore
        self.stream_applied: Position | None = None  # the newest record applied, in the followed stream
        self.caught_up_ms = 0  # the state holds everything the reference held then (0: not known yet)
        self.reference_last: Position | None = None  # the reference's last record when last asked
        self._samples: deque[tuple[int, Position | None]] = deque()
        self.source_ms = 0  # the origin's publish time of the newest record applied
        self.error: ScribaError | None = None  # why it stopped for good (None: running or stopped cleanly)
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._checks: asyncio.Task[None] | None = None
        self._log = log.bind(stream=f"{namespace.name}/{stream}")

    @property
    def applied(self) -> Position | None:
        """The position (``locate``'s: the source's for a geo copy) of the newest record applied."""
        return self.state.applied

    async def start(self) -> StreamFollower:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._tail_loop())
        self._checks = loop.create_task(self._freshness_loop())
        return self

    async def stop(self) -> None:
        for task in (self._task, self._checks):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._checks = None

    def query(self, request: bytes) -> bytes:
        """A serializable read: the state machine's answer on the prefix applied now."""
        if self.error is not None:
            raise self.error
        try:
            return bytes(self.state.machine.query(request))
        except Exception as exc:
            raise StateMachineError(f"state machine query raised: {type(exc).__name__}: {exc}") from exc

    async def wait_applied(self, position: Position, timeout_s: float) -> None:
        """Until ``applied >= position`` (``DeadlineExceededError`` after ``timeout_s``)."""
        try:
            async with asyncio.timeout(timeout_s):
                while self.applied is None or self.applied < position:
                    if self.error is not None:
                        raise self.error
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise DeadlineExceededError(f"follower of {self.stream}: not applied up to {position} within "
                                        f"{timeout_s} s (at {self.applied})") from None

    def status(self, now_ms: int | None = None) -> dict[str, Any]:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        caught_up = self.caught_up_ms
        return {
            "role": "follower", "stream": f"{self.namespace.name}/{self.stream}",
            "applied": str(self.applied) if self.applied else None,
            "stream_applied": str(self.stream_applied) if self.stream_applied else None,
            "records_applied": self.state.records_applied, "commands_applied": self.state.commands_applied,
            "token": self.state.token, "clock_ms": self.state.clock_ms,
            "reference_last": str(self.reference_last) if self.reference_last else None,
            "caught_up_ms": caught_up, "stale_s": round(max(0, now - caught_up) / 1000, 3) if caught_up else None,
            "source_ms": self.source_ms,
            "source_age_s": round((now - self.source_ms) / 1000, 3) if self.source_ms else None,
            "error": str(self.error) if self.error else None,
        }

    def metrics_status(self) -> dict[str, Any]:
        """``status()`` in the replica's ``RsmMetrics`` vocabulary: the same gauges
        (``scriba_rsm_*``), ``lag_seconds`` being the staleness bound (NaN: not known yet)."""
        own = self.status()
        return {
            "role": "stopped" if self.error is not None else "follower", "token": own["token"],
            "records_applied": own["records_applied"], "commands_applied": own["commands_applied"],
            "applied": own["applied"], "snapshot_position": str(self.restored) if self.restored else None,
            "snapshot_age_s": None, "lag_records": None, "lag_s": own["stale_s"],
        }

    # --- the tail ---------------------------------------------------------------------
    async def _tail_loop(self) -> None:
        if self.bootstrap is not None:
            await self._try_bootstrap()
        while self.error is None:
            try:
                await self._tail_once()
            except PositionTruncatedError as exc:
                await self._after_truncation(exc)
            except FATAL as exc:
                self._stop_for_good(exc)
            except InvariantViolation as exc:  # positions or tokens out of order: not the group's history
                self._stop_for_good(StateMachineError(str(exc)))
            except (StreamNotFoundError, NamespaceNotFoundError) as exc:
                self._log.info("rsm_follower_waiting", error=str(exc))  # the copy does not exist yet
                await asyncio.sleep(self.retry_s)
            except ScribaError as exc:
                self._log.warning("rsm_follower_tail_failed", error=str(exc))
                await asyncio.sleep(self.retry_s)

    def _stop_for_good(self, error: ScribaError) -> None:
        self.error = error
        self._changed.set()
        self._log.error("rsm_follower_stopped", error=str(error))

    async def _try_bootstrap(self) -> None:
        """At start: the newest snapshot if the group's cluster answers; else the copy from
        its first record (a source that is down must not keep a follower from serving)."""
        try:
            await asyncio.wait_for(self._restore_newer(), BOOTSTRAP_TIMEOUT_S)
        except StateMachineError as exc:
            self._stop_for_good(exc)
        except (ScribaError, OSError, TimeoutError) as exc:
            self._log.warning("rsm_follower_bootstrap_failed", error=repr(exc))

    async def _after_truncation(self, truncated: PositionTruncatedError) -> None:
        """The stream no longer holds the next record: a newer snapshot, or stop for good."""
        try:
            if not await self._restore_newer():  # nothing newer to restore: the history is gone
                self._stop_for_good(truncated)
        except StateMachineError as exc:
            self._stop_for_good(exc)
        except ScribaError as exc:  # the group's cluster did not answer: try again
            self._log.warning("rsm_follower_restore_failed", error=str(exc))
            await asyncio.sleep(self.retry_s)

    async def _restore_newer(self) -> bool:
        """Restore the group's newest snapshot if it is ahead of what is applied."""
        if self.bootstrap is None:
            return False
        found = await self.bootstrap(self.applied)
        if found is None:
            return False
        chunks, start = found
        self.state.restore(chunks)  # StateMachineError: fatal, as on a replica
        self.restored = self.applied
        self.resumed_at, self.stream_applied = start, None
        self._settle()
        self._changed.set()
        self._log.info("rsm_follower_restored", position=str(self.applied), start=str(start))
        return True

    async def _tail_once(self) -> None:
        if self.stream_applied is not None:
            start = self.stream_applied.successor()
        else:
            start = self.resumed_at if self.resumed_at is not None else Position(0, 0, 0)
        reader = await self.namespace.open_reader(self.stream, start)
        try:
            while True:
                record = await reader.read_next(timeout_s=READ_POLL_S)
                if record is not None:
                    self._apply(record)
        finally:
            await reader.close()

    async def _own(self) -> Namespace:
        return self.namespace

    async def _freshness_loop(self) -> None:
        opener = self.reference or self._own
        reference: Namespace | None = None
        while self.error is None:
            asked_ms = int(time.time() * 1000)
            try:
                if reference is None:
                    reference = await opener()
                last = await reference.last_position(self.stream)
            except (ScribaError, OSError) as exc:  # unreachable or not there yet: nothing settles, the bound grows
                self._log.info("rsm_follower_reference_unread", error=str(exc))
            else:
                self.reference_last = last
                if len(self._samples) < SAMPLES_MAX:
                    self._samples.append((asked_ms, last))
                self._settle()
            await asyncio.sleep(self.check_s)

    def _settle(self) -> None:
        """Samples whose position is applied now: the state is at least that fresh."""
        mark = self.applied if self.reference is not None else self.stream_applied
        samples = self._samples
        while samples and (samples[0][1] is None or (mark is not None and mark >= samples[0][1])):
            asked_ms, _ = samples.popleft()
            if asked_ms > self.caught_up_ms:
                self.caught_up_ms = asked_ms
                self._changed.set()

    def _apply(self, record: Record) -> None:
        if self.stream_applied is not None and record.position <= self.stream_applied:
            return
        try:
            position, origin_ms = self.locate(record)
        except ScribaError as exc:  # not the group's history: applying on would diverge from it
            raise StateMachineError(f"follower of {self.stream}: record at {record.position}: {exc}") from exc
        self.stream_applied = record.position
        if self.applied is not None and position <= self.applied:
            return  # in the restored snapshot already
        self.state.apply(position, Envelope.decode(record.payload))
        self.source_ms = max(self.source_ms, origin_ms)
        self._settle()
        self._changed.set()
