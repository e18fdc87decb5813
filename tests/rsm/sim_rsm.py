"""One seeded run of the RSM cores (role, batching, sessions, replicated state, snapshot
schedule) against a simulated stream and election; invariants checked after every event.

The world: a stream (a list of records) whose writer is fenced by token — a batch lands
atomically and in send order unless a newer writer opened first (then it is refused,
as a fenced ledger refuses adds); an election whose holder's session expires when it
stops heart-beating (a crash or a pause); replicas that crash (losing memory; restart
from the newest snapshot, then the stream), pause (their events wait), and campaign
all at once; clients with exactly-once sessions that retry the same sequence number
after an unknown outcome or a silence, to any replica.

Invariants (each a sentence naming the seed's facts):
1. every replica's applied records are a prefix of the stream (a hash chain);
2. no replica's state machine runs a (session, seq) twice, and its counter equals the
   number it ran;
3. every replica that ran a command got the same result for it; every acknowledged
   result is that result, and its command is in the stream at the acknowledged position;
4. nothing a replica accepted after its writer was fenced is ever acknowledged (R7);
5. at the end (faults healed) every replica reaches the stream's end with equal state,
   and every acknowledged command is counted once.

Negative controls: ``fencing=False`` (the stream accepts a deposed writer's batches)
and ``dedup=False`` (the session table never reports duplicates) must be caught.
Replay: ``SCRIBA_SIM_SEED=7 .venv/bin/pytest tests/rsm/test_rsm_sim.py -k replay``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from rsm_machines import Counter

from scriba.errors import ScribaError
from scriba.invariant import InvariantViolation
from scriba.rsm.batching import ProposalBatcher
from scriba.rsm.envelope import Envelope, Kind
from scriba.rsm.role import CatchUp, Effect, OpenWriter, Role, RoleCore, Serve, StepDown, Stop
from scriba.rsm.sessions import Fresh
from scriba.rsm.snapshots_core import SnapshotSchedule
from scriba.rsm.state import ReplicatedState
from scriba.stream import Position
from scriba.testing.sim.world import World

SESSION_TTL_MS = 10**9  # sessions outlive a run unless a seed shortens it
HEARTBEAT_S = 0.1
LEASE_S = 1.0
RUN_S = 12.0
SETTLE_S = 30.0
RETRY_S = 10.0  # clients retry what they started for this long after the run


def _pos(index: int) -> Position:
    return Position(0, index, 0)


def _chain(prev: bytes, index: int, data: bytes) -> bytes:
    return hashlib.blake2b(prev + index.to_bytes(8, "big") + data, digest_size=12).digest()


class SimStream:
    def __init__(self, fencing: bool) -> None:
        self.records: list[Envelope] = []
        self.chain: list[bytes] = [b""]  # chain[i]: hash of records[:i]
        self.fence = 0
        self.fencing = fencing
        self.fenced_at: dict[int, float] = {}  # token -> when a newer writer fenced it

    def open(self, token: int, now: float) -> Position | bool | None:
        """Fence older writers; the last position before the new writer's records (False: stale)."""
        if token < self.fence and self.fencing:
            return False
        for t in range(self.fence, token):
            self.fenced_at.setdefault(t, now)
        self.fence = max(self.fence, token)
        return _pos(len(self.records) - 1) if self.records else None

    def land(self, token: int, envelopes: list[Envelope]) -> list[Position] | None:
        if token < self.fence and self.fencing:
            return None
        first = len(self.records)
        for env in envelopes:
            self.chain.append(_chain(self.chain[-1], len(self.records), env.encode()))
            self.records.append(env)
        return [_pos(first + i) for i in range(len(envelopes))]


@dataclass
class Proposal:
    client: int
    session_id: int
    seq: int
    attempt: int
    envelope: Envelope
    accepted_at: float
    fenced_when_accepted: bool


@dataclass
class SimReplica:
    rid: int
    clock_skew_ms: int
    alive: bool = True
    paused: bool = False
    incarnation: int = 0
    inbox: list[tuple[Any, tuple[Any, ...]]] = field(default_factory=list)
    role: RoleCore = field(default_factory=RoleCore)
    state: ReplicatedState | None = None
    batcher: ProposalBatcher[Proposal] | None = None
    next_index: int = 0  # the tail's next record
    chain: bytes = b""
    ran: set[tuple[int, int]] = field(default_factory=set)
    campaigning: bool = False
    last_stamp_ms: int = 0
    land_at: float = 0.0
    flush_due: bool = False


class Sim:
    def __init__(self, seed: int, *, fencing: bool = True, dedup: bool = True) -> None:
        self.world = World(seed)
        rng = self.world.rng
        self.seed = seed
        self.violations: list[str] = []
        self.stream = SimStream(fencing)
        self.dedup = dedup
        self.ttl_ms = SESSION_TTL_MS if rng.random() < 0.8 else rng.choice([2_000, 5_000])
        self.replicas = [SimReplica(i, rng.randint(-300, 300)) for i in range(rng.choice([3, 3, 5]))]
        for r in self.replicas:
            self._fresh_state(r)
        self.holder: tuple[int, int] | None = None  # (replica, token)
        self.holder_incarnation = 0
        self.next_token = 1
        self.heartbeat: dict[int, float] = {}
        self.snapshots: list[tuple[int, list[bytes]]] = []  # (records applied, chunks)
        self.schedule_every = rng.choice([None, 5, 20])
        self.results: dict[tuple[int, int], bytes] = {}  # first result run for (session, seq)
        self.acked: dict[tuple[int, int], bytes] = {}
        self.attempts: dict[int, int] = {}
        self.clients = rng.randint(2, 5)
        self.client_sessions: dict[int, int] = {}
        self.stats = {"crashes": 0, "pauses": 0, "terms": 0, "acks": 0, "unknown": 0, "stepdowns": 0,
                      "rejected": 0}
        self.description = (f"{len(self.replicas)} replicas, {self.clients} clients, ttl {self.ttl_ms} ms, "
                            f"snapshot every {self.schedule_every}")

    # --- plumbing --------------------------------------------------------------------
    def _fresh_state(self, r: SimReplica) -> None:
        r.state = ReplicatedState(Counter(), session_ttl_ms=self.ttl_ms, session_results_max=64)
        if not self.dedup:
            r.state.sessions.check = lambda *_a: Fresh()  # type: ignore[method-assign]
        r.role = RoleCore()
        r.batcher = None
        r.next_index, r.chain, r.ran = 0, b"", set()
        r.campaigning = False

    def deliver(self, rid: int, incarnation: int, fn: Any, *args: Any) -> None:
        """Run ``fn(replica, *args)`` on the replica (queued while paused; lost if it crashed)."""
        r = self.replicas[rid]
        if not r.alive or r.incarnation != incarnation:
            return
        if r.paused:
            r.inbox.append((fn, args))
            return
        fn(r, *args)

    def send(self, r: SimReplica, fn: Any, *args: Any, delay: tuple[float, float] = (0.001, 0.02)) -> None:
        self.world.at(self.world.rng.uniform(*delay), self.deliver, r.rid, r.incarnation, fn, *args)

    def now_ms(self, r: SimReplica) -> int:
        return int(self.world.now * 1000) + 1_000_000 + r.clock_skew_ms

    # --- election ----------------------------------------------------------------------
    def tick(self) -> None:
        now = self.world.now
        for r in self.replicas:
            if r.alive and not r.paused:
                self.heartbeat[r.rid] = now
                if r.role.role is Role.FOLLOWER and not r.campaigning and self.holder is None:
                    r.campaigning = True  # every follower campaigns: concurrent candidates
                    self.world.at(self.world.rng.uniform(0.001, 0.05), self.campaign_arrives, r.rid, r.incarnation)
        holder = self.replicas[self.holder[0]] if self.holder is not None else None
        if holder is not None and (now - self.heartbeat.get(holder.rid, now) > LEASE_S
                                   or holder.incarnation != self.holder_incarnation):
            assert self.holder is not None
            token = self.holder[1]
            self.holder = None
            self.send(holder, self.on_deposed, token, "session lost")
        if now < RUN_S + SETTLE_S:
            self.world.at(HEARTBEAT_S, self.tick)

    def campaign_arrives(self, rid: int, incarnation: int) -> None:
        r = self.replicas[rid]
        if r.incarnation != incarnation or not r.alive:
            return
        if self.holder is None and not r.paused:
            token = self.next_token
            self.next_token += 1
            self.holder = (rid, token)
            self.holder_incarnation = r.incarnation
            self.stats["terms"] += 1
            self.send(r, self.on_elected, token)
        else:
            self.send(r, self.on_campaign_lost)

    def on_campaign_lost(self, r: SimReplica) -> None:
        r.campaigning = False

    def on_elected(self, r: SimReplica, token: int) -> None:
        r.campaigning = False
        self.run_effects(r, r.role.elected(token))

    def on_deposed(self, r: SimReplica, token: int, reason: str) -> None:
        self.run_effects(r, r.role.deposed(token, reason))
        if self.holder is not None and self.holder == (r.rid, token):
            self.holder = None  # it resigned

    # --- effects -----------------------------------------------------------------------
    def run_effects(self, r: SimReplica, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, OpenWriter):
                self.world.at(self.world.rng.uniform(0.005, 0.05), self.open_writer, r.rid, r.incarnation,
                              effect.token)
            elif isinstance(effect, CatchUp):
                self.pump_tail(r)
            elif isinstance(effect, Serve):
                rng = self.world.rng
                r.batcher = ProposalBatcher(records_max=rng.choice([1, 4, 64]), bytes_max=1 << 20,
                                            inflight_max=rng.choice([1, 2, 4]))
                r.land_at = self.world.now
            elif isinstance(effect, StepDown):
                self.stats["stepdowns"] += 1
                if r.batcher is not None:
                    for p in r.batcher.fail_all():
                        self.stats["unknown"] += 1
                        self.client_later(p.client, p.seq, p.attempt)  # "outcome unknown"
                r.batcher = None
                self.pump_tail(r)
            elif isinstance(effect, Stop):
                self.violations.append(f"replica {r.rid} stopped: {effect.reason}")

    def open_writer(self, rid: int, incarnation: int, token: int) -> None:
        r = self.replicas[rid]
        if not r.alive or r.incarnation != incarnation:
            return
        end = self.stream.open(token, self.world.now)  # the stream's recovery runs even if the opener is paused
        if end is False:
            self.send(r, self.on_deposed, token, "fenced at open")
        else:
            self.send(r, lambda rr: self.run_effects(rr, rr.role.writer_opened(token, end)))  # type: ignore[arg-type]

    # --- apply -------------------------------------------------------------------------
    def apply(self, r: SimReplica, position: Position, env: Envelope) -> bytes | None:
        assert r.state is not None
        index = position.entry_id
        try:
            outcome = r.state.apply(position, env)
        except (InvariantViolation, ScribaError) as exc:
            self.violations.append(f"replica {r.rid} apply at {index}: {exc}")
            return None
        r.chain = _chain(r.chain, index, env.encode())
        r.next_index = index + 1
        if self.stream.chain[index + 1] != r.chain:
            self.violations.append(f"replica {r.rid} applied a record at {index} that is not the stream's")
        if outcome.applied:
            key = (env.session_id, env.seq)
            if key in r.ran:
                self.violations.append(f"replica {r.rid} ran session {key[0]} seq {key[1]} twice")
            r.ran.add(key)
            first = self.results.setdefault(key, outcome.result)
            if first != outcome.result:
                self.violations.append(f"replica {r.rid}: {key} gave {outcome.result!r}, another {first!r}")
            counter = r.state.machine
            assert isinstance(counter, Counter)
            if counter.count != r.state.commands_applied:
                self.violations.append(f"replica {r.rid}: count {counter.count} != {r.state.commands_applied}")
        self.run_effects(r, r.role.applied_to(position))
        self.maybe_snapshot(r)
        if env.kind is Kind.SESSION_OPEN:
            return outcome.result
        return outcome.result if outcome.rejected is None else None

    def pump_tail(self, r: SimReplica) -> None:
        if not r.alive or r.paused or r.role.role in (Role.LEADER, Role.STOPPED):
            return
        if r.next_index < len(self.stream.records):
            self.send(r, self.tail_one, r.next_index, delay=(0.0005, 0.005))

    def tail_one(self, r: SimReplica, index: int) -> None:
        if r.next_index != index or r.role.role in (Role.LEADER, Role.STOPPED):
            return
        self.apply(r, _pos(index), self.stream.records[index])
        self.pump_tail(r)

    def maybe_snapshot(self, r: SimReplica) -> None:
        if self.schedule_every is None or r.role.role is not Role.LEADER or r.state is None:
            return
        schedule = getattr(r, "_schedule", None)
        if schedule is None:
            schedule = SnapshotSchedule(self.schedule_every, None)
            r._schedule = schedule  # type: ignore[attr-defined]
        schedule.on_applied(1, 0)
        if schedule.due():
            schedule.started()
            chunks = r.state.snapshot(64)
            self.snapshots.append((r.state.applied.entry_id if r.state.applied else -1, chunks))
            schedule.finished(r.state.applied)

    # --- proposals -----------------------------------------------------------------------
    def propose(self, r: SimReplica, client: int, session: int, seq: int, attempt: int) -> None:
        if r.role.role is not Role.LEADER or r.batcher is None or r.state is None:
            self.client_later(client, seq, attempt)  # "not the leader"
            return
        if seq and session:
            kept = r.state.sessions.peek(session, seq)
            if kept is not None and self.dedup:
                self.ack(r, client, session, seq, kept, None)
                return
        r.last_stamp_ms = max(r.last_stamp_ms, self.now_ms(r))
        kind = Kind.COMMAND if seq else Kind.SESSION_OPEN
        env = Envelope(kind, r.role.token, r.last_stamp_ms, b"incr", session, seq, seq)  # answers below seq taken
        fenced = r.role.token in self.stream.fenced_at
        r.batcher.add(Proposal(client, session, seq, attempt, env, self.world.now, fenced), env.size_bytes)
        self.flush(r)

    def flush(self, r: SimReplica) -> None:
        while r.batcher is not None:
            batch = r.batcher.take()
            if batch is None:
                return
            token = r.role.token
            r.land_at = max(r.land_at, self.world.now) + self.world.rng.uniform(0.001, 0.02)
            self.world.at(r.land_at - self.world.now, self.land, r.rid, r.incarnation, token, batch.batch_id,
                          [p.envelope for p in batch.items])

    def land(self, rid: int, incarnation: int, token: int, batch_id: int, envs: list[Envelope]) -> None:
        positions = self.stream.land(token, envs)  # bookies act on their own, whatever the writer does
        r = self.replicas[rid]
        if positions is None:
            self.send(r, self.on_deposed, token, "fenced")
        else:
            self.send(r, self.on_confirmed, token, batch_id, positions)
            for other in self.replicas:  # the writer too: deposed meanwhile, it tails like the rest
                self.pump_tail(other)

    def on_confirmed(self, r: SimReplica, token: int, batch_id: int, positions: list[Position]) -> None:
        if not r.role.accepts(token) or r.batcher is None:
            return  # deposed: the tail applies whatever reached the stream
        for proposal, position in r.batcher.confirmed(batch_id, positions):
            result = self.apply(r, position, proposal.envelope)
            if result is None:
                if proposal.session_id == self.client_sessions.get(proposal.client):
                    self.rejected(proposal.client, proposal.seq)
            else:
                if proposal.fenced_when_accepted:
                    self.violations.append(f"replica {r.rid} acknowledged {proposal.seq} accepted after its fence")
                self.ack(r, proposal.client, proposal.session_id, proposal.seq, result, position)
        self.flush(r)

    # --- clients -------------------------------------------------------------------------
    def client_send(self, client: int, seq: int) -> None:
        """A new attempt for ``seq`` (the same sequence number every time): the latest one lives."""
        if self._done(client, seq) or self.world.now > RUN_S + RETRY_S:
            return
        attempt = self.attempts.get(client, 0) + 1
        self.attempts[client] = attempt
        holder = self.holder
        if holder is not None and self.world.rng.random() < 0.7:
            target = self.replicas[holder[0]]
        else:
            target = self.world.rng.choice(self.replicas)
        self.send(target, self.propose, client, self.client_sessions.get(client, 0), seq, attempt)
        self.world.at(0.5, self.client_again, client, seq, attempt)

    def client_again(self, client: int, seq: int, attempt: int) -> None:
        if self.attempts.get(client) == attempt:
            self.client_send(client, seq)

    def client_later(self, client: int, seq: int, attempt: int) -> None:
        self.world.at(self.world.rng.uniform(0.01, 0.1), self.client_again, client, seq, attempt)

    def rejected(self, client: int, seq: int) -> None:
        """The session refused ``seq`` (expired): the client opens a new session."""
        if self._done(client, seq):
            return
        self.stats["rejected"] += 1
        self.client_sessions.pop(client, None)
        self.attempts[client] = self.attempts.get(client, 0) + 1  # ends the attempts at ``seq``
        if self.world.now < RUN_S:
            self.world.at(0.01, self.client_send, client, 0)

    def _done(self, client: int, seq: int) -> bool:
        if seq == 0:
            return client in self.client_sessions
        return (self.client_sessions.get(client, 0), seq) in self.acked

    def ack(self, r: SimReplica, client: int, session: int, seq: int, result: bytes,
            position: Position | None) -> None:
        if self._done(client, seq) or (seq and session != self.client_sessions.get(client)):
            return  # answered already, or an answer for a session the client gave up
        self.stats["acks"] += 1
        if seq == 0:
            self.client_sessions[client] = int.from_bytes(result, "big")
            self.world.at(0.001, self.client_send, client, 1)
            return
        key = (session, seq)
        first = self.results.get(key)
        if first != result:
            self.violations.append(f"client {client} seq {seq} acknowledged {result!r}, first run gave {first!r}")
        self.acked[key] = result
        if position is not None:
            env = self.stream.records[position.entry_id]
            if (env.session_id, env.seq) != key:
                self.violations.append(f"client {client} seq {seq} acknowledged at {position}, which holds "
                                       f"{(env.session_id, env.seq)}")
        if self.world.now < RUN_S:
            self.world.at(self.world.rng.uniform(0.0, 0.02), self.client_send, client, seq + 1)

    # --- faults --------------------------------------------------------------------------
    def fault(self) -> None:
        rng = self.world.rng
        if self.world.now > RUN_S:
            return
        r = rng.choice(self.replicas)
        if self.holder is not None and rng.random() < 0.6:
            r = self.replicas[self.holder[0]]
        if rng.random() < 0.5 and r.alive:
            self.stats["crashes"] += 1
            r.alive = False
            r.inbox.clear()
            self.world.at(rng.uniform(0.2, 2.0), self.restart, r.rid)
        elif r.alive and not r.paused:
            self.stats["pauses"] += 1
            r.paused = True
            self.world.at(rng.uniform(0.1, 3.0), self.resume, r.rid)
        self.world.at(rng.uniform(0.3, 1.5), self.fault)

    def restart(self, rid: int) -> None:
        r = self.replicas[rid]
        r.incarnation += 1
        r.alive, r.paused = True, False
        self._fresh_state(r)
        if self.snapshots and self.world.rng.random() < 0.8:
            _, chunks = self.snapshots[-1]
            assert r.state is not None
            r.state.restore(chunks)
            if not self.dedup:
                r.state.sessions.check = lambda *_a: Fresh()  # type: ignore[method-assign]
            assert r.state.applied is not None
            r.role.restored_to(r.state.applied)
            r.next_index = r.state.applied.entry_id + 1
            r.chain = self.stream.chain[r.next_index]
            r.ran = set()  # what ran before the snapshot is in its state, not re-run
        self.pump_tail(r)

    def resume(self, rid: int) -> None:
        r = self.replicas[rid]
        if not r.alive:
            return
        r.paused = False
        inbox, r.inbox = r.inbox, []
        for fn, args in inbox:
            if r.paused or not r.alive:
                break
            fn(r, *args)
        self.pump_tail(r)

    # --- run ---------------------------------------------------------------------------
    def run(self) -> None:
        self.world.at(0.0, self.tick)
        for c in range(self.clients):
            self.world.at(0.01 * c, self.client_send, c, 0)
        self.world.at(self.world.rng.uniform(0.5, 1.5), self.fault)
        self.world.run(RUN_S + SETTLE_S, after_event=self.check_step)
        self.check_end()

    def check_step(self) -> None:
        if len(self.violations) > 20:
            raise _Abort
        leaders = [(r.rid, r.role.token) for r in self.replicas
                   if r.alive and r.role.role is Role.LEADER and r.role.token == self.stream.fence]
        if len(leaders) > 1:
            self.violations.append(f"two serving leaders with the stream's token: {leaders}")

    def check_end(self) -> None:
        end = len(self.stream.records)
        states = []
        for r in self.replicas:
            if not r.alive or r.state is None:
                continue
            if r.next_index != end:
                self.violations.append(f"replica {r.rid} ({r.role.role.value}) at {r.next_index} of {end} after settling")
                continue
            counter = r.state.machine
            assert isinstance(counter, Counter)
            states.append((r.rid, counter.count, r.state.sessions.digest()))
        if len({(c, d) for _, c, d in states}) > 1:
            self.violations.append(f"replicas differ after settling: {states}")
        for rid, count, _ in states:
            if count < len(self.acked):
                self.violations.append(f"replica {rid} counts {count} < {len(self.acked)} acknowledged commands")
        for key, result in self.acked.items():
            if self.results.get(key) != result:
                self.violations.append(f"acknowledged {key} -> {result!r} but the state machine gave "
                                       f"{self.results.get(key)!r}")


class _Abort(Exception):
    pass


@dataclass
class SimResult:
    seed: int
    violations: list[str]
    stats: dict[str, int]
    description: str
    events: int

    def explain(self) -> str:
        lines = [f"seed {self.seed}: {self.description}; {self.stats}"]
        lines += [f"  violation: {v}" for v in self.violations[:10]]
        lines.append(f"  replay: SCRIBA_SIM_SEED={self.seed} .venv/bin/pytest tests/rsm/test_rsm_sim.py -k replay")
        return "\n".join(lines)


def run_seed(seed: int, *, fencing: bool = True, dedup: bool = True) -> SimResult:
    sim = Sim(seed, fencing=fencing, dedup=dedup)
    try:
        sim.run()
    except _Abort:
        pass
    except (InvariantViolation, ScribaError) as exc:
        sim.violations.append(f"{type(exc).__name__}: {exc}")
    return SimResult(seed, sim.violations, sim.stats, sim.description, sim.world.events)
