"""One seeded run of the synchronous geo mode: a whole region is lost during appends.

Bookies sit in three regions (east, west, north). The ledger records
``min_regions_for_durability = 2`` over an ensemble whose write sets span two regions
but whose ack quorum fits inside one (``E,E,W`` with ``Qa = 2``, and similar shapes the
seed draws): placement alone would let an entry be confirmed by one region. Faults:
dropped messages, a transient crash of a bookie outside the *doomed* region (so for a
while only the doomed region answers), then every bookie of the doomed region crashes
and loses its disk for good. Recoverers then fence, recover and close the ledger from
what the surviving regions hold, and two readers read it.

Checks: every confirmed entry is read back (the acked-set checker: lost = confirmed -
read, unexpected = read - appended), the log checker over both readers, and the
recoverers and the record agree on the last entry.

Negative control: ``region_check=False`` runs a writer whose ack rule ignores regions
(counts only, as before the synchronous mode); the checkers must report a loss.

Replay: ``SCRIBA_SIM_SEED=123 .venv/bin/pytest tests/sim/test_sim_regions.py -k replay``
(add ``SCRIBA_SIM_REGION_CHECK=0`` for the negative control).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scriba.client.recovery_core import RecoveryCore
from scriba.client.write_core import ChooseReplacement, WriteConfig, WriteCore
from scriba.client.writer_state import WriterState
from scriba.entry import Entry, make_digest, master_key
from scriba.errors import NotEnoughBookiesError, ScribaError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.records import Ensemble, LedgerMetadata, LedgerState
from scriba.testing.checkers import LogRead, check_acked_set, check_log
from scriba.testing.sim import (
    Net,
    SeedReport,
    SimBookie,
    SimDriver,
    SimMeta,
    SimTransport,
    World,
    closed_ledger_problems,
    read_ledger,
)

LEDGER_ID = 3
PASSWORD = b"geo"
REGION_OF: dict[str, str] = {
    "e1": "east", "e2": "east", "e3": "east",
    "w1": "west", "w2": "west", "w3": "west",
    "n1": "north", "n2": "north",
}
# (E, W, A) with A >= 2; each ensemble is drawn so every write set spans 2 regions while
# an ack quorum can sit inside one (the ack rule is what keeps 2 regions).
QUORUMS = [(3, 3, 2), (4, 4, 2), (4, 3, 2), (5, 5, 3), (4, 4, 3)]


@dataclass
class RegionResult(SeedReport):
    confirmed: int = -1
    closed_last: int | None = None
    lost: int = 0
    ensemble_changes: int = 0
    writer_error: str = ""
    region_check: bool = True

    def __post_init__(self) -> None:
        self.replay_target = "tests/sim/test_sim_regions.py -k replay"
        if not self.region_check:
            self.replay_env = {"SCRIBA_SIM_REGION_CHECK": "0"}


class _RegionBlindWriteCore(WriteCore):
    """Negative control: the ack rule counts acks only (the region table is dropped)."""

    def _set_ensemble(self, ensemble: Ensemble) -> None:
        super()._set_ensemble(ensemble)
        self._regions = None


def _draw_ensemble(world: World, e: int, w: int, a: int) -> tuple[Ensemble, str]:
    """An ensemble whose write sets all span 2 regions while some ack quorum fits in one
    region (the doomed one, returned too)."""
    rng = world.rng
    names = sorted(REGION_OF)
    for _ in range(10_000):
        doomed = rng.choice(["east", "west"])
        heavy = [b for b in names if REGION_OF[b] == doomed]
        others = [b for b in names if REGION_OF[b] != doomed]
        k = rng.randint(min(a, e - 1), min(len(heavy), e - 1))
        chosen = rng.sample(heavy, k) + rng.sample(others, e - k)
        rng.shuffle(chosen)
        ensemble = tuple(BookieId(b) for b in chosen)
        slots = [(s + i) % e for s in range(e) for i in range(w)]
        sets = [slots[s * w:(s + 1) * w] for s in range(e)]
        spans = all(len({REGION_OF[chosen[i]] for i in ws}) >= 2 for ws in sets)
        weak = any(sum(REGION_OF[chosen[i]] == doomed for i in ws) >= a for ws in sets)
        if spans and weak:
            return ensemble, doomed
    raise AssertionError("no ensemble drawn")


class RegionRun:
    def __init__(self, seed: int, *, region_check: bool = True) -> None:
        self.seed = seed
        world = self.world = World(seed)
        rng = world.rng
        e, w, a = rng.choice(QUORUMS)
        self.bookie_ids = [BookieId(b) for b in sorted(REGION_OF)]
        self.bookies = {b: SimBookie(world, b) for b in self.bookie_ids}
        self.net = Net(world, delay_s=(0.00005, rng.choice([0.0005, 0.002])),
                       drop_p=rng.choice([0.0, 0.0, 0.01]))
        self.transport = SimTransport(world, self.net, self.bookies, add_timeout_s=0.02,
                                      read_timeout_s=0.02)
        ensemble, self.doomed = _draw_ensemble(world, e, w, a)
        self.md = LedgerMetadata(
            ledger_id=LedgerId(LEDGER_ID), ensemble_size=e, write_quorum_size=w,
            ack_quorum_size=a, ensembles=((EntryId(0), ensemble),),
            min_regions_for_durability=2,
            bookie_regions={b: REGION_OF[b] for b in ensemble},
        )
        self.meta = SimMeta(world, self.md, delay_s=(0.0002, 0.003))
        self.digest = make_digest("crc32c", PASSWORD)
        self.key = master_key(PASSWORD)
        self.lost_region = False
        self.result = RegionResult(seed, region_check=region_check)
        self.n_entries = rng.randint(20, 80)
        core_type = WriteCore if region_check else _RegionBlindWriteCore
        self.writer = core_type(
            self.md, digest=self.digest, choose_replacement=self._live_spare(),
            config=WriteConfig(entries_inflight_max=rng.choice([4, 16, 64]),
                               ensemble_changes_max=24, replacement_retry_s=0.01),
            region_of=lambda b: REGION_OF.get(b),
        )
        self.writer_driver = SimDriver(
            world, self.writer, self.transport, self.meta, ledger_id=LEDGER_ID,
            master_key=self.key, on_complete=self._on_complete, on_fail=self._on_fail,
            ack_window_s=0.0005 if seed % 2 == 0 else None,
        )
        self.payloads: dict[int, bytes] = {}
        self.appended = 0
        self.confirmed_last = -1
        self.recovered: list[LedgerMetadata] = []
        self.result.description = (
            f"E{e}/W{w}/A{a} R2, ensemble {'/'.join(f'{b}@{REGION_OF[b]}' for b in ensemble)}, "
            f"losing {self.doomed}, drop_p={self.net.drop_p}, {self.n_entries} appends"
            f"{'' if region_check else ', REGION CHECK OFF'}"
        )

    def _live_spare(self) -> ChooseReplacement:
        """Placement's stand-in: any live bookie not excluded (a registry drops the dead)."""

        def choose(ensemble: tuple[BookieId, ...], index: int, exclude: frozenset[BookieId]) -> BookieId:
            candidates = [b for b in self.bookie_ids if b not in exclude and self.bookies[b].up]
            if not candidates:
                raise NotEnoughBookiesError("sim: no live spare bookie")
            return self.world.rng.choice(candidates)

        return choose

    def violation(self, text: str) -> None:
        self.result.violations.append(f"t={self.world.now * 1000:.3f}ms {text}")

    def _on_complete(self, first: int, last: int) -> None:
        if first != self.confirmed_last + 1:
            self.violation(f"confirmations out of order: {first}..{last} after {self.confirmed_last}")
        self.confirmed_last = max(self.confirmed_last, last)

    def _on_fail(self, first: int, last: int, error: ScribaError) -> None:
        self.result.writer_error = type(error).__name__

    # --- actors --------------------------------------------------------------------------
    def _append_some(self) -> None:
        w = self.writer
        while self.appended < self.n_entries and w.state is WriterState.OPEN:
            payload = b"geo%d-%d-" % (self.seed, self.appended) + b"y" * self.world.rng.randint(0, 30)
            sent = w.append(payload)
            if sent is None:
                break
            self.payloads[sent[0]] = payload
            self.appended += 1
            self.writer_driver.send_add(*sent)
            if self.world.rng.random() < 0.3:
                break
        if self.appended < self.n_entries and w.state is WriterState.OPEN:
            self.world.at(self.world.rng.uniform(0.0001, 0.001), self._append_some)

    def _lose_region(self) -> None:
        self.lost_region = True
        for bookie in self.bookies.values():
            if REGION_OF[bookie.bookie_id] == self.doomed:
                bookie.crash()
                bookie.ledgers.clear()  # the disk is gone with the region

    def _start_recovery(self, attempt: int = 0) -> None:
        core = RecoveryCore(self.meta.record, digest=self.digest,
                            choose_replacement=self._live_spare(), region_of=REGION_OF.get)

        def failed(error: ScribaError) -> None:
            if attempt < 60:
                self.world.at(0.01, self._start_recovery, attempt + 1)
            else:
                self.violation(f"recovery never succeeded: {error}")

        driver = SimDriver(
            self.world, core, self.transport, self.meta, ledger_id=LEDGER_ID,
            master_key=self.key, on_done=lambda r: self.recovered.append(r),  # type: ignore[arg-type]
            on_failed=failed,
        )
        driver.execute(core.start())

    def _schedule_faults(self) -> float:
        rng = self.world.rng
        loss_at = rng.uniform(0.002, 0.03)
        if rng.random() < 0.7:
            # For a while only the doomed region answers: a write-set bookie elsewhere
            # stops (and comes back later), so confirmations must wait for a replacement.
            outside = [b for b in self.md.current_ensemble if REGION_OF[b] != self.doomed]
            victim = self.bookies[rng.choice(outside)]
            down_at = max(0.0, loss_at - rng.uniform(0.001, 0.015))
            self.world.at(down_at, victim.crash)
            self.world.at(loss_at + rng.uniform(0.01, 0.05), victim.restart)
        self.world.at(loss_at, self._lose_region)
        return loss_at

    # --- the run ---------------------------------------------------------------------------
    def run(self) -> RegionResult:
        world = self.world
        loss_at = self._schedule_faults()
        world.at(0.0, self._append_some)
        for _ in range(world.rng.choice([1, 2])):
            world.at(loss_at + world.rng.uniform(0.0, 0.05), self._start_recovery)
        world.at(0.15, lambda: setattr(self.net, "drop_p", 0.0))
        world.run(3.0)
        if not self.recovered:
            self.violation("no recovery completed")
        self._final_checks()
        self.result.confirmed = self.confirmed_last
        self.result.ensemble_changes = len(self.meta.record.ensembles) - 1
        return self.result

    def _read_all(self, record: LedgerMetadata, order_seed: int) -> list[Entry] | None:
        got, failure = read_ledger(self.world, record, self.transport, self.meta, ledger_id=LEDGER_ID,
                                   digest=self.digest, master_key=self.key, order_seed=order_seed, run_s=3.0)
        if failure is not None:
            # A confirmed entry whose every copy was in the lost region is unreadable: a loss.
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
        self.result.lost = max(0, self.confirmed_last - last)
        readers = [self._read_all(record, self.seed * 7919 + i) for i in range(2)]
        confirmed = {e: self.payloads[e] for e in range(self.confirmed_last + 1)}
        reads: list[Any] = [r for r in readers if r is not None]
        for entries in reads:
            acked = check_acked_set(self.payloads.values(), confirmed.values(),
                                    [x.payload for x in entries])
            if not acked.ok:
                self.violation(acked.explain())
        if len(reads) == 2:
            log_result = check_log(
                [LogRead.from_values(f"reader{i}", [x.payload for x in r], closed_last=last)
                 for i, r in enumerate(reads)],
                confirmed, attempted=list(self.payloads.values()), closed_last=last,
            )
            if not log_result.ok:
                self.violation(log_result.explain())


def run_region_seed(seed: int, *, region_check: bool = True) -> RegionResult:
    return RegionRun(seed, region_check=region_check).run()
