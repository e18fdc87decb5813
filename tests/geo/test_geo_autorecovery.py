"""Autorecovery keeps the synchronous geo mode's region rule, by the ledger's own record.

A ``region-aware`` ledger with ``min_regions_for_durability = 2`` counts regions in its
ack rule and in recovery from the record's ``bookie_regions``. When a replication worker
moves a segment off a lost bookie, the new ensemble must still span the regions *by that
record*, and the record must name the new bookie's region (else a later recovery counts
it toward no region). Checked in the planning core (with a region-blind policy, which the
rule alone must stop) and end to end with the auditor and a worker on in-process bookies:
the repaired ledger spans both regions, ``bookie_regions`` names exactly its ensembles'
bookies, and a recovery-open of it succeeds; the negative control (the only spares are in
the region that already holds the rest) is refused with ``NotEnoughBookiesError`` naming
``min_regions_for_durability``, and the ledger is left as it was, its mark kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from scriba.autorecovery.auditor import Auditor
from scriba.autorecovery.config import AutorecoveryConfig
from scriba.autorecovery.marks import references
from scriba.autorecovery.plan import ensemble_change, plan_repair
from scriba.autorecovery.records import UNDERREPLICATED_PREFIX, UnderReplicated
from scriba.autorecovery.replicas import check_replicas
from scriba.autorecovery.worker import ReplicationWorker
from scriba.client import Client
from scriba.embedded.process import ServerProcess, python_module_argv
from scriba.entry import make_digest, master_key
from scriba.errors import NotEnoughBookiesError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta import connect
from scriba.meta.records import (
    BookieRegistration,
    LedgerMetadata,
    LedgerState,
    bookie_key,
    ledger_key,
)
from scriba.meta.store import MetadataStore
from scriba.placement import BookieNode, Topology, make_policy
from scriba.testing.cluster import LocalCluster
from scriba.testing.sim import StorageTransport
from scriba.testing.waiting import eventually

PASSWORD = b"pw"
REGION_OF = {"e1": "east", "e2": "east", "e3": "east", "w1": "west", "w2": "west", "w3": "west"}
FAST = AutorecoveryConfig(
    lost_bookie_recovery_delay_s=0, audit_tick_s=0.05, worker_poll_s=0.05, worker_retry_s=0.05,
    check_interval_s=3600, passwords=(PASSWORD,), open_ledger_grace_s=3600,
)
RULE = {"min_regions_for_durability": 2, "ack_rule_only": True}


def record(ensemble: tuple[str, ...], regions: dict[str, str] | None = None,
           regions_min: int = 2) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=LedgerId(9), ensemble_size=3, write_quorum_size=3, ack_quorum_size=2,
        ensembles=((EntryId(0), tuple(BookieId(b) for b in ensemble)),),
        last_entry_id=EntryId(19), state=LedgerState.CLOSED,
        placement_policy="region-aware", placement_options=RULE, min_regions_for_durability=regions_min,
        bookie_regions=regions if regions is not None else {b: REGION_OF[b] for b in ensemble},
    )


def topology(*bookies: str) -> Topology:
    return Topology.from_nodes(
        BookieNode.at(BookieId(b), f"/{REGION_OF[b]}/z{i}/k{i}", free_bytes=1 << 30) for i, b in enumerate(bookies)
    )


# --- the planning core ------------------------------------------------------------------
def test_a_replacement_records_its_region_and_the_moved_bookie_leaves_the_map() -> None:
    md = record(("e1", "e2", "w1"))
    plan = plan_repair(md, 0, {BookieId("w1")}, topology=topology("e1", "e2", "e3", "w2"),
                       policy=make_policy("region-aware", RULE))
    assert plan is not None and plan.added == ("w2",) and dict(plan.regions) == {"w2": "west"}
    needs_update, transform = ensemble_change(plan)
    assert needs_update(md)
    after = transform(md)
    assert after.ensembles == ((0, ("e1", "e2", "w2")),)
    assert after.bookie_regions == {"e1": "east", "e2": "east", "w2": "west"}  # exact: w1 is gone


def test_a_region_blind_replacement_is_refused_by_the_record_rule() -> None:
    """The only spare is in the east: a region-blind policy (a worker that does not know the
    ledger's policy falls back to ``random``) would put the whole write set in one region."""
    md = record(("e1", "e2", "w1"))
    live = topology("e1", "e2", "e3")
    with pytest.raises(NotEnoughBookiesError, match="min_regions_for_durability=2 cannot be met"):
        plan_repair(md, 0, {BookieId("w1")}, topology=live, policy=make_policy("random"))
    # the control: the same repair of a ledger whose record does not count regions goes ahead
    loose = record(("e1", "e2", "w1"), regions={}, regions_min=1)
    plan = plan_repair(loose, 0, {BookieId("w1")}, topology=live, policy=make_policy("random"))
    assert plan is not None and plan.added == ("e3",) and plan.regions == ()


def test_a_segment_already_short_of_regions_can_still_move_off_a_lost_bookie() -> None:
    """A record that lacks a bookie's region (written before regions were recorded on
    repair) breaks the rule already: moving off a lost bookie is not held back by it, and
    the move records the region it can."""
    md = record(("e1", "e2", "w1"), regions={"e1": "east", "e2": "east"})  # w1's region unknown
    plan = plan_repair(md, 0, {BookieId("e2")}, topology=topology("e1", "e3", "w1"),
                       policy=make_policy("random"))
    assert plan is not None and plan.added == ("e3",)
    assert ensemble_change(plan)[1](md).bookie_regions == {"e1": "east", "e3": "east"}


# --- auditor and worker end to end (in-process bookies) ---------------------------------
async def wait_async(cond: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 30.0) -> None:
    await eventually(cond, timeout_s, what=what, interval_s=0.02)


@contextlib.asynccontextmanager
async def region_world() -> AsyncIterator[tuple[MetadataStore, StorageTransport, Client]]:
    store = await connect(f"memory://geo-ar-{uuid.uuid4().hex[:8]}")
    for i, (b, region) in enumerate(sorted(REGION_OF.items())):
        registration = BookieRegistration(
            bookie_id=BookieId(b), address=f"memory:{b}", region=region, zone=f"z{i}", rack=f"k{i}",
            free_bytes=1 << 40, total_bytes=1 << 40,
        )
        await store.create(bookie_key(b), registration.to_bytes(), ephemeral=True)
    transport = StorageTransport(sorted(REGION_OF))
    try:
        async with Client.connect(store.uri, store=store, transport=transport, placement="region-aware",
                                  placement_options=RULE) as client:
            yield store, transport, client
    finally:
        await transport.close()
        await store.close()


async def lose(store: MetadataStore, transport: StorageTransport, client: Client, bookie: str) -> None:
    transport.down.add(BookieId(bookie))
    await store.delete(bookie_key(bookie))

    async def gone() -> bool:
        return bookie not in client.registry.registrations
    await wait_async(gone, f"the registry saw {bookie} go")


async def write_region_ledger(client: Client) -> tuple[LedgerMetadata, str]:
    """A closed region-aware ledger, and the bookie of its ensemble alone in its region."""
    writer = await client.create_ledger(3, 3, 2, password=PASSWORD)
    await asyncio.gather(*[writer.append_async(b"entry-%d" % i) for i in range(40)])  # pipelined, in order
    await writer.append(b"last")
    await writer.close()
    md = await client.ledger_metadata(writer.ledger_id)
    ensemble = md.current_ensemble
    assert len({REGION_OF[b] for b in ensemble}) == 2
    (alone,) = [b for b in ensemble if sum(REGION_OF[x] == REGION_OF[b] for x in ensemble) == 1]
    return md, alone


async def run_repairs(client: Client, done: Callable[[], Awaitable[bool]], what: str) -> ReplicationWorker:
    auditor = Auditor(client, FAST, candidate="a1")
    worker = ReplicationWorker(client, FAST)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(auditor.run(stop)), asyncio.create_task(worker.run(stop))]
    try:
        await wait_async(done, what)
    finally:
        stop.set()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(t, 10)
    return worker


async def test_a_lost_bookie_is_replaced_in_its_own_region_and_recorded() -> None:
    async with region_world() as (store, transport, client):
        md, victim = await write_region_ledger(client)
        await lose(store, transport, client, victim)

        async def repaired() -> bool:
            current = await client.ledger_metadata(md.ledger_id)
            return not references(current, BookieId(victim)) and not await store.list(UNDERREPLICATED_PREFIX)
        worker = await run_repairs(client, repaired, "the ledger moved off the lost bookie")
        after = await client.ledger_metadata(md.ledger_id)
        assert sum(o.entries for o in worker.outcomes) == 41
        bookies = {b for _first, ensemble in after.ensembles for b in ensemble}
        assert after.bookie_regions == {b: REGION_OF[b] for b in bookies}  # exact: the victim left it
        for _first, ensemble in after.ensembles:
            assert len({after.bookie_regions[b] for b in ensemble}) == 2, after.ensembles
        digest = make_digest("crc32c", PASSWORD)
        assert await check_replicas(transport, after, digest=digest, master_key=master_key(PASSWORD)) == []
        # The record's regions are what a recovery counts: the new bookie's counts toward its region.
        assert after.slot_regions(after.current_ensemble) is not None
        assert after.slot_regions(after.current_ensemble).count((1 << 3) - 1) == 2  # type: ignore[union-attr]
        reader = await client.open_ledger(md.ledger_id, PASSWORD)
        got = [e.payload async for e in reader.read(0, after.last_entry_id)]
        assert got == [b"entry-%d" % i for i in range(40)] + [b"last"]


async def test_a_replacement_that_would_break_the_rule_is_refused_and_the_mark_kept() -> None:
    """Negative control: the victim's region has no spare left, so the only bookie free is
    in the region that holds the rest. A worker that does not know the ledger's policy (an
    unknown name: it falls back to the region-blind ``random``) is stopped by the record's
    rule; the region-aware policy refuses it too. Either way nothing moves."""
    async with region_world() as (store, transport, client):
        md, victim = await write_region_ledger(client)
        spare_same_region = [b for b in REGION_OF if REGION_OF[b] == REGION_OF[victim]
                             and b not in md.current_ensemble]
        for b in spare_same_region:
            await lose(store, transport, client, b)
        raw = await store.get(ledger_key(md.ledger_id))
        blind = raw.value.replace(b'"region-aware"', b'"region-aware-from-the-future"')
        await store.set(ledger_key(md.ledger_id), blind, expected_version=raw.version)
        await lose(store, transport, client, victim)
        spares = [b for b in client.registry.registrations if b not in md.current_ensemble]
        assert spares and all(REGION_OF[b] != REGION_OF[victim] for b in spares), spares
        worker = ReplicationWorker(client, FAST)

        async def marked() -> bool:
            return bool(await store.list(UNDERREPLICATED_PREFIX))
        auditor = Auditor(client, FAST, candidate="a1")
        stop = asyncio.Event()
        task = asyncio.create_task(auditor.run(stop))
        try:
            await wait_async(marked, "the auditor marked the ledger")
        finally:
            stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 10)
        outcome = await worker.process(md.ledger_id)
        assert outcome.state == "deferred", outcome
        assert "min_regions_for_durability=2 cannot be met" in outcome.detail, outcome.detail
        after = await client.ledger_metadata(md.ledger_id)
        assert after.ensembles == md.ensembles and after.bookie_regions == md.bookie_regions
        (_key, raw_record), = await store.list(UNDERREPLICATED_PREFIX)
        assert any(m.bookie_id == victim for m in UnderReplicated.from_bytes(raw_record.value).marks)
        # The ledger's own (region-aware) policy refuses as well, naming the rule.
        with pytest.raises(NotEnoughBookiesError, match="min_regions_for_durability"):
            plan_repair(after, 0, {BookieId(victim)}, topology=client.registry.topology(),
                        policy=make_policy("region-aware", RULE))


# --- real processes: bookies in two regions, a ``scriba autorecovery run`` process -------
@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_real_processes_replace_a_lost_bookie_within_its_region(tmp_path: Path) -> None:
    """Six bookie processes over two regions; the bookie alone in its region in a
    region-aware ledger's ensemble is SIGKILLed: the autorecovery process re-replicates
    the ledger onto a bookie of that region and records it. Then that region loses every
    bookie but the new one, and the new one too: the only spares left are in the other
    region, so the repair is refused naming the rule (the worker's log says so) and the
    ledger keeps its ensemble and its mark."""
    session_s = "2"
    with LocalCluster(tmp_path / "cluster") as cluster:
        procs = cluster.bookies.start_bookies(6, regions=["east", "west"], zones=["z1", "z2", "z3"],
                                              extra_args=["--session-timeout-s", session_s])
        region_of = {p.bookie_id: p.region for p in procs}
        by_id = {p.bookie_id: i for i, p in enumerate(procs)}
        argv = python_module_argv(
            "scriba.cli", "--log-level", "info", "autorecovery", "--metadata", cluster.uri, "run", "--id", "w1",
            "--password", PASSWORD.decode(), "--delay-s", "1", "--tick-s", "0.2", "--claim-ttl-s", session_s,
            "--open-ledger-grace-s", "3", "--check-interval-s", "3600")
        worker = ServerProcess("autorecovery w1", argv, tmp_path / "w1.log")
        worker.start()
        try:
            async with Client.connect(cluster.uri, placement="region-aware", placement_options=RULE) as client:
                writer = await client.create_ledger(3, 3, 2, password=PASSWORD)
                await asyncio.gather(*[writer.append_async(b"p-%d" % i) for i in range(100)])
                await writer.close()
                md = await client.ledger_metadata(writer.ledger_id)
                ensemble = md.current_ensemble
                (victim,) = [b for b in ensemble if sum(region_of[x] == region_of[b] for x in ensemble) == 1]
                cluster.bookies.kill(by_id[victim])

                async def repaired() -> bool:
                    now = await client.ledger_metadata(md.ledger_id)
                    return not references(now, BookieId(victim)) and not await client.store.list(UNDERREPLICATED_PREFIX)
                await eventually(repaired, 120, what="the ledger re-replicated off the SIGKILLed bookie")
                after = await client.ledger_metadata(md.ledger_id)
                (added,) = set(after.current_ensemble) - set(ensemble)
                assert region_of[added] == region_of[victim]
                assert after.bookie_regions == {b: region_of[b] for b in after.current_ensemble}
                assert await check_replicas(client.transport, after, digest=make_digest("crc32c", PASSWORD),
                                            master_key=master_key(PASSWORD)) == []
                # negative control: the region's last bookies go too; only the other region has spares
                doomed = [b for b in region_of if region_of[b] == region_of[victim] and b != victim]
                refusals = _refusals(worker.log_path)
                for b in doomed:
                    cluster.bookies.kill(by_id[b])
                await eventually(lambda: _refusals(worker.log_path) > refusals, 120,
                                 what="the worker refused a repair naming min_regions_for_durability")
                kept = await client.ledger_metadata(md.ledger_id)
                assert kept.ensembles == after.ensembles and kept.bookie_regions == after.bookie_regions
                assert await client.store.list(UNDERREPLICATED_PREFIX)  # the mark waits for a bookie
        finally:
            worker.stop()


def _refusals(path: Path) -> int:
    """The worker's deferred repairs that name the region rule, so far."""
    text = path.read_text(errors="replace") if path.exists() else ""
    return sum("deferred" in line and "min_regions_for_durability" in line for line in text.splitlines())
