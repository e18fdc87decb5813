"""One seeded run of the stream writer's rules: crashes, pauses, racing openers and rolls.

The stream writer's core (``scriba.stream.writer_core``: packing, rolls, ordered
confirms, the opening and roll steps) runs in writer processes of a simulated world
(the simulation kit, ``scriba.testing.sim``: bookies that journal and fsync, a network
that delays, reorders and drops, per-ledger metadata with a CAS loop). The ledgers under
the segments are the client's own cores (``WriteCore``, ``RecoveryCore``,
``ReadCore``). Added:

- ``StreamStore`` (``sim_stream_store.py``): the stream record (the kit's CAS loop with
  delays), the writer lock (sessions, strictly increasing tokens, expiry
  ``SESSION_TTL_S`` after a process stops answering) and ledger ids.
- ``WriterProcess`` (``sim_stream_writer.py``): a session, the lock, ``open_steps`` /
  ``add_segment_steps`` carried out, a ``WriterCore`` fed by its ledgers' answers.
  ``crash()`` stops it for good (its session expires later); ``pause(d)`` holds every
  event for ``d`` (SIGSTOP: its session may expire meanwhile, and it learns so only
  after it resumes, or never).
- Here, ``StreamRun``: the world, the schedule of writers, crashes and pauses, the
  recovery of OPEN segments (or, as the negative control, a close at the plain LAC).
- Readers (here): one mid-run (the CLOSED segments, then the OPEN one up to its LAC) and two
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

from collections.abc import Callable
from dataclasses import dataclass

from sim_stream_store import StreamStore
from sim_stream_writer import WriterProcess
from stream_checks import check_stream

from scriba.client.read_core import ReadConfig, ReadCore
from scriba.client.recovery_core import RecoveryCore
from scriba.client.transport import LacResult
from scriba.entry import Entry, make_digest, master_key
from scriba.errors import ScribaError, Status
from scriba.ids import BookieId
from scriba.meta.records import LedgerMetadata
from scriba.stream import record_set
from scriba.stream.ledgers import summary_of_last_entry
from scriba.stream.position import Position
from scriba.stream.segments import (
    Segment,
    SegmentSummary,
    StreamRecord,
    open_segments,
)
from scriba.stream.settings import StreamSettings
from scriba.testing.sim import (
    Net,
    SeedReport,
    SimBookie,
    SimDriver,
    SimTransport,
    World,
)

REPLAY_TARGET = "tests/stream/test_stream_sim.py -k replay"
RECOVER_FLAG = "SCRIBA_SIM_STREAM_RECOVER"
PASSWORD = b"stream-sim"
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
