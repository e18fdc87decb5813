"""``ReplicatedStateMachine``: one replica (the asyncio shell around the cores).

    rsm = ReplicatedStateMachine(client, namespace="apps", name="counter", state_machine=Counter(),
                                 replica_id="r1", address="127.0.0.1:7001", config=RsmConfig())
    await rsm.start()
    session = await rsm.open_session()
    result = await rsm.propose(b"incr", session=session)
    value = await rsm.read(b"get", consistency="linearizable")   # | "sequential" | "after" (after=position)
    await rsm.transfer_leadership("r2"); await rsm.stop()

Theory of operation. ``start`` registers the replica (an ephemeral member record: a
second live replica with the same id is refused), restores the newest snapshot whose
digest checks, starts the replica service on ``address`` and three tasks:

- the **tail** applies the command stream in order from the applied position (as a
  follower, and while catching up as a new leader); a position before the stream's
  truncation point restores a newer snapshot first;
- the **campaign** takes part in the election (``scriba.meta.election``). Won, the
  role core says ``OpenWriter``: the replica opens the stream's writer (which fences
  the previous leader's segment and recovers it), finds the last record before its
  own segment, lets the tail apply up to it, and only then serves (``Serve``);
- the **leader watch** keeps the current leader's id and address (for forwarding).

A leader is deposed by the first of: its election record or session lost
(SUSPENDED longer than ``suspended_grace_s``), a failed append (fenced: a newer
writer recovered the segment), a transfer, ``stop``. Deposed, it fails everything
in flight as ``CommandOutcomeUnknownError`` and applies nothing more of its own
confirmations (``RoleCore.accepts``); the tail resumes and applies what reached the
stream, like any follower's.

Proposals on a follower are forwarded to the leader over the replica service
(``forward_proposals``; else ``RsmNotLeaderError`` names the leader's address).
Linearizable reads on the leader share a leadership check (a fence probe of its ledger's
bookies, no fsync; or a barrier append: ``term``); on a follower they share a round trip
asking the leader for a read index, and wait to apply up to it (``reading``, ``read_index``).

The class is assembled from mixins named for what they hold: ``leading`` (campaign,
term start, leader watch, transfer), ``reading`` (the three read levels, read index),
``snapshotting`` (take, store, restore) and
``service`` (the replica service's request handler). With ``metrics_listen`` it serves
Prometheus ``/metrics`` (``metrics``: role, token, positions, lag, snapshot, proposals,
batch sizes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from scriba.client import Client
from scriba.eager import wait_until, within
from scriba.errors import (
    ClientSessionError,
    CommandOutcomeUnknownError,
    CommandTooLargeError,
    ConfigError,
    DeadlineExceededError,
    PositionTruncatedError,
    ReplicaStoppedError,
    RsmNotLeaderError,
    ScribaError,
    SnapshotCorruptError,
    StateMachineError,
    StreamExistsError,
    UnavailableError,
)
from scriba.invariant import InvariantViolation
from scriba.log import get_logger
from scriba.meta.election import Election, Leadership
from scriba.meta.startup import retry_start_step
from scriba.meta.store import SessionState
from scriba.rsm import membership as mb
from scriba.rsm import wire
from scriba.rsm.client_session import ClientSession, Committed
from scriba.rsm.config import RsmConfig
from scriba.rsm.envelope import HEADER_BYTES, NO_SESSION, Envelope, Kind
from scriba.rsm.leading import Leading
from scriba.rsm.machine import StateMachine
from scriba.rsm.metrics import MetricsEndpoint, RsmMetrics, check_listen, lag
from scriba.rsm.peer import PeerPool, ReplicaServer
from scriba.rsm.read_index import ReadIndexRounds
from scriba.rsm.reading import Reading
from scriba.rsm.role import CatchUp, Effect, OpenWriter, Role, RoleCore, Serve, StepDown, Stop
from scriba.rsm.service import ReplicaService
from scriba.rsm.snapshots_core import SnapshotSchedule
from scriba.rsm.snapshotting import Snapshotting
from scriba.rsm.state import Outcome, ReplicatedState
from scriba.rsm.term import LeaderTerm
from scriba.stream import Namespace, Position, ReaderOptions, StreamReader, open_namespace

log = get_logger(__name__)
T = TypeVar("T")

RETRY_PAUSE_S = 0.05
MEMBER_CHECK_S = 0.2  # how often a replica checks that its session (and so its member record) is the same
LAG_QUERY_TIMEOUT_S = 2.0


class ReplicatedStateMachine(Leading, Reading, Snapshotting, ReplicaService):
    def __init__(
        self,
        client: Client,
        *,
        namespace: str,
        name: str,
        state_machine: StateMachine,
        replica_id: str,
        address: str | None = None,
        config: RsmConfig | None = None,
        password: bytes = b"",
        metrics_listen: str | None = None,
    ) -> None:
        self.config = (config or RsmConfig()).validate()
        self.client = client
        self.namespace = namespace
        self.name = name
        self.group = mb.group_token(namespace, name)
        self.replica_id = mb.check_replica_id(replica_id)
        self.address = address or ""
        self._password = password
        self.state = ReplicatedState(state_machine, session_ttl_ms=self.config.session_ttl_ms,
                                     session_results_max=self.config.session_results_max)
        self.role = RoleCore()
        self.schedule = SnapshotSchedule(self.config.snapshot_every_commands, self.config.snapshot_every_bytes)
        self._ns: Namespace | None = None
        self._election = Election(client.store, mb.election_name(self.group),
                                  suspended_grace_s=self.config.suspended_grace_s)
        self._term: LeaderTerm | None = None
        self._leadership: Leadership | None = None
        self._server: ReplicaServer | None = None
        self._tls = self.config.tls.load() if self.config.tls is not None else None  # bad files: ConfigError
        self._peers = PeerPool(self._tls)
        self._follower_rounds = ReadIndexRounds(self._leader_read_index)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()  # applied position or role moved
        self._tail_reader: StreamReader | None = None  # the follower's tail, while it runs
        self._apply_waiters = 0  # reads waiting for a position to be applied: the tail does not pause
        # role moved (or stopping) only: what the leader's own loops wait on, so that an
        # apply wakes nothing but the readers waiting for it (one wake-up less per commit)
        self._role_moved = asyncio.Event()
        self._leader: tuple[str, str] | None = None  # (replica id, address)
        self._started = False
        self._member_session = ""  # the metadata session holding this replica's member record
        self._stopped: ScribaError | None = None
        self._snapshot_task: asyncio.Task[None] | None = None
        self._tail_task: asyncio.Task[None] | None = None
        self.proposals_total = 0
        self.snapshot_info: Any = None  # the newest snapshot this replica stored or restored
        self.restored_from: Any = None  # the last snapshot restored
        self._log = log.bind(rsm=f"{namespace}/{name}", replica=self.replica_id)
        self.metrics = RsmMetrics()
        self._metrics_endpoint = (MetricsEndpoint(check_listen(metrics_listen), self.metrics, self.refresh_metrics,
                                                  self._tls)
                                  if metrics_listen is not None else None)

    # --- lifecycle ---------------------------------------------------------------------
    async def start(self) -> ReplicatedStateMachine:
        if self._started:
            raise ConfigError(f"replica {self.replica_id} already started")
        self._started = True
        ns = self._ns = await self._start_step(
            "open namespace", lambda: open_namespace(self.client, self.namespace, create=True, password=self._password))
        await self._start_step("create stream", lambda: self._create_stream(ns))
        settings = await self._start_step("stream settings", lambda: ns.stream_settings(self.name))
        if self.config.command_bytes_max > settings.record_bytes_max:
            raise ConfigError(f"command_bytes_max {self.config.command_bytes_max} exceeds the stream's "
                              f"record_bytes_max {settings.record_bytes_max}")
        await self._start_step("register", self._register)
        try:
            await self._restore_newer()
            if self.address:
                self._server = ReplicaServer(self.address, self._handle, self.config.connections_max, self._tls)
                await self._server.start()
            if self._metrics_endpoint is not None:
                await self._metrics_endpoint.start()
        except BaseException:
            await mb.deregister(self.client.store, self.group, self.replica_id)
            raise
        self._tail_task = self._spawn(self._tail_loop())
        for coro in (self._campaign_loop(), self._watch_leader(), self._keep_member()):
            self._spawn(coro)
        self._log.info("rsm_replica_started", applied=str(self.state.applied), address=self.address)
        return self

    def _start_step(self, step: str, call: Callable[[], Awaitable[T]]) -> Awaitable[T]:
        """A metadata step of start(), retried within ``start_timeout_s`` (``meta/startup.py``)."""
        return retry_start_step(step, call, owner=f"replica {self.replica_id} of {self.group}",
                                timeout_s=self.config.start_timeout_s, session=lambda: self.client.store.session,
                                log_event="rsm_start_retry", log_fields={"rsm": self.group, "replica": self.replica_id})

    async def _create_stream(self, ns: Namespace) -> None:
        with contextlib.suppress(StreamExistsError):  # made by another replica, or by an earlier attempt
            await ns.create_stream(self.name)

    async def _register(self) -> None:
        session_id = self.client.store.session.session_id
        await mb.register(self.client.store, self.group, self._member())
        self._member_session = session_id  # the session the record lives in

    async def stop(self) -> None:
        """Step down (closing the writer cleanly), stop serving, deregister."""
        if self._stopped is None:
            self._stopped = ReplicaStoppedError(f"replica {self.replica_id} was stopped")
        await self._shutdown("stopped")

    async def _keep_member(self) -> None:
        """A new metadata session replaced a LOST one: the member record went with the old
        one, so publish it again (else ``members()`` and transfers miss this replica until
        its role changes). Polls the session id: no listener outlives the replica."""
        session = self.client.store.session
        published = self._member_session
        while self._stopped is None:
            await asyncio.sleep(MEMBER_CHECK_S)
            current = session.session_id
            if current != published and session.state is SessionState.CONNECTED:
                with contextlib.suppress(ScribaError):
                    await mb.update_member(self.client.store, self.group, self._member())
                    published = current

    async def _shutdown(self, reason: str) -> None:
        term = self._term
        if term is not None:
            self.role.deposed(term.token, reason)
            self._term = None
            await term.end(reason, close_writer=True)
        with contextlib.suppress(ScribaError):
            await self._election.resign()
        current = asyncio.current_task()
        self._moved()
        if self._tail_task is not None and self._tail_task is not current:
            # let the tail close its reader itself (it polls; cancelling a reader mid-close can leave its
            # producer running: see the report)
            await asyncio.wait({self._tail_task}, timeout=5.0)
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        for task in list(self._tasks):
            if task is not current:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._server is not None:
            await self._server.close()
        if self._metrics_endpoint is not None:
            await self._metrics_endpoint.close()
        await self._follower_rounds.close()
        await self._peers.close()
        with contextlib.suppress(ScribaError):
            await mb.deregister(self.client.store, self.group, self.replica_id)
        self._moved()

    async def __aenter__(self) -> ReplicatedStateMachine:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # --- views -------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return self.role.role is Role.LEADER and self._term is not None

    @property
    def leader(self) -> tuple[str, str] | None:
        """The leader's (replica id, address) as last seen, or None."""
        return self._leader

    @property
    def applied(self) -> Position | None:
        return self.state.applied

    @property
    def error(self) -> ScribaError | None:
        return self._stopped

    async def members(self) -> list[mb.Member]:
        return await mb.list_members(self.client.store, self.group)

    def status(self) -> dict[str, Any]:
        snap = self.snapshot_info
        return {
            "replica_id": self.replica_id, "address": self.address, "role": self.role.role.value,
            "token": self.role.token, "writer_token": self._term.writer_token if self._term else None,
            "applied": str(self.state.applied) if self.state.applied else None,
            "records_applied": self.state.records_applied, "commands_applied": self.state.commands_applied,
            "sessions": len(self.state.sessions), "clock_ms": self.state.clock_ms,
            "leader": self._leader[0] if self._leader else None, "proposals_total": self.proposals_total,
            "batches_sent": self._term.batches_sent if self._term else 0,
            "records_sent": self._term.records_sent if self._term else 0,
            # this term's linearizable-read rounds: proven by the fence probe / fell back to a barrier
            "read_probes_proven": self._term.probes_proven if self._term else 0,
            "read_probes_unproven": self._term.probes_unproven if self._term else 0,
            "snapshot_position": str(snap.position) if snap else None,
            "snapshot_age_s": round(time.time() - snap.created_ms / 1000, 3) if snap else None,
            "stopped": str(self._stopped) if self._stopped else None,
        }

    @property
    def metrics_address(self) -> str:
        """Where ``/metrics`` is served (``host:port``; "" without ``metrics_listen``)."""
        return self._metrics_endpoint.address if self._metrics_endpoint is not None else ""

    async def lag(self) -> tuple[int | None, float | None]:
        """(records, seconds) behind the stream's end: 0 on the leader; a follower asks the leader."""
        leader = None
        if not self.is_leader and self._leader is not None and self._leader[1] and self._leader[0] != self.replica_id:
            with contextlib.suppress(ScribaError, OSError, ValueError):
                leader = json.loads(await self._peers.get(self._leader[1]).call(wire.Op.STATUS, b"",
                                                                                 LAG_QUERY_TIMEOUT_S))
        return lag(self.status(), leader)

    async def refresh_metrics(self) -> None:
        status = self.status()
        status["lag_records"], status["lag_s"] = await self.lag()
        self.metrics.update(status)

    # --- apply -------------------------------------------------------------------------
    def _apply(self, position: Position, envelope: Envelope) -> Outcome:
        try:
            outcome = self.state.apply(position, envelope)
        except (StateMachineError, InvariantViolation) as exc:
            self._fatal(exc if isinstance(exc, StateMachineError) else StateMachineError(str(exc)))
            raise self._stopped from exc  # type: ignore[misc]
        self._run(self.role.applied_to(position))
        self.schedule.on_applied(1, envelope.size_bytes)
        if self.schedule.due() and self.role.role is Role.LEADER:
            self.take_snapshot()
        self._changed.set()
        return outcome

    def _fatal(self, error: ScribaError) -> None:
        if self._stopped is None:
            self._stopped = error
        self._log.error("rsm_replica_stopped", error=str(error))
        self._run(self.role.fatal(str(error)))

    async def _wait_applied(self, position: Position, timeout_s: float) -> None:
        """Until applied up to ``position``. A timer, not ``asyncio.timeout``: a read starts
        eagerly, outside a task (``peer``, ``scriba.eager``)."""
        def applied() -> bool:
            if self.state.applied is not None and self.state.applied >= position:
                return True
            self._check_running()
            return False

        if applied():
            return
        self._apply_waiters += 1
        if self._tail_reader is not None:
            self._tail_reader.hurry.set()  # a read waits: the tail's pause (tail_poll_pause_s) ends now
        try:
            await wait_until(self._changed, applied, timeout_s)
        except TimeoutError:
            raise DeadlineExceededError(
                f"replica {self.replica_id}: not applied up to {position} within {timeout_s} s "
                f"(at {self.state.applied})"
            ) from None
        finally:
            self._apply_waiters -= 1
            if not self._apply_waiters and self._tail_reader is not None:
                self._tail_reader.hurry.clear()

    def _check_running(self) -> None:
        if self._stopped is not None:
            raise self._stopped
        if not self._started:
            raise ReplicaStoppedError(f"replica {self.replica_id}: call start() first")

    # --- role effects ------------------------------------------------------------------
    def _run(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Stop):
                self._spawn(self._shutdown(effect.reason))
            elif isinstance(effect, StepDown):
                term = self._term
                self._term = None
                if term is not None:
                    self._spawn(term.end(effect.reason, close_writer=False))
                self._spawn(self._resign(effect.token, effect.reason))
            elif isinstance(effect, Serve | CatchUp | OpenWriter):
                pass  # carried out by _lead, which waits for them
            self._moved()

    def _moved(self) -> None:
        """The role moved (every role change is an effect) or the replica is stopping."""
        self._changed.set()
        self._role_moved.set()

    async def _resign(self, token: int, reason: str) -> None:
        """Give up the election of the term ``token`` (not a later one won meanwhile)."""
        self._log.info("rsm_stepped_down", reason=reason, token=token)
        held = self._election.leadership
        if held is not None and held.token == token:
            with contextlib.suppress(ScribaError):
                await self._election.resign()
        with contextlib.suppress(ScribaError):
            await mb.update_member(self.client.store, self.group, self._member())

    def _depose(self, term: LeaderTerm, reason: str) -> None:
        token = term.token
        if self._term is term:
            self._run(self.role.deposed(token, reason))

    def _member(self) -> mb.Member:
        return mb.Member(self.replica_id, self.address, self.config.zone, self.role.role.value, self.role.token,
                         str(self.state.applied) if self.state.applied else "")

    # --- the tail ----------------------------------------------------------------------
    async def _tail_loop(self) -> None:
        while self._stopped is None:
            if self.role.role is Role.LEADER:
                self._role_moved.clear()
                await self._role_moved.wait()
                continue
            try:
                await self._tail_once()
            except PositionTruncatedError as exc:
                if not await self._restore_newer():
                    self._fatal(SnapshotCorruptError(
                        f"the stream is truncated past {self.state.applied} and no usable snapshot is newer: {exc}"))
            except (StateMachineError, ReplicaStoppedError):
                return
            except ScribaError as exc:
                self._log.warning("rsm_tail_failed", error=str(exc))
                await asyncio.sleep(self.config.campaign_backoff_s)

    async def _tail_once(self) -> None:
        assert self._ns is not None
        applied = self.state.applied
        start = applied.successor() if applied is not None else Position(0, 0, 0)
        reader: StreamReader = await self._ns.open_reader(
            self.name, start, options=ReaderOptions(tail_poll_replicas=self.config.tail_poll_replicas,
                                                    tail_poll_pause_s=self.config.tail_poll_pause_s))
        self._tail_reader = reader
        if self._apply_waiters:
            reader.hurry.set()
        try:
            while self._stopped is None and self.role.role is not Role.LEADER:
                record = await reader.read_next(timeout_s=0.2)
                if record is None:
                    continue
                if self.role.role is Role.LEADER:
                    return  # our own records: the leader applies them
                if self.state.applied is not None and record.position <= self.state.applied:
                    continue
                self._apply(record.position, Envelope.decode(record.payload))
        finally:
            self._tail_reader = None
            await reader.close()

    # --- proposals ---------------------------------------------------------------------
    async def open_session(self) -> ClientSession:
        """Open an exactly-once client session (a replicated record; any replica)."""
        committed = await self._submit(Kind.SESSION_OPEN, b"", NO_SESSION, 0, 0, forwarded=False)
        return ClientSession(int.from_bytes(committed.result, "big"), last_position=committed.position)

    async def propose(self, command: bytes, *, session: ClientSession | None = None, seq: int | None = None) -> bytes:
        """Apply ``command`` on every replica; its result from the state machine.

        With a session, a retry (after ``CommandOutcomeUnknownError``, a timeout or a
        fail-over) reuses the sequence number and is applied at most once; this call
        retries so itself until ``propose_timeout_s``.
        """
        return (await self.submit(command, session=session, seq=seq)).result

    async def submit(self, command: bytes, *, session: ClientSession | None = None,
                     seq: int | None = None) -> Committed:
        """Like :meth:`propose`, also returning the position (for ``read(..., after=...)``)."""
        self._check_command(command)
        if session is None:
            return await self._submit(Kind.COMMAND, command, NO_SESSION, 0, 0, forwarded=False)
        seq = session.allocate() if seq is None else seq
        deadline = time.monotonic() + self.config.propose_timeout_s
        while True:
            try:
                committed = await self._submit(Kind.COMMAND, command, session.session_id, seq, session.acked_below,
                                               forwarded=False)
                session.answered(seq, committed.position)
                return committed
            except (CommandOutcomeUnknownError, RsmNotLeaderError, UnavailableError, DeadlineExceededError):
                if time.monotonic() > deadline:
                    raise
                self._check_running()
                await asyncio.sleep(RETRY_PAUSE_S)

    def _check_command(self, command: bytes) -> None:
        if not isinstance(command, bytes | bytearray | memoryview):
            raise CommandTooLargeError(f"a command must be bytes, got {type(command).__name__}")
        if len(command) + HEADER_BYTES > self.config.command_bytes_max:
            raise CommandTooLargeError(
                f"command of {len(command)} bytes (+{HEADER_BYTES} envelope) exceeds command_bytes_max "
                f"{self.config.command_bytes_max}"
            )

    async def _submit(self, kind: Kind, payload: bytes, session_id: int, seq: int, acked_below: int, *,
                      forwarded: bool) -> Committed:
        self._check_running()
        self.proposals_total += 1
        self.metrics.proposals.inc()
        term = self._term
        if term is not None and self.role.accepts(term.token):
            if session_id != NO_SESSION:
                kept = self.state.sessions.peek(session_id, seq)
                if kept is not None:  # answered before: the first result, nothing appended
                    assert self.state.applied is not None
                    return Committed(kept, self.state.applied)
            future = term.propose(kind, bytes(payload), int(time.time() * 1000), session_id, seq, acked_below)
            # A session's proposal is shared with its retries (``LeaderTerm.propose``): a caller
            # giving up must not cancel it for them. One without a session is this caller's
            # alone, awaited directly: two loop turns fewer between the apply and the answer.
            # The deadline is a timer (``within``), not ``asyncio.timeout``: a request starts
            # eagerly, outside a task (``peer``, ``scriba.eager``).
            waited = future if session_id == NO_SESSION else asyncio.shield(future)
            try:
                outcome, position = await within(waited, self.config.propose_timeout_s)
            except TimeoutError:
                raise CommandOutcomeUnknownError(
                    f"no confirmation within {self.config.propose_timeout_s} s; retry with the same session/seq"
                ) from None
            if outcome.rejected is not None:
                raise ClientSessionError(outcome.rejected)
            return Committed(outcome.result, position)
        leader = self._leader
        if forwarded or not self.config.forward_proposals or leader is None or not leader[1] \
                or leader[0] == self.replica_id:
            raise self._not_leader()
        body = wire.propose_body(session_id, seq, acked_below, bytes(payload))
        op = wire.Op.OPEN_SESSION if kind is Kind.SESSION_OPEN else wire.Op.PROPOSE
        answer = await self._peers.get(leader[1]).call(op, body, self.config.propose_timeout_s, wire.FORWARDED)
        position, result = wire.parse_committed(answer)
        return Committed(result, position)

    def _not_leader(self) -> RsmNotLeaderError:
        leader = self._leader
        where = f"the leader is {leader[0]} at {leader[1]}" if leader else "no leader is known yet"
        return RsmNotLeaderError(f"replica {self.replica_id} is not the leader; {where}",
                                 leader_id=leader[0] if leader else None, leader_address=leader[1] if leader else None)

    # --- internals ---------------------------------------------------------------------
    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            if isinstance(exc, ScribaError) and self._stopped is None:
                self._log.warning("rsm_task_ended", task=task.get_name(), error=str(exc))
            if not isinstance(exc, ScribaError):
                self._log.error("rsm_task_failed", error=repr(exc))
                self._fatal(StateMachineError(f"internal task failed: {exc!r}"))
