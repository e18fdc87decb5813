"""A writer process of the stream simulation (``sim_stream.py``).

``WriterProcess``: a session in the ``StreamStore``, the writer lock, ``open_steps`` /
``add_segment_steps`` carried out step by step (``run_steps`` / ``perform``: the same
generators ``StreamWriter`` runs), then a ``WriterCore`` fed by its ledgers' answers
(``feed`` carries out the core's effects). ``crash()`` stops it for good (its session
expires later); ``pause(d)`` holds every event for ``d`` (SIGSTOP: its session may expire
meanwhile, and it learns so only after it resumes, or never: then fencing through the
ledgers and the token must stop it).

``SegmentLedger``: one segment's ledger as its process drives it (the client's
``WriteCore`` under the kit's ``SimDriver``), mapping entries back to record sets.
``Guarded``: a core seen through its process: events to a dead process are lost, to a
paused one held until it resumes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sim_stream_store import SESSION_TTL_S

from scriba.client.write_core import WriteConfig, WriteCore
from scriba.client.writer_state import WriterState
from scriba.errors import ScribaError, WriterFencedError
from scriba.ids import EntryId, LedgerId
from scriba.meta.records import LedgerMetadata
from scriba.stream.position import Position
from scriba.stream.segments import (
    StreamRecord,
    close_segment,
    last_publish_ms,
    segment_closed,
)
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
    SimDriver,
    SimMeta,
    any_spare,
)

if TYPE_CHECKING:
    from sim_stream import StreamRun


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
