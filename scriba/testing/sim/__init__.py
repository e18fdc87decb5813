"""The simulation kit: run a core under seeded faults in one process, no bookies, no sockets.

Scriba's cores (the ledger write path, recovery and reads today; the stream's segment
rules, the RSM's leader state and geo replication next) take events and return
effects, with no I/O inside. This kit is the world they run in under test: one seed
drives the network, the bookies, the metadata store and the clock, so a run is a pure
function of its seed, and a failing seed replays exactly (FoundationDB's simulation
and TigerBeetle's VOPR work this way).

What is in it:

- ``World`` (``world.py``): simulated time, an event heap, the seeded ``rng`` (every
  random choice comes from it) and ``clock`` (a ``scriba.clock.Clock`` on simulated
  time); ``run(until_s, after_event=check)`` runs your checker after every event.
- ``Net``: seeded delays (messages reorder) and drops (``drop_p``; set it to 0 to heal).
- ``SimBookie``: a bookie with a journal that acknowledges only after a simulated
  fsync; ``crash()`` loses what was not fsynced, ``restart()``, ``corrupt_one()``
  flips a bit at rest. Negative controls: ``fencing=False``, ``ack_before_fsync=True``.
- ``SimMeta``: one versioned record with a compare-and-set loop (delays between read
  and write, as ``scriba.meta.update_metadata`` runs it); one per ledger.
- ``SimTransport``: the client's side of the network (one answer per request, a
  TIMEOUT when none came in time).
- ``SimDriver``: carries out the ledger cores' effects (``SendAdd``, ``ReadLac``,
  ``ReadEntries``, ``WriteMetadata``, ``StartTimer``, ...) in the world and feeds the
  answers back; ``send_add`` sends an appended entry as ``LedgerWriter`` does.
  ``any_spare`` is a seeded placement stand-in for ``WriteCore``.
- ``SeedReport``, ``check_seeds``, ``replay_seed`` (``seeds.py``): many seeds, each
  failure printed with the command that replays it.
- ``StorageTransport``, ``register_bookies`` (``memory.py``): in-process bookies
  behind the real ``BookieTransport`` interface, for the asyncio ``Client`` itself
  (not seeded: asyncio schedules it; use it to test drivers and the public API fast).

To simulate a core of your own: write one function ``seed -> SeedReport`` that builds
the world from the seed, starts your core, schedules faults with ``world.at`` (inside
the fault model your design claims to tolerate), runs the world with a checker after
every event, and checks the end state. Your core's ledger effects go through
``SimDriver``; effects of your own get a small driver like it (each one becomes a
``world.at`` / ``net.send`` whose answer calls your core's input method, then runs
the effects that returns). Then run it over many seeds, plus one random seed per run
printed for replay, and keep a negative control: a deliberately broken mode that the
checker must catch.

Example (a whole run; ``tests/sim/test_sim_kit.py`` executes this very text)::

    from scriba.client.write_core import WriteConfig, WriteCore
    from scriba.client.writer_state import WriterState
    from scriba.entry import make_digest, master_key
    from scriba.ids import BookieId, EntryId, LedgerId
    from scriba.meta.records import LedgerMetadata
    from scriba.testing.sim import (
        Net, SeedReport, SimBookie, SimDriver, SimMeta, SimTransport, World, any_spare,
        check_seeds,
    )

    def run(seed: int) -> SeedReport:
        world = World(seed)
        ids = [BookieId(f"b{i}") for i in range(4)]
        bookies = {b: SimBookie(world, b) for b in ids}
        net = Net(world, delay_s=(0.0001, 0.002), drop_p=0.01)
        transport = SimTransport(world, net, bookies, add_timeout_s=0.02, read_timeout_s=0.02)
        md = LedgerMetadata(
            ledger_id=LedgerId(1), ensemble_size=3, write_quorum_size=3, ack_quorum_size=2,
            ensembles=((EntryId(0), tuple(world.rng.sample(ids, 3))),),
        )
        core = WriteCore(md, digest=make_digest("crc32c", b""),
                         choose_replacement=any_spare(world, ids),
                         config=WriteConfig(entries_inflight_max=8))
        report = SeedReport(seed, description="E3/W3/A2, 1% drops, one crash")
        confirmed: list[int] = []
        driver = SimDriver(
            world, core, transport, SimMeta(world, md, delay_s=(0.0002, 0.002)),
            ledger_id=1, master_key=master_key(b""),
            on_complete=lambda first, last: confirmed.extend(range(first, last + 1)),
        )

        def append_some() -> None:
            while core.next_entry_id < 50 and core.state is WriterState.OPEN:
                sent = core.append(b"entry %d" % core.next_entry_id)
                if sent is None:  # in-flight bounds reached: wait for answers
                    break
                driver.send_add(*sent)
            if core.next_entry_id < 50 and core.state is WriterState.OPEN:
                world.at(0.001, append_some)

        def check() -> None:  # after every event
            if confirmed != list(range(len(confirmed))):
                report.violations.append(f"t={world.now:.4f}: out of order {confirmed[-5:]}")

        world.at(0.0, append_some)
        crashed = bookies[world.rng.choice(ids)]
        world.at(world.rng.uniform(0.0, 0.02), crashed.crash)
        world.at(0.1, crashed.restart)
        world.at(0.1, setattr, net, "drop_p", 0.0)  # heal
        world.run(2.0, after_event=check)
        if len(confirmed) != 50:
            report.violations.append(f"confirmed {len(confirmed)} of 50 ({core.error})")
        return report

    check_seeds(run, range(20))  # raises, listing each failing seed and its replay
"""

from scriba.testing.sim.memory import InProcessSite, StorageTransport, register_bookies
from scriba.testing.sim.seeds import (
    SEED_ENV,
    SeedReport,
    check_seeds,
    env_flag,
    random_seed,
    replay_seed,
    run_seeds,
)
from scriba.testing.sim.world import (
    Net,
    SimBookie,
    SimClock,
    SimDriver,
    SimMeta,
    SimTransport,
    World,
    any_spare,
    closed_ledger_problems,
    read_ledger,
)

__all__ = [
    "SEED_ENV",
    "InProcessSite",
    "Net",
    "SeedReport",
    "SimBookie",
    "SimClock",
    "SimDriver",
    "SimMeta",
    "SimTransport",
    "StorageTransport",
    "World",
    "any_spare",
    "check_seeds",
    "closed_ledger_problems",
    "env_flag",
    "random_seed",
    "read_ledger",
    "register_bookies",
    "replay_seed",
    "run_seeds",
]
