"""Auditor and workers against in-process bookies and ``memory://`` (fast, no processes).

Bookies are ``scriba.testing.sim.StorageTransport``'s in-memory storages; a bookie is
"lost" when its registration is deleted and its storage answers UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest

from scriba.autorecovery.auditor import Auditor
from scriba.autorecovery.config import AutorecoveryConfig
from scriba.autorecovery.marks import references
from scriba.autorecovery.records import (
    UNDERREPLICATED_PREFIX,
    Mark,
    Reason,
    UnderReplicated,
    underreplicated_key,
)
from scriba.autorecovery.replicas import check_replicas
from scriba.autorecovery.worker import ReplicationWorker
from scriba.client import Client
from scriba.entry import make_digest
from scriba.errors import NotLeaderError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta import connect
from scriba.meta.records import LEDGERS_PREFIX, LedgerMetadata, bookie_key
from scriba.meta.store import MetadataStore
from scriba.placement import Adherence, make_policy
from scriba.testing.sim import StorageTransport, register_bookies
from scriba.testing.waiting import eventually

BOOKIES = [f"bk{i}" for i in range(7)]  # zones zone0/1/2 round-robin (register_bookies)
PASSWORD = b"pw"
FAST = AutorecoveryConfig(
    lost_bookie_recovery_delay_s=0, audit_tick_s=0.05, worker_poll_s=0.05, worker_retry_s=0.05,
    check_interval_s=3600, passwords=(PASSWORD,), open_ledger_grace_s=3600,
)


@dataclass
class World:
    store: MetadataStore
    transport: StorageTransport
    client: Client

    async def lose(self, bookie: str) -> None:
        self.transport.down.add(BookieId(bookie))
        await self.store.delete(bookie_key(bookie))
        await eventually(lambda: bookie not in self.client.registry.registrations, 20.0, what="registry saw the loss", interval_s=0.02)

    async def ledgers(self) -> list[LedgerMetadata]:
        return [LedgerMetadata.from_bytes(raw.value) async for _k, raw in self.store.scan(LEDGERS_PREFIX)]

    async def records(self) -> list[UnderReplicated]:
        return [UnderReplicated.from_bytes(raw.value) for _k, raw in await self.store.list(UNDERREPLICATED_PREFIX)]




@pytest.fixture
async def world() -> AsyncIterator[World]:
    store = await connect(f"memory://ar{uuid.uuid4().hex[:8]}")
    await register_bookies(store, BOOKIES)
    transport = StorageTransport(BOOKIES)
    async with Client.connect(store.uri, store=store, transport=transport, placement="zone-aware") as client:
        yield World(store, transport, client)
    await transport.close()
    await store.close()


async def write_ledgers(client: Client, n: int, entries: int, *, close: bool = True) -> list[int]:
    ids = []
    for _ in range(n):
        w = await client.create_ledger(3, 3, 2, password=PASSWORD)
        for i in range(entries):
            w.append_async(b"e%d" % i)
        await w.append(b"last")
        if close:
            await w.close()
        ids.append(w.ledger_id)
    return ids


async def assert_healthy(world: World, lost: set[str]) -> None:
    """Full write quorum, every replica readable, no lost bookie used, placement holds."""
    digest = make_digest("crc32c", PASSWORD)
    topology = world.client.registry.topology()
    for md in await world.ledgers():
        for b in lost:
            assert not references(md, BookieId(b)), f"ledger {md.ledger_id} still uses {b}: {md.ensembles}"
        problems = await check_replicas(world.transport, md, digest=digest)
        assert problems == [], f"ledger {md.ledger_id}: {problems[:5]}"
        policy = make_policy(md.placement_policy, md.placement_options)
        for _first, ensemble in md.ensembles:
            if all(b in topology.nodes for b in ensemble):
                assert policy.adherence(topology, ensemble, 3, 2) is not Adherence.FAIL


@contextlib.asynccontextmanager
async def running(*coros: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(c(stop)) for c in coros]
    try:
        yield stop
    finally:
        stop.set()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(t, 10)


async def test_a_lost_bookie_is_re_replicated_with_placement_kept(world: World) -> None:
    await write_ledgers(world.client, 6, 40)
    mds = await world.ledgers()
    victim = max(BOOKIES, key=lambda b: sum(references(md, BookieId(b)) for md in mds))
    digest = make_digest("crc32c", PASSWORD)
    await world.lose(victim)
    # negative control for the checker: right after the loss, replicas are missing
    before = [p for md in await world.ledgers()
              for p in await check_replicas(world.transport, md, digest=digest)]
    assert before and all(p.bookie_id == victim for p in before)
    auditor = Auditor(world.client, FAST, candidate="a1")
    worker = ReplicationWorker(world.client, FAST)
    async with running(auditor.run, worker.run):
        async def repaired() -> bool:
            return not await world.records() and not any(
                references(md, BookieId(victim)) for md in await world.ledgers())
        await eventually(repaired, 20.0, what="every ledger repaired", interval_s=0.02)
    await assert_healthy(world, {victim})
    assert sum(o.entries for o in worker.outcomes) > 0
    assert auditor.passes and auditor.passes[-1].ledgers == 6


async def test_a_bookie_back_within_the_delay_is_not_re_replicated(world: World) -> None:
    await write_ledgers(world.client, 3, 10)
    cfg = AutorecoveryConfig(lost_bookie_recovery_delay_s=3600, audit_tick_s=0.05,
                             check_interval_s=3600, passwords=(PASSWORD,))
    auditor = Auditor(world.client, cfg, candidate="a1")
    async with running(auditor.run):
        await eventually(lambda: bool(auditor.passes), 20.0, what="first pass", interval_s=0.02)
        await world.lose("bk1")
        await asyncio.sleep(0.3)  # negative check: several ticks within the delay, nothing may be marked
        assert await world.records() == []
    assert all(p.marks == 0 for p in auditor.passes)


async def test_concurrent_workers_repair_once_and_a_blind_write_loses_an_update(world: World) -> None:
    """Two workers on one ledger at once (no claims): CAS keeps both segment repairs; the
    negative control (blind write of the change) loses one, and the checker sees it."""
    for cas in (True, False):
        w = await world.client.create_ledger(3, 3, 2, password=PASSWORD)
        for i in range(20):
            await w.append(b"x%d" % i)
        first = w.metadata.current_ensemble
        world.transport.down.add(first[1])  # the writer replaces it: a second segment
        for i in range(20):
            await w.append(b"y%d" % i)
        world.transport.down.discard(first[1])
        await w.close()
        md = await world.client.ledger_metadata(w.ledger_id)
        assert len(md.ensembles) == 2
        seg0, seg1 = md.ensembles[0], md.ensembles[1]
        workers = [ReplicationWorker(world.client, FAST, ensemble_cas=cas) for _ in range(2)]
        # each worker moves a different (healthy) bookie off a different segment, from the
        # same metadata read
        jobs = [{EntryId(seg0[0]): frozenset({seg0[1][0]})}, {EntryId(seg1[0]): frozenset({seg1[1][2]})}]
        await asyncio.gather(*(wk.repair_segments(md, job, PASSWORD) for wk, job in zip(workers, jobs, strict=True)))
        after = await world.client.ledger_metadata(w.ledger_id)
        kept = seg0[1][0] not in after.ensembles[0][1] and seg1[1][2] not in after.ensembles[1][1]
        assert kept is cas, f"cas={cas}: {md.ensembles} -> {after.ensembles}"


async def test_an_open_ledger_is_repaired_to_its_lac_while_the_writer_appends(world: World) -> None:
    w = await world.client.create_ledger(3, 3, 2, password=PASSWORD)
    for i in range(30):
        await w.append(b"a%d" % i)
    victim = w.metadata.current_ensemble[2]
    await world.lose(victim)
    await world.store.create(underreplicated_key(w.ledger_id), UnderReplicated(
        LedgerId(w.ledger_id), (Mark(EntryId(0), BookieId(victim), Reason.LOST),)).to_bytes())
    worker = ReplicationWorker(world.client, FAST)
    stop_writing = asyncio.Event()

    async def keep_appending() -> int:
        n = 0
        while not stop_writing.is_set():
            await w.append(b"b%d" % n)
            n += 1
            await asyncio.sleep(0.005)  # the load's pacing, not synchronisation
        return n

    writer_task = asyncio.create_task(keep_appending())
    outcome = await worker.process(w.ledger_id)
    stop_writing.set()
    written = await writer_task
    await w.close()
    md = await world.client.ledger_metadata(w.ledger_id)
    assert outcome.entries >= 30 and written > 0, outcome
    assert md.is_closed and md.last_entry_id == 30 + written - 1
    # the repaired prefix is on a new bookie; the writer replaced the victim itself afterwards
    assert victim not in md.ensembles[0][1]
    # What is left: the old tail once closed, and entries of the writer's own new segment
    # confirmed while its ensemble change was being written (never sent to the new
    # bookie: WriteCore resends only unconfirmed entries). A full check finds those.
    auditor = Auditor(world.client, FAST, candidate="a1")
    async with running(auditor.run, ReplicationWorker(world.client, FAST).run):
        await eventually(lambda: auditor.leadership is not None, 20.0, what="elected", interval_s=0.02)
        await auditor.audit_now(full=True)

        async def settled() -> bool:
            return not await world.records()
        await eventually(settled, 20.0, what="every record repaired", interval_s=0.02)
    await assert_healthy(world, {victim})
    reader = await world.client.open_ledger(w.ledger_id, PASSWORD)
    got = [e.payload async for e in reader.read(0, md.last_entry_id)]
    assert got[:30] == [b"a%d" % i for i in range(30)] and len(got) == 30 + written


async def test_a_deposed_auditor_cannot_mark(world: World) -> None:
    await write_ledgers(world.client, 1, 5)
    auditor = Auditor(world.client, FAST, candidate="a1")
    async with running(auditor.run):
        await eventually(lambda: auditor.leadership is not None, 20.0, what="elected", interval_s=0.02)
        leadership = auditor.leadership
        assert leadership is not None
        # a successor takes over behind the first one's back (its session, say, expired)
        from scriba.meta.election import election_key

        key = election_key("autorecovery-auditor")
        raw = await world.store.get(key)
        await world.store.set(key, raw.value + b" ", expected_version=raw.version)
        with pytest.raises(NotLeaderError):
            await auditor._mark(leadership, LedgerId(1), [Mark(EntryId(0), BookieId("bk0"), Reason.RECOVER)])
    assert await world.records() == []


async def test_an_open_ledger_whose_writer_is_gone_is_recovered_after_the_grace(world: World) -> None:
    w = await world.client.create_ledger(3, 3, 2, password=PASSWORD)
    for i in range(25):
        await w.append(b"z%d" % i)
    victim = w.metadata.current_ensemble[0]  # the writer is abandoned here, never closed
    await world.lose(victim)
    cfg = AutorecoveryConfig(lost_bookie_recovery_delay_s=0, audit_tick_s=0.05, worker_poll_s=0.05,
                             worker_retry_s=0.05, check_interval_s=3600, passwords=(PASSWORD,),
                             open_ledger_grace_s=0.3)
    auditor = Auditor(world.client, cfg, candidate="a1")
    worker = ReplicationWorker(world.client, cfg)
    async with running(auditor.run, worker.run):
        async def closed_and_repaired() -> bool:
            md = await world.client.ledger_metadata(w.ledger_id)
            return md.is_closed and not references(md, BookieId(victim)) and not await world.records()
        await eventually(closed_and_repaired, 20.0, what="recovered, closed and repaired", interval_s=0.02)
    md = await world.client.ledger_metadata(w.ledger_id)
    assert md.last_entry_id == 24  # recovery kept every confirmed entry
    assert any(o.state == "deferred" for o in worker.outcomes)  # it waited for the writer first
    await assert_healthy(world, {victim})


async def test_verbs_list_status_and_recover_bookie(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from scriba.autorecovery import commands
    from scriba.autorecovery.shell import cmd_list, cmd_status

    await write_ledgers(world.client, 3, 10)
    capsys.readouterr()
    mds = await world.ledgers()
    target = BookieId(max(BOOKIES, key=lambda b: sum(references(md, BookieId(b)) for md in mds)))
    using = await commands.ledgers_using(world.store, target)
    marked = await commands.mark_bookie(world.store, target, Reason.RECOVER)
    assert marked == len(using) > 0
    assert await cmd_list(argparse.Namespace(json=True), world.store.uri) == 0
    rows = _json_doc(capsys.readouterr().out)
    assert {r["ledger_id"] for r in rows} == set(using) and all(r["bookies"] == [target] for r in rows)
    seq = await commands.request_audit(world.store, full=True)
    assert await commands.request_audit(world.store) == seq + 1
    seen: list[tuple[int, int]] = []
    total = await commands.drain(world.client, target, FAST, Reason.RECOVER,
                                 progress=lambda left, n: seen.append((left, n)), poll_s=0.01)
    assert total == len(using) and seen[0] == (total, total) and seen[-1] == (0, total)
    assert await commands.ledgers_using(world.store, target) == [] and await world.records() == []
    assert await cmd_status(argparse.Namespace(json=True), world.store.uri) == 0
    doc = _json_doc(capsys.readouterr().out)
    assert doc["underreplicated_ledgers"] == 0 and doc["auditor_leader"] is None


def _json_doc(out: str) -> Any:
    """The indented JSON document a verb printed (log lines around it are skipped)."""
    import json

    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line in ("[", "{", "[]"))
    end = max(i for i, line in enumerate(lines) if line in ("]", "}", "[]"))
    return json.loads("\n".join(lines[start:end + 1]))


async def test_a_worker_uses_the_password_stored_in_metadata_and_needs_one_without(world: World) -> None:
    """BookKeeper keeps the password in ledger metadata for autorecovery; so does Scriba by
    default. A worker configured with no password repairs such a ledger; a ledger created
    with ``store_password_in_metadata=False`` stays marked, "password unknown" (the control)."""
    from scriba.client.client import ClientConfig

    secret = b"not-in-any-config"
    stored = await world.client.create_ledger(3, 3, 2, password=secret, digest="hmac-sha256")
    async with Client.connect(world.store.uri, store=world.store, transport=world.transport,
                              config=ClientConfig(store_password_in_metadata=False)) as bare_client:
        bare = await bare_client.create_ledger(3, 3, 2, password=secret, digest="hmac-sha256")
        for w in (stored, bare):
            for i in range(20):
                w.append_async(b"e%d" % i)
            await w.append(b"last")
            await w.close()
    mds = {md.ledger_id: md for md in await world.ledgers()}
    assert mds[stored.ledger_id].password == secret and mds[bare.ledger_id].password is None
    assert "password" not in mds[stored.ledger_id].to_json()  # never shown, only that it is kept
    assert mds[stored.ledger_id].to_json()["password_stored"] is True
    a, b = (mds[w.ledger_id].current_ensemble for w in (stored, bare))
    common = sorted(set(a) & set(b))
    victims = {w.ledger_id: common[0] if common else e[0] for w, e in ((stored, a), (bare, b))}
    for victim in set(victims.values()):
        await world.lose(victim)
    for w in (stored, bare):
        victim = victims[w.ledger_id]
        await world.store.create(underreplicated_key(w.ledger_id), UnderReplicated(
            LedgerId(w.ledger_id), (Mark(EntryId(0), victim, Reason.LOST),)).to_bytes())
    no_passwords = AutorecoveryConfig(lost_bookie_recovery_delay_s=0, worker_retry_s=0.05,
                                      check_interval_s=3600)
    worker = ReplicationWorker(world.client, no_passwords)
    await worker.run_once()
    outcomes = {o.ledger_id: o for o in worker.outcomes}
    assert outcomes[stored.ledger_id].state == "repaired", outcomes[stored.ledger_id]
    assert outcomes[stored.ledger_id].entries == 21
    assert outcomes[bare.ledger_id].state == "failed"
    assert outcomes[bare.ledger_id].detail == "password unknown"
    after = {md.ledger_id: md for md in await world.ledgers()}
    assert victims[stored.ledger_id] not in after[stored.ledger_id].current_ensemble
    assert after[bare.ledger_id].ensembles == mds[bare.ledger_id].ensembles
    hmac = make_digest("hmac-sha256", secret)
    assert await check_replicas(world.transport, after[stored.ledger_id], digest=hmac) == []


def test_a_stored_password_that_does_not_match_its_hash_is_never_used() -> None:
    from scriba.entry import password_hash

    config = AutorecoveryConfig(passwords=(b"listed",))
    assert config.password_for(password_hash(b"kept"), b"kept") == b"kept"
    assert config.password_for(password_hash(b"listed"), b"forged") == b"listed"
    assert config.password_for(password_hash(b"other"), b"forged") is None
    assert config.password_for(password_hash(b"other")) is None
