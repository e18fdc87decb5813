"""A seeded simulation of one geo link: the real ``LinkCore`` and ``resume_point`` under crashes.

The world (``scriba.testing.sim.World``) holds a source stream that a writer appends to,
a target stream, and one or two replicators that ship from the first to the second with
the real :class:`scriba.geo.LinkCore` and :func:`scriba.geo.resume_point`. Everything
else is modelled as the stream layer promises it:

- The target stream has one writer at a time: opening a writer fences the previous one
  (a token); an append of a fenced writer never lands. One writer's appends land in the
  order sent (a stream's confirmed records are a prefix of what its writer sent).
- A writer can break (an append that never lands, or lands with its confirmation lost:
  the indeterminate case); the session then ends, as ``Replicator._session`` does.
- A replicator can crash at any event: its memory goes, its in-flight appends may still
  land (until the next writer fences them). Two replicators may race for one target,
  each opening a writer fences the other (worse than the real writer lock, which makes
  the second wait).

Modes: ``target`` (the product's rule: resume from the target's own records, read after
fencing) and two negative controls that the checker must catch duplicating —
``checkpoint`` (resume from a checkpoint committed after the confirmation, lost when the
replicator crashes between the two) and ``scan_before_fence`` (read the resume point
before opening the writer, so an old writer's in-flight appends land after the scan).

The checker: after every event, the target must be a prefix of the expected records (the
source's shippable records in source order): nothing skipped, reordered or duplicated;
at the end, after faults stop, it must equal them (acked-set and log checkers).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field

from geo_env import check_replica

from scriba.geo import LinkCore, Mark, resume_point
from scriba.geo.marks import shippable
from scriba.invariant import InvariantViolation
from scriba.stream import Position
from scriba.testing.sim import SeedReport, World

SOURCE, TARGET, OTHER = "us", "eu", "ap"
MODES = ("target", "checkpoint", "scan_before_fence")
REPLAY_TARGET = "tests/geo/test_geo_sim.py -k replay"


@dataclass(frozen=True, slots=True)
class SourceRecord:
    position: Position
    payload: bytes
    headers: Mapping[str, bytes]
    publish_ms: int


class Source:
    """The source stream: records appended over time; readers are poked on each append."""

    def __init__(self) -> None:
        self.records: list[SourceRecord] = []
        self.positions: list[Position] = []
        self.readers: list[SimReplicator] = []

    def append(self, world: World, origin: str) -> None:
        i = len(self.records)
        position = Position(i // 10, i % 10)  # a segment every 10 records
        headers = {} if origin == SOURCE else Mark(origin, origin, Position(0, i), 0).to_headers()
        self.records.append(SourceRecord(position, f"r{i}".encode(), headers, int(world.now * 1000)))
        self.positions.append(position)
        for r in self.readers:
            r.poke()

    def expected(self) -> list[bytes]:
        return [r.payload for r in self.records if shippable(r.headers, SOURCE, TARGET)]


class Target:
    """The target stream: a single writer by token; appends of a fenced writer never land."""

    def __init__(self, report: SeedReport, source: Source) -> None:
        self.report = report
        self.source = source
        self.token = 0
        self.records: list[tuple[bytes, Mapping[str, bytes]]] = []
        self.checkpoint: Position | None = None  # the negative control's separately committed progress

    def fence(self) -> int:
        self.token += 1
        return self.token

    def append(self, world: World, token: int, payload: bytes, headers: Mapping[str, bytes]) -> bool:
        if token != self.token:
            return False
        self.records.append((payload, headers))
        expected = self.source.expected()
        n = len(self.records)
        if n > len(expected) or expected[n - 1] != payload:  # the prefix check, after every landing
            self.report.violations.append(
                f"t={world.now:.4f}: target record {n - 1} is {payload!r}, expected "
                f"{expected[n - 1] if n <= len(expected) else 'nothing'!r} "
                f"({'duplicated' if payload in [p for p, _ in self.records[:-1]] else 'skipped or reordered'})")
        return True


@dataclass
class Session:
    """One writer session of a replicator: its token, its FIFO pipe, whether it broke."""

    number: int
    token: int = 0
    pipe_t: float = 0.0
    confirm_t: float = 0.0
    broken: bool = False


@dataclass
class Faults:
    append_fail_p: float  # the writer breaks: this append and the session's later ones never land
    confirm_lost_p: float  # the append lands, its confirmation is lost (indeterminate)
    crash_every_s: float  # mean time between replicator crashes (until the faults stop)
    stop_s: float  # faults (and the second replicator) stop here; the end state is checked later


@dataclass
class SimReplicator:
    world: World
    name: str
    source: Source
    target: Target
    mode: str
    faults: Faults
    inflight_max: int = 8
    session: Session | None = None
    sessions: int = 0
    stopped: bool = False
    core: LinkCore | None = None
    next_index: int = 0
    inflight: int = 0
    _pump_scheduled: bool = False
    crashes: list[float] = field(default_factory=list)

    def _delay(self) -> float:
        return self.world.rng.uniform(0.0001, 0.002)

    def _current(self, session: Session) -> bool:
        return self.session is session and not self.stopped

    # --- sessions --------------------------------------------------------------------
    def start_session(self) -> None:
        if self.stopped:
            return
        self.sessions += 1
        session = Session(self.sessions)
        self.session, self.core, self.inflight, self._pump_scheduled = session, None, 0, False
        if self.mode == "scan_before_fence":
            point = self._resume_point()
            self.world.at(self._delay(), self._open, session, point)
        else:
            self.world.at(self._delay(), self._open, session, None)

    def _open(self, session: Session, point: Position | None) -> None:
        if not self._current(session):
            return
        session.token = self.target.fence()  # opening the writer fences every earlier one
        self.world.at(self._delay(), self._scanned, session, point)

    def _resume_point(self) -> Position | None:
        if self.mode == "checkpoint":
            return self.target.checkpoint
        return resume_point(reversed([h for _, h in self.target.records]), SOURCE)

    def _scanned(self, session: Session, point: Position | None) -> None:
        if not self._current(session):
            return
        if self.mode == "target":
            point = self._resume_point()  # read after the fence: the target's end is final
        elif self.mode == "checkpoint":
            point = self.target.checkpoint
        self.core = LinkCore(SOURCE, TARGET, point)
        start = self.core.start  # where the real replicator opens its source reader
        self.next_index = 0 if start == "earliest" else bisect.bisect_left(self.source.positions, start)
        self._pump(session)

    def _end(self, session: Session) -> None:
        if not self._current(session):
            return
        self.session = None
        self.world.at(self.world.rng.uniform(0.001, 0.005), self.start_session)

    def crash(self) -> None:
        self.crashes.append(self.world.now)
        self.session = None  # memory gone; in-flight appends may still land
        self.world.at(self.world.rng.uniform(0.001, 0.01), self.start_session)

    def schedule_crashes(self) -> None:
        t = self.world.rng.expovariate(1 / self.faults.crash_every_s)
        if t < self.faults.stop_s:
            self.world.at(t, self._crash_and_next)

    def _crash_and_next(self) -> None:
        if not self.stopped:
            self.crash()
            t = self.world.rng.expovariate(1 / self.faults.crash_every_s)
            if self.world.now + t < self.faults.stop_s:
                self.world.at(t, self._crash_and_next)

    def stop(self) -> None:
        self.stopped = True
        self.session = None

    # --- shipping --------------------------------------------------------------------
    def poke(self) -> None:
        session = self.session
        if session is not None and self.core is not None and not self._pump_scheduled:
            self._pump_scheduled = True
            self.world.at(self._delay(), self._pump, session)

    def _pump(self, session: Session) -> None:
        if not self._current(session) or self.core is None:
            return
        self._pump_scheduled = False
        records = self.source.records
        while self.inflight < self.inflight_max and self.next_index < len(records):
            r = records[self.next_index]
            self.next_index += 1
            ship = self.core.on_source_record(r.position, r.payload, r.headers, r.publish_ms)
            if ship is None:
                continue
            self.inflight += 1
            session.pipe_t = max(session.pipe_t, self.world.now) + self._delay()
            self.world.at(session.pipe_t - self.world.now, self._land, session, ship.source_position,
                          ship.payload, ship.headers)

    def _land(self, session: Session, position: Position, payload: bytes, headers: Mapping[str, bytes]) -> None:
        """At the target (whether or not the replicator still lives)."""
        rng, live = self.world.rng, self.world.now < self.faults.stop_s
        if session.broken:
            return
        if live and rng.random() < self.faults.append_fail_p:
            session.broken = True
        elif not self.target.append(self.world, session.token, payload, headers):
            session.broken = True  # fenced
        elif live and rng.random() < self.faults.confirm_lost_p:
            session.broken = True  # landed, the confirmation is lost
        else:
            session.confirm_t = max(session.confirm_t, self.world.now) + self._delay()
            self.world.at(session.confirm_t - self.world.now, self._confirmed, session, position)
            return
        self.world.at(self._delay(), self._end, session)

    def _confirmed(self, session: Session, position: Position) -> None:
        if not self._current(session) or self.core is None:
            return
        self.core.on_confirmed(position)
        self.inflight -= 1
        if self.mode == "checkpoint":  # committed after the append: a crash in between loses it
            self.world.at(self._delay(), self._commit, session, position)
        self._pump(session)

    def _commit(self, session: Session, position: Position) -> None:
        if self._current(session) and (self.target.checkpoint is None or position > self.target.checkpoint):
            self.target.checkpoint = position


def run_link(seed: int, mode: str = "target", *, records: int = 80, duration_s: float = 2.0) -> SeedReport:
    """One seeded run; violations listed in the report (empty: exactly once held)."""
    world = World(seed)
    rng = world.rng
    racing = rng.random() < 0.5
    faults = Faults(append_fail_p=rng.choice([0.0, 0.01, 0.05]), confirm_lost_p=rng.choice([0.0, 0.01, 0.05]),
                    crash_every_s=rng.choice([0.005, 0.02, 0.05]), stop_s=0.2)
    report = SeedReport(seed, description=f"mode={mode} racing={racing} {faults}", replay_target=REPLAY_TARGET,
                        replay_env={"SCRIBA_GEO_SIM_MODE": mode} if mode != "target" else {})
    source = Source()
    target = Target(report, source)
    replicators = [SimReplicator(world, n, source, target, mode, faults) for n in (["a", "b"] if racing else ["a"])]
    source.readers.extend(replicators)
    for r in replicators:
        world.at(rng.uniform(0.0, 0.01), r.start_session)
        r.schedule_crashes()
    if racing:
        world.at(faults.stop_s, replicators[1].stop)
    origins = rng.choices([SOURCE, TARGET, OTHER], weights=[8, 1, 1], k=records)
    for i, origin in enumerate(origins):  # the source writer: ~1 record per ms
        world.at(i * 0.001 + rng.uniform(0, 0.0005), source.append, world, origin)
    try:
        world.run(duration_s)
    except InvariantViolation as exc:  # the core refused an input: a violation of this seed, not a crash
        report.violations.append(f"t={world.now:.4f}: invariant: {exc}")
        return report
    got = [p for p, _ in target.records]
    if report.ok:  # the end state: everything, exactly once, in order (the prefix check saw the rest)
        report.violations += check_replica(source.expected(), got)
    marks = [Mark.from_headers(h) for _, h in target.records]
    positions = [m.source_position for m in marks if m is not None]
    if positions != sorted(set(positions)):
        report.violations.append("target marks: source positions not strictly increasing")
    return report
