"""One seeded run of the stream writer's rules: crashes, pauses, racing openers and rolls.

The stream writer's core (``scriba.stream.writer_core``: packing, rolls, ordered
confirms, the opening and roll steps) runs in writer processes of a simulated world
(the simulation kit, ``scriba.testing.sim``: bookies that journal and fsync, a network
that delays, reorders and drops, per-ledger metadata with a CAS loop). The ledgers under
the segments are the client's own cores (``WriteCore``, ``RecoveryCore``,
``ReadCore``). Added here:

- ``StreamStore``: the stream record (the kit's CAS loop with delays), the writer lock
  (sessions, strictly increasing tokens, expiry ``SESSION_TTL_S`` after a process
  stops answering) and ledger ids.
- ``WriterProcess``: a session, the lock, ``open_steps`` / ``add_segment_steps``
  carried out, a ``WriterCore`` fed by its ledgers' answers. ``crash()`` stops it for
  good (its session expires later); ``pause(d)`` holds every event for ``d`` (SIGSTOP:
  its session may expire meanwhile, and it learns so only after it resumes, or never).
- Readers: one mid-run (the CLOSED segments, then the OPEN one up to its LAC) and two
  at the end (every segment, different replica orders), decoding record sets.

Checks: ``check_stream`` (the log checker of ``scriba.testing`` over positions: one
value per position, contiguous, readers agree, every confirmed record read, nothing
read that was never appended); a writer never gets a record confirmed that it
appended after a newer writer finished opening (single writer); and
the stream record against its ledgers (CLOSED segments end where their ledgers end,
summaries match the record sets, the writer token never goes back, at most two OPEN
segments at once).

Negative control (``recover_open=False``): a new writer closes an OPEN segment at
the LAC a plain read sees, without fencing or recovering its ledger. Records confirmed
past that LAC (the last set, whose LAC has not travelled yet, or a paused writer's
later sets) are lost, and the log checker must say so.

Replay a seed: ``SCRIBA_SIM_SEED=N .venv/bin/pytest tests/stream/test_stream_sim.py -k replay``
(add ``SCRIBA_SIM_STREAM_RECOVER=0`` for the negative control's mode).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stream_checks import check_stream

from scriba.client.read_core import ReadConfig, ReadCore
from scriba.client.recovery_core import RecoveryCore
from scriba.client.transport import LacResult
from scriba.client.write_core import WriteConfig, WriteCore
from scriba.client.writer_state import WriterState
from scriba.entry import Entry, make_digest, master_key
from scriba.errors import ScribaError, Status, WriterFencedError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.records import LedgerMetadata
from scriba.stream import record_set
from scriba.stream.ledgers import summary_of_last_entry
from scriba.stream.position import Position
from scriba.stream.segments import (
    Segment,
    SegmentSummary,
    StreamRecord,
    close_segment,
    last_publish_ms,
    open_segments,
    segment_closed,
)
from scriba.stream.settings import StreamSettings
from scriba.stream.writer_core import (
    AbandonSegment,
    CloseSegment,
    ConfirmRecords,
    CreateLedger,
    DeleteLedgers,
    DiscardLedger,
    FailRecords,
    RecoverSegment,
    SendSet,
    StartRoll,
    Step,
    Steps,
    UpdateStream,
    WriterCore,
    WriterFailed,
    add_segment_steps,
    as_stream_error,
    open_steps,
)
from scriba.testing.sim import (
    Net,
    SeedReport,
    SimBookie,
    SimDriver,
    SimMeta,
    SimTransport,
    World,
    any_spare,
)

REPLAY_TARGET = "tests/stream/test_stream_sim.py -k replay"
RECOVER_FLAG = "SCRIBA_SIM_STREAM_RECOVER"
PASSWORD = b"stream-sim"
SESSION_TTL_S = 0.03
HEAL_AT_S = 0.25
FINAL_WRITER_AT_S = 0.3
RUN_UNTIL_S = 3.0
RETRIES_MAX = 60
QUORUMS = [(3, 3, 2), (3, 2, 2), (4, 3, 2), (3, 3, 3)]


@dataclass
class StreamSimResult(SeedReport):
    recover_open: bool = True
    writers: int = 0
    segments: int = 0
    confirmed: int = 0
    fenced_writers: int = 0  # writers that met WriterFencedError
    recovered_records: int = 0  # records found in OPEN segments by recovery
    events: int = 0
    replay_target: str = REPLAY_TARGET


# --- the metadata store: stream record, writer lock, ledger ids ------------------------
class StreamStore:
    def __init__(self, world: World, record: StreamRecord, *, delay_s: tuple[float, float]) -> None:
        self.world = world
        self.delay_s = delay_s
        self.stream = SimMeta(world, record, delay_s=delay_s)  # type: ignore[arg-type]
        self.ledgers: dict[int, SimMeta] = {}
        self.deleted: set[int] = set()
        self._next_ledger_id = 100
        self._next_session = 0
        self._live: set[int] = set()
        self._holder: int | None = None
        self._revision = 0
        self._queue: list[tuple[int, Callable[[int], None]]] = []

    @property
    def record(self) -> StreamRecord:
        record: StreamRecord = self.stream.record  # type: ignore[assignment]
        return record

    def later(self, fn: Callable[..., None], *args: Any) -> None:
        self.world.at(self.world.rng.uniform(*self.delay_s), fn, *args)

    # sessions and the lock (tokens: the store's revision when the lock was taken)
    def new_session(self) -> int:
        self._next_session += 1
        self._live.add(self._next_session)
        return self._next_session

    def campaign(self, session: int, granted: Callable[[int], None]) -> None:
        def arrive() -> None:
            if session in self._live:
                self._queue.append((session, granted))
                self._grant()

        self.later(arrive)

    def _grant(self) -> None:
        while self._holder is None and self._queue:
            session, granted = self._queue.pop(0)
            if session in self._live:
                self._revision += 1
                self._holder = session
                self.later(granted, self._revision)

    def release(self, session: int) -> None:
        if self._holder == session:
            self._holder = None
            self._grant()

    def expire(self, session: int) -> None:
        self._live.discard(session)
        self._queue = [q for q in self._queue if q[0] != session]
        self.release(session)

    # ledgers
    def create_ledger(self, md: LedgerMetadata) -> SimMeta:
        meta = self.ledgers[int(md.ledger_id)] = SimMeta(self.world, md, delay_s=self.delay_s)
        return meta

    def allocate_ledger_id(self) -> int:
        self._next_ledger_id += 1
        return self._next_ledger_id


class Guarded:
    """A core seen through a process: events to a dead process are lost, to a paused one held."""

    def __init__(self, core: Any, process: WriterProcess) -> None:
        self._core = core
        self._process = process
        self.driver: SimDriver | None = None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._core, name)
        if not name.startswith("on_"):
            return attr
        process = self._process

        def call(*args: Any) -> Any:
            if not process.alive:
                return ()
            if process.paused:
                process.held.append((lambda: self.driver.execute(attr(*args)), ()))  # type: ignore[union-attr]
                return ()
            return attr(*args)

        return call


class SegmentLedger:
    """One segment's ledger as its writer process drives it (``WriteCore`` under ``SimDriver``)."""

    def __init__(self, process: WriterProcess, meta: SimMeta) -> None:
        run = process.run
        self.process = process
        self.ledger_id = int(meta.record.ledger_id)
        self.core = WriteCore(
            meta.record, digest=run.digest, choose_replacement=any_spare(run.world, run.bookie_ids),
            config=WriteConfig(entries_inflight_max=64, ensemble_changes_max=16, replacement_retry_s=0.01),
        )
        guarded = Guarded(self.core, process)
        self.driver = SimDriver(
            run.world, guarded, run.transport, meta, ledger_id=self.ledger_id, master_key=run.key,
            on_complete=self._confirmed, on_fail=self._failed, after=self._after,
        )
        guarded.driver = self.driver
        self.sets: dict[int, int] = {}  # entry id -> set id
        self._on_closed: Callable[[ScribaError | None], None] | None = None

    def append(self, set_id: int, data: bytes) -> None:
        sent = self.core.append(data)  # raises when the ledger cannot take it
        assert sent is not None, "the ledger's in-flight bounds are above the stream writer's"
        entry_id, packed, bookies = sent
        self.sets[entry_id] = set_id
        self.driver.send_add(entry_id, packed, bookies)

    def close(self, then: Callable[[ScribaError | None], None]) -> None:
        try:
            effects = self.core.close()
        except ScribaError as exc:
            then(exc)
            return
        self._on_closed = then
        self.driver.execute(effects)

    def _confirmed(self, first: int, last: int) -> None:
        core = self.process.core
        assert core is not None
        for entry_id in range(first, last + 1):
            set_id = self.sets.pop(entry_id, None)
            if set_id is not None:
                self.process.feed(core.on_set_confirmed(set_id, entry_id))

    def _failed(self, first: int, last: int, error: ScribaError) -> None:
        core = self.process.core
        assert core is not None
        for entry_id in range(first, last + 1):
            set_id = self.sets.pop(entry_id, None)
            if set_id is not None:
                self.process.feed(core.on_set_failed(set_id, as_stream_error(error, core.name)))

    def _after(self) -> None:
        then = self._on_closed
        if then is None:
            return
        if self.core.state is WriterState.CLOSED:
            self._on_closed = None
            then(None)
        elif self.core.state is WriterState.FAILED:
            self._on_closed = None
            then(self.core.error)


# --- a writer process -------------------------------------------------------------------
class WriterProcess:
    def __init__(self, run: StreamRun, pid: int, quota: int) -> None:
        self.run = run
        self.world = run.world
        self.pid = pid
        self.quota = quota
        self.alive = True
        self.paused = False
        self.held: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self.session = run.store.new_session()
        self.token = 0
        self.core: WriterCore[bytes] | None = None
        self.ledgers: dict[int, SegmentLedger] = {}  # by segment seq
        self.created: dict[int, SegmentLedger] = {}  # by ledger id: created, not yet in the record
        self.appended = 0
        self.closing = False
        self.closed_ok = False
        self.fenced = False
        self._flush_due = False

    # --- the process itself ------------------------------------------------------------
    def guard(self, fn: Callable[..., None]) -> Callable[..., None]:
        return lambda *args: self._call(fn, args)

    def _call(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if not self.alive:
            return
        if self.paused:
            self.held.append((fn, args))
            return
        fn(*args)

    def crash(self) -> None:
        if self.alive:
            self.alive = False
            self.held.clear()
            self.world.at(SESSION_TTL_S, self.run.store.expire, self.session)

    def pause(self, duration_s: float) -> None:
        if not self.alive or self.paused:
            return
        self.paused = True
        expires = duration_s > SESSION_TTL_S
        if expires:
            self.world.at(SESSION_TTL_S, self.run.store.expire, self.session)
        self.world.at(duration_s, self._resume, expires)

    def _resume(self, expired: bool) -> None:
        if not self.alive:
            return
        self.paused = False
        held, self.held = self.held, []
        for fn, args in held:
            self._call(fn, args)
        notice_s = self.world.rng.choice([0.001, 0.02, None])
        if expired and notice_s is not None:  # the keep-alive fails once the process runs again
            self.world.at(notice_s, self.guard(self._lock_lost))
        # (None: it never notices; fencing through the ledgers and the token must stop it)

    def _lock_lost(self) -> None:
        if self.core is not None:
            self.feed(self.core.on_lock_lost("session expired"))

    # --- opening ----------------------------------------------------------------------
    def start(self) -> None:
        self.run.store.campaign(self.session, self.guard(self._granted))

    def _granted(self, token: int) -> None:
        self.token = token
        self.run_steps(open_steps(token, self._now_ms), self._opened, self._open_failed)

    def _opened(self, result: tuple[StreamRecord, int]) -> None:
        record, seq = result
        self.run.opened_at.append((self.token, self.world.now))
        self.ledgers[seq] = self._take(record, seq)
        self.core = WriterCore(
            "sim/s", self.run.settings, self.run.clock, segment_seq=seq, publish_ms=last_publish_ms(record),
            sets_inflight_max=self.run.sets_inflight_max, records_waiting_max=64,
        )
        self.world.at(self.world.rng.uniform(0.0, 0.002), self.guard(self._burst))

    def _open_failed(self, error: ScribaError) -> None:
        if isinstance(error, WriterFencedError):
            self.fenced = True
        self.run.store.release(self.session)

    def _take(self, record: StreamRecord, seq: int) -> SegmentLedger:
        segment = record.segment(seq)
        assert segment is not None
        return self.created.pop(segment.ledger_id)

    def _now_ms(self) -> int:
        return int(self.run.clock.wall() * 1000)

    # --- workload -----------------------------------------------------------------------
    def _burst(self) -> None:
        core = self.core
        assert core is not None
        if core.error is not None or self.closing:
            return
        rng = self.world.rng
        for _ in range(rng.choice([1, 1, 2, 3, 5, 8])):
            if self.appended >= self.quota or core.room() <= 0:
                break
            payload = b"w%d-r%d-" % (self.pid, self.appended) + b"." * rng.randint(0, 300)
            headers = {"h": b"v%d" % self.appended} if rng.random() < 0.2 else None
            core.append(core.check_record(payload, headers), payload)
            self.run.attempted.append(payload)
            self.run.appended_at[payload] = self.world.now
            self.appended += 1
        self._schedule_flush()
        if self.appended < self.quota:
            self.world.at(rng.uniform(0.0002, 0.003), self.guard(self._burst))
        else:
            core.begin_close()
            self.closing = True
            self._try_close()

    def _schedule_flush(self) -> None:
        if not self._flush_due and self.core is not None and self.core.waiting:
            self._flush_due = True
            self.world.at(0.0, self.guard(self._flush))

    def _flush(self) -> None:
        self._flush_due = False
        if self.core is not None:
            self.feed(self.core.flush())

    # --- the core's effects ----------------------------------------------------------------
    def feed(self, effects: Sequence[Any]) -> None:
        core = self.core
        assert core is not None
        for effect in effects:
            if isinstance(effect, SendSet):
                self._send(effect)
            elif isinstance(effect, ConfirmRecords):
                for slot, payload in enumerate(effect.handles):
                    self.run.on_confirmed(self, Position(effect.segment_seq, effect.entry_id, slot), payload)
                self._schedule_flush()  # room for another set
            elif isinstance(effect, FailRecords):
                self.run.failed += len(effect.handles)
            elif isinstance(effect, StartRoll):
                self.run_steps(add_segment_steps(self.token, self._now_ms), self._added, self._roll_failed)
            elif isinstance(effect, CloseSegment):
                self._close_segment(effect, self._segment_closed)
                self._schedule_flush()
            elif isinstance(effect, AbandonSegment):
                self.ledgers.pop(effect.segment_seq, None)
            elif isinstance(effect, WriterFailed):
                self.fenced = self.fenced or isinstance(effect.error, WriterFencedError)
                self.run.store.release(self.session)
            else:
                raise AssertionError(f"unexpected effect {effect!r}")
        self._try_close()

    def _send(self, effect: SendSet) -> None:
        core = self.core
        assert core is not None
        try:
            self.ledgers[effect.segment_seq].append(effect.set_id, effect.data)
        except ScribaError as exc:
            self.feed(core.on_set_failed(effect.set_id, as_stream_error(exc, core.name)))

    def _added(self, result: tuple[StreamRecord, int]) -> None:
        record, seq = result
        self.ledgers[seq] = self._take(record, seq)
        assert self.core is not None
        self.feed(self.core.on_segment_added(seq))

    def _roll_failed(self, error: ScribaError) -> None:
        assert self.core is not None
        self.feed(self.core.on_roll_failed(error))

    def _segment_closed(self, seq: int) -> None:
        assert self.core is not None
        self.feed(self.core.on_segment_closed(seq))

    def _close_segment(self, effect: CloseSegment, then: Callable[[int], None]) -> None:
        seq, summary = effect.segment_seq, effect.summary
        ledger = self.ledgers[seq]
        token = self.token

        def ledger_closed(error: ScribaError | None) -> None:
            if error is not None:
                self._roll_failed(as_stream_error(error, "sim/s"))
                return
            if ledger.core.last_add_confirmed != summary.last_entry_id:
                self.run.violation(f"writer {self.pid}: segment {seq} ledger closed at "
                                   f"{ledger.core.last_add_confirmed}, summary says {summary.last_entry_id}")
            step = UpdateStream(lambda r: not segment_closed(r, seq),
                                lambda r: close_segment(r, seq, summary, self._now_ms(), token))
            self.perform(step, lambda _record: then(seq), self._roll_failed)

        ledger.close(self.guard(ledger_closed))

    def _try_close(self) -> None:
        core = self.core
        if core is None or not self.closing or self.closed_ok:
            return
        if core.error is not None:
            self.closing = False
            return
        if not core.idle:
            return

        def done(_seq: int) -> None:
            self.closed_ok = True
            self.run.store.release(self.session)

        self.closed_ok = True  # no second close while this one runs
        self._close_segment(core.close(), done)

    # --- steps ----------------------------------------------------------------------------
    def run_steps(self, steps: Steps, done: Callable[[Any], None], failed: Callable[[ScribaError], None]) -> None:
        def advance(result: Any = None, error: ScribaError | None = None) -> None:
            try:
                step = steps.send(result) if error is None else steps.throw(error)
            except StopIteration as stop:
                done(stop.value)
                return
            except ScribaError as exc:
                failed(exc)
                return
            self.perform(step, advance, lambda exc: advance(None, exc))

        advance()

    def perform(self, step: Step, ok: Callable[[Any], None], err: Callable[[ScribaError], None]) -> None:
        run = self.run
        store = run.store
        if isinstance(step, UpdateStream):
            def answered(record: Any, error: ScribaError | None) -> None:
                if error is not None:
                    err(error)
                else:
                    ok(record)

            store.stream.update(step, self.guard(answered))  # type: ignore[arg-type]
        elif isinstance(step, RecoverSegment):
            recover = run.recover_segment if run.recover_open else run.close_at_plain_lac
            recover(step.segment, self.guard(ok), self.guard(err))
        elif isinstance(step, DeleteLedgers):
            store.deleted.update(step.ledger_ids)
            store.later(self.guard(ok), list(step.ledger_ids))
        elif isinstance(step, CreateLedger):
            store.later(self.guard(self._create_ledger), ok)
        elif isinstance(step, DiscardLedger):
            self.created.pop(step.ledger_id, None)
            if step.delete:
                store.deleted.add(step.ledger_id)
            ok(None)
        else:
            raise AssertionError(f"unexpected step {step!r}")

    def _create_ledger(self, ok: Callable[[int], None]) -> None:
        run = self.run
        ledger_id = run.store.allocate_ledger_id()
        e, w, a = run.quorum
        md = LedgerMetadata(
            ledger_id=LedgerId(ledger_id), ensemble_size=e, write_quorum_size=w, ack_quorum_size=a,
            ensembles=((EntryId(0), tuple(self.world.rng.sample(run.bookie_ids, e))),),
        )
        self.created[ledger_id] = SegmentLedger(self, run.store.create_ledger(md))
        ok(ledger_id)


# --- the run ----------------------------------------------------------------------------
class StreamRun:
    def __init__(self, seed: int, *, recover_open: bool = True) -> None:
        self.seed = seed
        self.recover_open = recover_open
        world = self.world = World(seed)
        rng = world.rng
        self.clock = world.clock
        self.quorum = rng.choice(QUORUMS)
        self.bookie_ids = [BookieId(f"b{i}") for i in range(self.quorum[0] + 2)]
        self.bookies = {b: SimBookie(world, b) for b in self.bookie_ids}
        self.drop_p = rng.choice([0.0, 0.0, 0.0, 0.005])
        self.net = Net(world, delay_s=(0.00005, rng.choice([0.0005, 0.002])), drop_p=self.drop_p)
        self.transport = SimTransport(world, self.net, self.bookies, add_timeout_s=0.02, read_timeout_s=0.02)
        self.store = StreamStore(world, StreamRecord("s"), delay_s=(0.0002, 0.002))
        self.digest = make_digest("crc32c", PASSWORD)
        self.key = master_key(PASSWORD)
        records_max = rng.choice([1, 2, 3, 5, 8, None])
        e, w, a = self.quorum
        self.settings = StreamSettings(
            ensemble_size=e, write_quorum_size=w, ack_quorum_size=a,
            segment_records_max=records_max,
            segment_bytes_max=rng.choice([600, 2000]) if records_max is None else rng.choice([None, None, 1500]),
            record_set_bytes_max=1024, record_bytes_max=1024,
        ).validate()
        self.sets_inflight_max = rng.choice([1, 2, 4, 8])
        self.writers: list[WriterProcess] = []
        self.confirmed: dict[Position, bytes] = {}
        self.confirmed_by: dict[bytes, Position] = {}
        self.attempted: list[bytes] = []
        self.appended_at: dict[bytes, float] = {}
        self.opened_at: list[tuple[int, float]] = []  # (token, when that writer finished opening)
        self.failed = 0
        self.recovered_records = 0
        self.mid_read: list[tuple[Position, bytes]] | None = None
        self.result = StreamSimResult(seed, recover_open=recover_open,
                                      replay_env={} if recover_open else {RECOVER_FLAG: "0"})
        self._epoch_seen = 0
        self._version_seen = 0
        self.result.description = (
            f"E{e}/W{w}/A{a}, {len(self.bookie_ids)} bookies, drop_p={self.drop_p}, "
            f"segment_records_max={records_max}, segment_bytes_max={self.settings.segment_bytes_max}, "
            f"sets_inflight_max={self.sets_inflight_max}"
            f"{', RECOVERY OF OPEN SEGMENTS SKIPPED' if not recover_open else ''}"
        )

    # --- bookkeeping --------------------------------------------------------------------
    def violation(self, text: str) -> None:
        self.result.violations.append(f"t={self.world.now * 1000:.3f}ms {text}")

    def on_confirmed(self, writer: WriterProcess, position: Position, payload: bytes) -> None:
        if position in self.confirmed and self.confirmed[position] != payload:
            self.violation(f"position {position} confirmed twice: to {payload[:12]!r} and "
                           f"{self.confirmed[position][:12]!r}")
        if payload in self.confirmed_by:
            self.violation(f"record {payload[:12]!r} confirmed twice")
        self.confirmed[position] = payload
        self.confirmed_by[payload] = position
        newer = next(((t, at) for t, at in self.opened_at if t > writer.token), None)
        if newer is not None and self.appended_at[payload] > newer[1]:
            self.violation(f"writer {writer.pid} (token {writer.token}) got {payload[:12]!r} confirmed, appended "
                           f"after the writer with token {newer[0]} opened at t={newer[1] * 1000:.3f}ms")

    def _check_record(self) -> None:
        """After every event: the stream record's token never goes back; at most two OPEN segments."""
        meta = self.store.stream
        if meta.version == self._version_seen:
            return
        self._version_seen = meta.version
        record = self.store.record
        if record.writer_epoch < self._epoch_seen:
            self.violation(f"writer token went back from {self._epoch_seen} to {record.writer_epoch}")
        self._epoch_seen = record.writer_epoch
        if len(open_segments(record)) > 2:
            self.violation(f"{len(open_segments(record))} OPEN segments at once")

    # --- recovering an OPEN segment (and the negative control) ----------------------------
    def recover_segment(self, segment: Segment, ok: Callable[[SegmentSummary], None],
                        err: Callable[[ScribaError], None], attempt: int = 0) -> None:
        meta = self.store.ledgers[segment.ledger_id]
        core = RecoveryCore(meta.record, digest=self.digest)

        def done(record: object) -> None:
            assert isinstance(record, LedgerMetadata)
            last = int(record.last_entry_id)
            if last < 0:
                ok(SegmentSummary())
                return
            self._read_entries(segment.ledger_id, last, last, lambda entries: self._summarised(entries, ok), again)

        def again(error: ScribaError) -> None:
            self._retry(attempt, error, err, lambda a: self.recover_segment(segment, ok, err, a))

        driver = SimDriver(self.world, core, self.transport, meta, ledger_id=segment.ledger_id,
                           master_key=self.key, on_done=done, on_failed=again)
        driver.execute(core.start())

    def _summarised(self, entries: list[Entry], ok: Callable[[SegmentSummary], None]) -> None:
        summary = summary_of_last_entry(entries[0])
        self.recovered_records += summary.record_count
        ok(summary)

    def _retry(self, attempt: int, error: ScribaError, err: Callable[[ScribaError], None],
               again: Callable[[int], None]) -> None:
        if attempt >= RETRIES_MAX:
            err(error)
        else:
            self.world.at(0.01, again, attempt + 1)

    def close_at_plain_lac(self, segment: Segment, ok: Callable[[SegmentSummary], None],
                           err: Callable[[ScribaError], None], attempt: int = 0) -> None:
        """NEGATIVE CONTROL: the segment's end from a plain LAC read: no fence, no recovery."""
        self._read_lac(segment.ledger_id, lambda lac: ok(SegmentSummary()) if lac < 0 else self._read_entries(
            segment.ledger_id, lac, lac, lambda entries: ok(summary_of_last_entry(entries[0])),
            lambda e: self._retry(attempt, e, err, lambda a: self.close_at_plain_lac(segment, ok, err, a))))

    def _read_lac(self, ledger_id: int, then: Callable[[int], None]) -> None:
        """The highest LAC any bookie of the ledger's last ensemble reports (no fencing)."""
        ensemble = self.store.ledgers[ledger_id].record.current_ensemble
        answers: list[int] = []

        def answer(result: LacResult | None, status: Status) -> None:
            answers.append(int(result.lac) if result is not None and status == Status.OK else -1)
            if len(answers) == len(ensemble):
                then(max(answers))

        for bookie in ensemble:
            self.transport.read_lac(bookie, ledger_id, False, self.key, answer)

    def _read_entries(self, ledger_id: int, first: int, last: int, ok: Callable[[list[Entry]], None],
                      err: Callable[[ScribaError], None]) -> None:
        meta = self.store.ledgers[ledger_id]
        order_rng = self.world.rng
        core = ReadCore(meta.record, first, last, digest=self.digest,
                        read_order=lambda ws: order_rng.sample(list(ws), len(ws)),
                        config=ReadConfig(entries_window=16, batch_entries_max=8, speculative_timeout_s=0.005))
        got: list[Entry] = []
        driver = SimDriver(self.world, core, self.transport, meta, ledger_id=ledger_id, master_key=self.key,
                           on_deliver=lambda entries: got.extend(entries),  # type: ignore[arg-type]
                           on_done=lambda _v: ok(got), on_failed=err)
        driver.execute(core.start())

    # --- readers ---------------------------------------------------------------------------
    def read_stream(self, record: StreamRecord, *, tail_open: bool, strict: bool,
                    done: Callable[[list[tuple[Position, bytes]]], None], attempt: int = 0) -> None:
        """The records of ``record``'s segments in order: CLOSED ones to their recorded end;
        the first OPEN one (with ``tail_open``) up to the LAC its bookies report; then stop."""
        out: list[tuple[Position, bytes]] = []
        segments = list(record.segments)

        def retry(error: ScribaError) -> None:
            if attempt >= RETRIES_MAX:
                self.violation(f"reader gave up: {error}")
                return
            self.world.at(0.01, lambda: self.read_stream(record, tail_open=tail_open, strict=strict,
                                                         done=done, attempt=attempt + 1))

        def segment_at(i: int) -> None:
            if i == len(segments):
                done(out)
                return
            segment = segments[i]
            if segment.is_open:
                if tail_open:
                    self._read_lac(segment.ledger_id, lambda lac: read(segment, lac, lambda: done(out)))
                else:
                    done(out)
                return
            read(segment, segment.summary.last_entry_id, lambda: segment_at(i + 1))

        def read(segment: Segment, last: int, then: Callable[[], None]) -> None:
            if last < 0:
                self._decoded(segment, [], out, strict)
                then()
                return

            def got(entries: list[Entry]) -> None:
                self._decoded(segment, entries, out, strict)
                then()

            self._read_entries(segment.ledger_id, 0, last, got, retry)

        segment_at(0)

    def _decoded(self, segment: Segment, entries: list[Entry], out: list[tuple[Position, bytes]], strict: bool) -> None:
        records = size = 0
        last_slot = -1
        for entry in entries:
            header, items = record_set.decode(entry.payload)
            if (header.records_before, header.bytes_before) != (records, size):
                self.violation(f"segment {segment.seq} entry {entry.entry_id}: header says "
                               f"{header.records_before} records / {header.bytes_before} bytes before, "
                               f"read {records} / {size}")
            for slot, (payload, _headers) in enumerate(items):
                out.append((Position(segment.seq, int(entry.entry_id), slot), payload))
            records += len(items)
            size += len(entry.payload)
            last_slot = len(items) - 1
        if not strict:
            return
        summary = segment.summary
        found = SegmentSummary(len(entries) - 1, last_slot, records, size, summary.last_publish_ms)
        if found != summary:
            self.violation(f"segment {segment.seq}: recorded {summary}, its ledger holds {found}")
        ledger = self.store.ledgers[segment.ledger_id].record
        if self.recover_open and (not ledger.is_closed or int(ledger.last_entry_id) != summary.last_entry_id):
            self.violation(f"segment {segment.seq} ends at entry {summary.last_entry_id}; its ledger is "
                           f"{ledger.state.value} at {ledger.last_entry_id}")

    def _mid_read(self) -> None:
        def done(records: list[tuple[Position, bytes]]) -> None:
            self.mid_read = records

        self.read_stream(self.store.record, tail_open=True, strict=False, done=done)

    # --- the scenario -------------------------------------------------------------------------
    def run(self) -> StreamSimResult:
        world = self.world
        rng = world.rng
        n_writers = rng.randint(2, 4)
        together = rng.random() < 0.5  # racing openers
        for pid in range(n_writers):
            writer = WriterProcess(self, pid, quota=rng.randint(3, 30))
            self.writers.append(writer)
            start = 0.0 if together and pid < 2 else rng.uniform(0.0, 0.08)
            world.at(start, writer.start)
            fate = rng.random()
            if fate < 0.35:
                world.at(start + rng.uniform(0.001, 0.12), writer.crash)
            elif fate < 0.6:
                world.at(start + rng.uniform(0.001, 0.1), writer.pause, rng.choice([0.01, 0.05, 0.12]))
        if rng.random() < 0.3:
            bookie = self.bookies[rng.choice(self.bookie_ids)]
            at = rng.uniform(0.0, 0.15)
            world.at(at, bookie.crash)
            world.at(at + rng.uniform(0.002, 0.05), bookie.restart)
        world.at(rng.uniform(0.02, 0.2), self._mid_read)
        world.at(HEAL_AT_S, self._heal)
        final = WriterProcess(self, n_writers, quota=1)
        self.writers.append(final)
        world.at(FINAL_WRITER_AT_S, final.start)
        world.run(RUN_UNTIL_S, after_event=self._check_record)
        if not final.closed_ok:
            self.violation("the final writer did not open, append and close")
        self._final_checks()
        self.result.writers = len(self.writers)
        self.result.segments = len(self.store.record.segments)
        self.result.confirmed = len(self.confirmed)
        self.result.fenced_writers = sum(w.fenced for w in self.writers)
        self.result.recovered_records = self.recovered_records
        self.result.events = world.events
        return self.result

    def _heal(self) -> None:
        self.net.drop_p = 0.0
        for bookie in self.bookies.values():
            bookie.restart()

    def _final_checks(self) -> None:
        record = self.store.record
        if open_segments(record):
            self.violation(f"OPEN segments at the end: {[s.seq for s in open_segments(record)]}")
            return
        seqs = [s.seq for s in record.segments]
        if seqs != list(range(record.next_seq)):
            self.violation(f"segment numbers {seqs} are not 0..{record.next_seq - 1}")
        gone = [s.seq for s in record.segments if s.ledger_id in self.store.deleted]
        if gone:
            self.violation(f"segments {gone} point at deleted ledgers")
        reads: dict[str, list[tuple[Position, bytes]]] = {}
        for name in ("reader-1", "reader-2"):
            self.read_stream(record, tail_open=False, strict=True, done=lambda got, n=name: reads.__setitem__(n, got))
            self.world.run(self.world.now + 2.0)
            if name not in reads:
                self.violation(f"{name} did not finish")
                return
        partial = ()
        if self.mid_read is not None:
            reads["mid-run"] = self.mid_read
            partial = ("mid-run",)
        result = check_stream(reads, self.confirmed, attempted=self.attempted, partial=partial)
        for violation in result.violations:
            self.violation(f"log: {violation}")
