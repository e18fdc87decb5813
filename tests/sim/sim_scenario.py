"""One seeded run: a writer, faults, concurrent recoverers, then readers; checked at every step.

Checks (violations are sentences naming the seed's facts):
- confirmations leave in order (each range starts right after the previous one);
- the writer's LAC and every bookie's stored LAC never decrease;
- no bookie's LAC ever exceeds the writer's confirmed LAC (a piggybacked LAC is one
  the writer had confirmed when it packed the entry);
- no confirmed entry is lost: the closed ledger ends at or after every confirmed entry,
  and readers get each confirmed entry with the bytes appended;
- nothing unexpected: every entry readers get was appended by the writer;
- a fenced writer gets no confirmation after fencing completed beyond the closed end;
- all readers and recoverers agree on the closed ledger's last entry and bytes;
- the closed ledger's length is the sum of the payloads appended up to its last entry.

With ``probes=True`` the writer also sends fence probes (``scriba.client.fence_probe``:
plain LAC reads to its current ensemble, as an RSM leader does for a linearizable read)
every few milliseconds, before and after recovery, and one more check holds:
- a probe proven unfenced was sent before any recovery had completed fencing
  (``probe_fault="qa_minus_one"``, a probe counting ``Qa - 1`` answers, must be caught).

Negative controls: ``fencing=False`` and ``ack_early=True`` (bookie faults), and
``writer_fault`` (``"lac_ahead"``: entries piggyback LAC + 1; ``"length_reset"``: the
running length is not accumulated), each of which the checks must catch.

Replay a seed: ``SCRIBA_SIM_SEED=123 .venv/bin/pytest tests/sim -k replay`` (add
``SCRIBA_SIM_RACE=1`` for a seed of the R3 race mode; the negative controls print
``SCRIBA_SIM_FENCING=0`` / ``SCRIBA_SIM_ACK_EARLY=1``).

The world (bookies, network, metadata, driver, seeds) is the shared kit
``scriba.testing.sim``; this module is the ledger's scenario and its checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scriba.client.fence_probe import UnfencedProbe, Verdict
from scriba.client.recovery_core import RecoveryCore
from scriba.client.transport import LacResult
from scriba.client.write_core import Append, WriteConfig, WriteCore
from scriba.client.writer_state import WriterState
from scriba.entry import Entry, make_digest, master_key
from scriba.errors import ScribaError, Status
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.records import LedgerMetadata, LedgerState
from scriba.testing.checkers import LogRead, check_acked_set, check_log
from scriba.testing.sim import (
    Net,
    SeedReport,
    SimBookie,
    SimDriver,
    SimMeta,
    SimTransport,
    World,
    any_spare,
    closed_ledger_problems,
    read_ledger,
)

LEDGER_ID = 1
PASSWORD = b"sim"
QUORUMS = [(3, 3, 2), (3, 2, 2), (4, 3, 2), (3, 3, 3), (5, 3, 2), (2, 2, 1), (4, 2, 2)]


@dataclass
class SimResult(SeedReport):
    confirmed: int = -1
    closed_last: int | None = None
    events: int = 0
    ensemble_changes: int = 0
    writer_error: str = ""
    race: bool = False
    fencing: bool = True
    ack_early: bool = False
    writer_fault: str = ""
    probes: bool = False
    probe_fault: str = ""
    probes_proven: int = 0
    probes_unproven_after_fence: int = 0

    def __post_init__(self) -> None:
        flags = (
            ("SCRIBA_SIM_PROBES", "1", self.probes),
            ("SCRIBA_SIM_PROBE_FAULT", self.probe_fault, bool(self.probe_fault)),
            ("SCRIBA_SIM_RACE", "1", self.race),
            ("SCRIBA_SIM_FENCING", "0", not self.fencing),
            ("SCRIBA_SIM_ACK_EARLY", "1", self.ack_early),
            ("SCRIBA_SIM_WRITER_FAULT", self.writer_fault, bool(self.writer_fault)),
        )
        self.replay_env = {name: value for name, value, on in flags if on}


class _LacAheadWriteCore(WriteCore):
    """Negative control: every entry piggybacks LAC + 1 (one the writer never confirmed)."""

    def append(self, payload: bytes) -> Append | None:
        self._lac += 1
        try:
            return super().append(payload)
        finally:
            self._lac -= 1


class _LengthResetWriteCore(WriteCore):
    """Negative control: the ledger length is not accumulated (each entry: its own size)."""

    def append(self, payload: bytes) -> Append | None:
        self._length = 0
        return super().append(payload)


class _QaMinusOneProbe(UnfencedProbe):
    """Negative control: ``Qa - 1`` "not fenced" answers in one write set count as proof."""

    def on_answer(self, slot: int, fenced: bool) -> Verdict:
        verdict = super().on_answer(slot, fenced)
        q = self.quorum
        if verdict is Verdict.PENDING and any(
            sum(1 for x in slots if x in self.not_fenced) >= q.ack_quorum_size - 1 for slots in q.write_sets()
        ):
            self.verdict = Verdict.PROVEN
        return self.verdict


PROBE_FAULTS: dict[str, type[UnfencedProbe]] = {"": UnfencedProbe, "qa_minus_one": _QaMinusOneProbe}

WRITER_FAULTS: dict[str, type[WriteCore]] = {
    "": WriteCore, "lac_ahead": _LacAheadWriteCore, "length_reset": _LengthResetWriteCore,
}


class Run:
    def __init__(
        self, seed: int, *, fencing: bool = True, race: bool = False, ack_early: bool = False,
        writer_fault: str = "", probes: bool = False, probe_fault: str = "",
    ) -> None:
        self.seed = seed
        self.probes = probes or bool(probe_fault)
        self.probe_class = PROBE_FAULTS[probe_fault]
        self.race = race  # R3: no faults; recovery lands while appends are in flight
        world = self.world = World(seed)
        rng = world.rng
        e, w, a = rng.choice(QUORUMS)
        n_bookies = e + rng.randint(1, 2)
        self.bookie_ids = [BookieId(f"b{i}") for i in range(n_bookies)]
        self.bookies = {
            b: SimBookie(world, b, fencing=fencing, ack_before_fsync=ack_early)
            for b in self.bookie_ids
        }
        self.drop_p = 0.0 if race else rng.choice([0.0, 0.0, 0.01, 0.05])
        self.net = Net(world, delay_s=(0.00005, rng.choice([0.0005, 0.002])), drop_p=self.drop_p)
        self.transport = SimTransport(
            world, self.net, self.bookies, add_timeout_s=0.02, read_timeout_s=0.02
        )
        ensemble = tuple(rng.sample(self.bookie_ids, e))
        self.md = LedgerMetadata(
            ledger_id=LedgerId(LEDGER_ID), ensemble_size=e, write_quorum_size=w,
            ack_quorum_size=a, ensembles=((EntryId(0), ensemble),),
        )
        self.meta = SimMeta(world, self.md, delay_s=(0.0002, 0.003))
        self.digest = make_digest("crc32c", PASSWORD)
        self.key = master_key(PASSWORD)
        self.result = SimResult(
            seed, race=race, fencing=fencing, ack_early=ack_early, writer_fault=writer_fault,
            probes=self.probes, probe_fault=probe_fault,
        )
        # writer
        self.n_entries = rng.randint(10, 60)
        self.writer_closes = rng.random() < 0.2
        self.payloads: dict[int, bytes] = {}
        self.writer = WRITER_FAULTS[writer_fault](
            self.md, digest=self.digest, choose_replacement=any_spare(world, self.bookie_ids),
            config=WriteConfig(
                entries_inflight_max=rng.choice([1, 4, 16, 64]), ensemble_changes_max=16,
                replacement_retry_s=0.01,
            ),
        )
        self.writer_driver = SimDriver(
            world, self.writer, self.transport, self.meta, ledger_id=LEDGER_ID, master_key=self.key,
            on_complete=self._on_complete, on_fail=self._on_fail, after=self._step,
            ack_window_s=0.0005 if seed % 2 == 0 else None,  # even seeds: batched answers
        )
        self.appended = 0
        self.confirmed_last = -1
        self.confirm_times: dict[int, float] = {}
        self.fenced_at: float | None = None
        self.writer_lac = -1
        self.bookie_lacs: dict[tuple[BookieId, int], int] = {}
        # recoverers
        self.recoverers: list[dict[str, Any]] = []
        self.recovered: list[LedgerMetadata] = []
        self.heal_at = 0.12
        self.description = (
            f"E{e}/W{w}/A{a}, {n_bookies} bookies, {self.n_entries} appends, drop_p={self.drop_p}, "
            f"fencing={'on' if fencing else 'OFF'}{', R3 race' if race else ''}"
            f"{', ACK BEFORE FSYNC' if ack_early else ''}"
            f"{f', WRITER FAULT {writer_fault}' if writer_fault else ''}"
            f"{', fence probes' if self.probes else ''}{f', PROBE FAULT {probe_fault}' if probe_fault else ''}"
        )
        self.result.description = self.description

    # --- checks ----------------------------------------------------------------------
    def violation(self, text: str) -> None:
        self.result.violations.append(f"t={self.world.now * 1000:.3f}ms {text}")

    def _on_complete(self, first: int, last: int) -> None:
        if first != self.confirmed_last + 1 or last < first:
            self.violation(f"confirmations out of order: {first}..{last} after {self.confirmed_last}")
        self.confirmed_last = max(self.confirmed_last, last)
        for entry_id in range(first, last + 1):
            self.confirm_times[entry_id] = self.world.now

    def _on_fail(self, first: int, last: int, error: ScribaError) -> None:
        self.result.writer_error = type(error).__name__

    def _step(self) -> None:
        lac = self.writer.last_add_confirmed
        if lac < self.writer_lac:
            self.violation(f"writer LAC went back from {self.writer_lac} to {lac}")
        self.writer_lac = lac
        if self.fenced_at is None and any(r["core"].fenced for r in self.recoverers):
            self.fenced_at = self.world.now

    def _check_bookies(self) -> None:
        for bookie in self.bookies.values():
            for ledger_id, state in bookie.ledgers.items():
                key = (bookie.bookie_id, ledger_id)
                if state.lac < self.bookie_lacs.get(key, -1):
                    self.violation(f"bookie {bookie.bookie_id} LAC went back to {state.lac}")
                if state.lac > self.confirmed_last and state.lac != self.bookie_lacs.get(key):
                    self.violation(
                        f"bookie {bookie.bookie_id} LAC {state.lac} is beyond the writer's "
                        f"confirmed LAC {self.confirmed_last}"
                    )
                self.bookie_lacs[key] = state.lac

    # --- actors ----------------------------------------------------------------------
    def _append_some(self) -> None:
        w = self.writer
        while self.appended < self.n_entries and w.state is WriterState.OPEN:
            payload = b"seed%d-entry%d-" % (self.seed, self.appended) + b"x" * self.world.rng.randint(0, 40)
            sent = w.append(payload)  # the production append path (LedgerWriter's too)
            if sent is None:  # no room in flight
                break
            self.payloads[sent[0]] = payload
            self.appended += 1
            self.writer_driver.send_add(*sent)
            self._step()
            if self.world.rng.random() < 0.3:
                break  # pace the writer
        if self.appended < self.n_entries and w.state is WriterState.OPEN:
            self.world.at(self.world.rng.uniform(0.0001, 0.002), self._append_some)
        elif self.writer_closes and w.state is WriterState.OPEN:
            self.writer_driver.execute(w.close())

    def _start_recovery(self, attempt: int = 0) -> None:
        core = RecoveryCore(self.meta.record, digest=self.digest)
        entry: dict[str, Any] = {"core": core}
        self.recoverers.append(entry)

        def done(record: object) -> None:
            assert isinstance(record, LedgerMetadata)
            self.recovered.append(record)

        def failed(error: ScribaError) -> None:
            if attempt < 40:
                self.world.at(0.01, self._start_recovery, attempt + 1)
            else:
                self.violation(f"recovery never succeeded: {error}")

        driver = SimDriver(
            self.world, core, self.transport, self.meta, ledger_id=LEDGER_ID, master_key=self.key,
            on_done=done, on_failed=failed, after=self._step,
        )
        driver.execute(core.start())

    def _probe(self) -> None:
        """One fence probe from the writer now (as ``LedgerWriter.prove_unfenced``), and the next."""
        if self.world.now < 0.4:
            self.world.at(self.world.rng.uniform(0.0005, 0.004), self._probe)
        target = self.writer.fence_probe_target
        if target is None:
            return
        ensemble, quorum, regions = target
        probe = self.probe_class(quorum, regions)
        sent_at = self.world.now

        def answer(slot: int, result: LacResult | None, status: Status) -> None:
            if probe.verdict is not Verdict.PENDING:
                return
            if status is Status.OK and result is not None:
                verdict = probe.on_answer(slot, result.fenced)
            else:
                verdict = probe.on_failure(slot)
            if verdict is Verdict.PROVEN:
                self.result.probes_proven += 1
                if self.fenced_at is not None and self.fenced_at <= sent_at:
                    self.violation(
                        f"a fence probe sent at t={sent_at * 1000:.3f}ms proved the ledger unfenced; "
                        f"fencing had completed at t={self.fenced_at * 1000:.3f}ms"
                    )
            elif verdict is Verdict.UNPROVEN and self.fenced_at is not None and self.fenced_at <= sent_at:
                self.result.probes_unproven_after_fence += 1

        for slot, bookie_id in enumerate(ensemble):
            self.transport.read_lac(bookie_id, LEDGER_ID, False, b"",
                                    lambda result, status, slot=slot: answer(slot, result, status))

    def _heal(self) -> None:
        self.net.drop_p = 0.0
        for bookie in self.bookies.values():
            bookie.restart()

    def _schedule_faults(self) -> None:
        rng = self.world.rng
        for _ in range(rng.choice([0, 1, 2, 3])):
            bookie = self.bookies[rng.choice(self.bookie_ids)]
            at = rng.uniform(0.0, 0.08)
            self.world.at(at, bookie.crash)
            self.world.at(at + rng.uniform(0.002, 0.04), bookie.restart)
        if rng.random() < 0.25:
            # Power failure: every bookie crashes at once, losing what it had not fsynced.
            at = rng.uniform(0.0, 0.05)
            back = at + rng.uniform(0.002, 0.02)
            for bookie in self.bookies.values():
                self.world.at(at, bookie.crash)
                self.world.at(back, bookie.restart)
        if self.md.ack_quorum_size >= 2 and rng.random() < 0.3:
            # One bit flip at rest, on one copy: within the fault model (Qa >= 2 copies).
            bookie = self.bookies[rng.choice(self.bookie_ids)]
            self.world.at(rng.uniform(0.0, 0.1), bookie.corrupt_one, LEDGER_ID)

    # --- the run ---------------------------------------------------------------------
    def run(self) -> SimResult:
        world = self.world
        rng = world.rng
        if not self.race:
            self._schedule_faults()
        world.at(0.0, self._append_some)
        if self.probes:
            world.at(0.0005, self._probe)
        first_recovery = rng.uniform(0.0003, 0.006) if self.race else rng.uniform(0.002, 0.08)
        for _ in range(rng.choice([1, 1, 2, 3])):
            world.at(first_recovery + rng.uniform(0.0, 0.004), self._start_recovery)
        world.at(self.heal_at, self._heal)
        world.run(2.0, after_event=self._check_bookies)
        if not self.recovered:
            self.violation("no recovery completed")
        self._final_checks()
        self.result.confirmed = self.confirmed_last
        self.result.events = world.events
        self.result.ensemble_changes = len(self.meta.record.ensembles) - 1
        return self.result

    def _read_all(self, record: LedgerMetadata, order_seed: int) -> list[Entry] | None:
        got, failure = read_ledger(self.world, record, self.transport, self.meta, ledger_id=LEDGER_ID,
                                   digest=self.digest, master_key=self.key, order_seed=order_seed)
        if failure is not None:
            self.violation(f"reader failed on the closed ledger: {failure}")
            return None
        return got

    def _final_checks(self) -> None:
        record = self.meta.record
        for problem in closed_ledger_problems(record, self.recovered, self.confirmed_last):
            self.violation(problem)
        if record.state is not LedgerState.CLOSED:
            return
        last = int(record.last_entry_id)
        self.result.closed_last = last
        if self.fenced_at is not None:
            late = [e for e, t in self.confirm_times.items() if t > self.fenced_at and e > last]
            if late:
                self.violation(
                    f"fenced writer got confirmations {late[:5]} after fencing completed "
                    f"(t={self.fenced_at * 1000:.3f}ms) beyond the closed end {last}"
                )
        readers = [self._read_all(record, self.seed * 7919 + i) for i in range(2)]
        if any(r is None for r in readers):
            return
        expected_length = 0
        for i, entries in enumerate(readers):
            assert entries is not None
            if [e.entry_id for e in entries] != list(range(last + 1)):
                self.violation(f"reader {i} got entries {[e.entry_id for e in entries][:10]}...")
                continue
            for e in entries:
                payload = self.payloads.get(e.entry_id)
                if payload is None or payload != e.payload:
                    self.violation(f"reader {i}: entry {e.entry_id} holds bytes never appended")
            if entries:
                expected_length = entries[-1].length
        a, b = readers
        assert a is not None and b is not None
        # The shared checkers of scriba.testing (log + acknowledged set) over the same run.
        confirmed = {e: self.payloads[e] for e in range(self.confirmed_last + 1)}
        log_result = check_log(
            [
                LogRead.from_values(f"reader{i}", [x.payload for x in r], closed_last=last)
                for i, r in enumerate((a, b))
            ],
            confirmed,
            attempted=list(self.payloads.values()),
            closed_last=last,
        )
        if not log_result.ok:
            self.violation(log_result.explain())
        acked = check_acked_set(self.payloads.values(), confirmed.values(), [x.payload for x in a])
        if not acked.ok:
            self.violation(acked.explain())
        if [x.payload for x in a] != [x.payload for x in b]:
            self.violation("readers disagree on the ledger's bytes")
        if last >= 0 and record.length != expected_length:
            self.violation(f"closed length {record.length} != last entry's length {expected_length}")
        appended_length = sum(len(self.payloads[e]) for e in range(last + 1) if e in self.payloads)
        if record.length != appended_length:
            self.violation(
                f"closed length {record.length} != {appended_length}, the sum of the payloads "
                f"appended through entry {last}"
            )


def run_seed(
    seed: int, *, fencing: bool = True, race: bool = False, ack_early: bool = False,
    writer_fault: str = "", probes: bool = False, probe_fault: str = "",
) -> SimResult:
    return Run(
        seed, fencing=fencing, race=race, ack_early=ack_early, writer_fault=writer_fault,
        probes=probes, probe_fault=probe_fault,
    ).run()

