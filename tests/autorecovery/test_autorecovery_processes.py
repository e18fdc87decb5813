"""Autorecovery with real processes on etcd and ZooKeeper: R13 and the failure cases of #19.

Bookies are ``scriba bookie run`` processes over three zones; auditors and workers are
``scriba autorecovery run`` processes; the test process writes and reads through the
public client and checks with ``check_replicas`` (every entry from every bookie of its
write set), the acked-set checker and the placement policies' own adherence.

Bound (R13): with ``lost_bookie_recovery_delay_s = 1``, every ledger is back at full
write quorum within ``REPAIR_BOUND_S`` of the kill (typically a few seconds here).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from conftest import PASSWORD, ArCluster

from scriba.autorecovery.commands import ledgers_using, request_audit, status
from scriba.autorecovery.marks import references
from scriba.autorecovery.records import (
    UNDERREPLICATED_PREFIX,
    Mark,
    Reason,
    UnderReplicated,
    underreplicated_key,
)
from scriba.autorecovery.replicas import check_replicas
from scriba.client import Client, ClientConfig
from scriba.entry import make_digest, master_key
from scriba.errors import NoSuchKeyError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.records import LEDGERS_PREFIX, LedgerMetadata
from scriba.placement import Adherence, make_policy
from scriba.testing.checkers import check_acked_set
from scriba.testing.waiting import eventually

REPAIR_BOUND_S = 60.0
DIGEST = make_digest("crc32c", PASSWORD)
KEY = master_key(PASSWORD)


async def ledgers(client: Client) -> list[LedgerMetadata]:
    return [LedgerMetadata.from_bytes(raw.value) async for _k, raw in client.store.scan(LEDGERS_PREFIX)]


async def no_records(client: Client) -> bool:
    return not await client.store.list(UNDERREPLICATED_PREFIX)


async def healthy(client: Client, gone: set[str]) -> list[str]:
    """What is wrong: a lost bookie referenced, a missing/corrupt replica, placement failed."""
    problems: list[str] = []
    topology = client.registry.topology()
    for md in await ledgers(client):
        for b in gone:
            if references(md, BookieId(b)):
                problems.append(f"ledger {md.ledger_id} uses {b}")
        lac = None if md.is_closed else -1
        problems += [f"ledger {md.ledger_id}: {p}" for p in
                     await check_replicas(client.transport, md, digest=DIGEST, master_key=KEY, lac=lac)]
        policy = make_policy(md.placement_policy, md.placement_options)
        for first, ensemble in md.ensembles:
            if policy.adherence(topology, ensemble, md.write_quorum_size, md.ack_quorum_size) is Adherence.FAIL:
                problems.append(f"ledger {md.ledger_id} segment {first}: placement fails {ensemble}")
    return problems


async def write_load(client: Client, stop: asyncio.Event, acked: set[tuple[int, int, bytes]],
                     attempted: set[tuple[int, int, bytes]], entries_per_ledger: int = 60) -> None:
    """Roll zone-aware ledgers (E=3 W=3 A=2) of ``entries_per_ledger`` entries until ``stop``."""
    while not stop.is_set():
        w = await client.create_ledger(3, 3, 2, password=PASSWORD)
        for i in range(entries_per_ledger):
            payload = b"%d-%d" % (w.ledger_id, i)
            attempted.add((w.ledger_id, i, payload))
            entry_id = await w.append(payload)
            acked.add((w.ledger_id, entry_id, payload))
            if stop.is_set():
                break
        await w.close()


async def read_all(client: Client) -> list[tuple[int, int, bytes]]:
    out = []
    for md in await ledgers(client):
        reader = await client.open_ledger(md.ledger_id, PASSWORD)
        out += [(md.ledger_id, e.entry_id, e.payload) async for e in reader.read(0, reader.last_add_confirmed)]
    return out


def most_used(mds: list[LedgerMetadata], bookies: list[str]) -> str:
    return max(bookies, key=lambda b: sum(references(md, BookieId(b)) for md in mds))


async def full_check_and_settle(client: Client, bound_s: float) -> None:
    """audit-now --full, wait until the auditor has run it, then until nothing is marked."""
    asked_ms = int(time.time() * 1000)
    await request_audit(client.store, full=True)

    async def checked() -> bool:
        auditor = (await status(client.store))["auditor"]
        return bool(auditor) and auditor["last_full_check_ms"] >= asked_ms
    await eventually(checked, bound_s, what="the auditor ran the full check", interval_s=0.1)
    await eventually(lambda: no_records(client), bound_s, what="the full check's marks repaired", interval_s=0.1)


async def test_r13_a_bookie_lost_for_good_under_load_is_re_replicated(ar_cluster: ArCluster) -> None:
    ar_cluster.start_autorecovery("ar1")
    ar_cluster.start_autorecovery("ar2")
    bookies = [b.bookie_id for b in ar_cluster.cluster.bookies.bookies]
    async with Client.connect(ar_cluster.uri, placement="zone-aware",
                              config=ClientConfig(add_timeout_s=3.0)) as client:
        stop = asyncio.Event()
        acked: set[tuple[int, int, bytes]] = set()
        attempted: set[tuple[int, int, bytes]] = set()
        load = [asyncio.create_task(write_load(client, stop, acked, attempted)) for _ in range(3)]
        await eventually(lambda: _at_least(client, 6), 60, what="six ledgers written", interval_s=0.1)
        victim = most_used(await ledgers(client), bookies)
        ar_cluster.cluster.bookies.kill(bookies.index(victim))
        killed_at = time.monotonic()
        # negative control for the checker: before any repair (the delay and the bookie's
        # session are still running) the lost bookie is referenced
        assert await ledgers_using(client.store, BookieId(victim))
        written = len(acked)  # keep writing across the loss
        await eventually(lambda: len(acked) >= written + 30, 60, what="30 more entries acknowledged after the kill")
        stop.set()
        await asyncio.gather(*load)

        async def repaired() -> bool:
            return await no_records(client) and not await ledgers_using(client.store, BookieId(victim))
        await eventually(repaired, REPAIR_BOUND_S, what="every ledger off the lost bookie", interval_s=0.1)
        await full_check_and_settle(client, REPAIR_BOUND_S)
        took_s = time.monotonic() - killed_at
        problems = await healthy(client, {victim})
        assert problems == [], problems[:10]
        result = check_acked_set(attempted, acked, await read_all(client))
        assert result.ok, result.explain()
        assert took_s < REPAIR_BOUND_S
        print(f"R13 ({ar_cluster.cluster.metadata}): {len(await ledgers(client))} ledgers, "
              f"{len(acked)} acked entries, repaired and fully checked {took_s:.1f} s after the kill")


async def _at_least(client: Client, n: int) -> bool:
    return len(await ledgers(client)) >= n


async def test_a_worker_killed_mid_copy_and_a_second_worker_repair_once(ar_cluster: ArCluster) -> None:
    bookies = [b.bookie_id for b in ar_cluster.cluster.bookies.bookies]
    async with Client.connect(ar_cluster.uri, placement="zone-aware") as client:
        w = await client.create_ledger(3, 3, 2, password=PASSWORD)
        for i in range(600):
            w.append_async(b"%04d" % i)
        await w.append(b"end")
        await w.close()
        before = await client.ledger_metadata(w.ledger_id)
        victim = before.current_ensemble[1]
        ar_cluster.cluster.bookies.kill(bookies.index(victim))
        await eventually(lambda: _gone(client, victim), 30, what="the registry saw the kill", interval_s=0.1)
        # a slow worker (rate-limited) takes the ledger; no auditor: the mark is ours
        await client.store.create(underreplicated_key(w.ledger_id), UnderReplicated(
            LedgerId(w.ledger_id), (Mark(EntryId(0), BookieId(victim), Reason.LOST),)).to_bytes())
        slow = ar_cluster.start_autorecovery("slow", "--entries-per-s", "100", auditor=False)

        async def claimed() -> bool:
            return bool((await status(client.store))["claims"])
        await eventually(claimed, 30, what="the slow worker claimed the ledger", interval_s=0.1)
        await asyncio.sleep(1.0)  # fault timing: the slow worker dies mid-copy (some batches copied, most not)
        slow.kill()
        after_kill = await client.ledger_metadata(w.ledger_id)
        assert after_kill.ensembles == before.ensembles  # nothing claimed before the copy was done
        ar_cluster.start_autorecovery("w2", auditor=False)
        ar_cluster.start_autorecovery("w3", auditor=False)  # two workers race for the claim
        await eventually(lambda: no_records(client), REPAIR_BOUND_S, what="repaired by the other workers", interval_s=0.1)
        md = await client.ledger_metadata(w.ledger_id)
        assert len(md.ensembles) == 1 and victim not in md.current_ensemble  # one change, once
        assert [b for b in md.current_ensemble if b not in before.current_ensemble].__len__() == 1
        assert await healthy(client, {victim}) == []


async def _gone(client: Client, bookie: str) -> bool:
    return bookie not in client.registry.registrations


async def test_decommission_of_a_live_bookie_while_it_is_read(ar_cluster: ArCluster) -> None:
    ar_cluster.start_autorecovery("ar1")
    bookies = [b.bookie_id for b in ar_cluster.cluster.bookies.bookies]
    async with Client.connect(ar_cluster.uri, placement="zone-aware") as client:
        for _ in range(4):
            w = await client.create_ledger(3, 3, 2, password=PASSWORD)
            for i in range(100):
                w.append_async(b"%d" % i)
            await w.append(b"end")
            await w.close()
        target = most_used(await ledgers(client), bookies)
        stop = asyncio.Event()
        reads = {"ok": 0, "failed": 0}

        async def reader() -> None:
            while not stop.is_set():
                for md in await ledgers(client):
                    try:
                        r = await client.open_ledger(md.ledger_id, PASSWORD, recovery=False)
                        n = len([e async for e in r.read(0, md.last_entry_id)])
                        assert n == md.last_entry_id + 1
                        reads["ok"] += 1
                    except Exception:
                        reads["failed"] += 1
                        raise

        reading = asyncio.create_task(reader())
        proc = await asyncio.create_subprocess_exec(
            *_scriba("--metadata", ar_cluster.uri, "--json", "decommission", target,
                     "--password", PASSWORD.decode()),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), REPAIR_BOUND_S)
        stop.set()
        await reading
        assert proc.returncode == 0, err.decode()[-2000:]
        assert b"left" in err  # progress was shown
        assert '"state": "DONE"' in out.decode()
        assert reads["ok"] > 0 and reads["failed"] == 0
        assert await ledgers_using(client.store, BookieId(target)) == []
        assert await healthy(client, set()) == []


def _scriba(*args: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "scriba.cli", "shell", *args]


async def test_the_auditor_killed_is_re_elected_and_still_repairs(ar_cluster: ArCluster) -> None:
    first = ar_cluster.start_autorecovery("ar1")
    async with Client.connect(ar_cluster.uri, placement="zone-aware") as client:
        async def leader_is(name: str) -> bool:
            leader = (await status(client.store))["auditor_leader"]
            return leader is not None and leader["candidate"] == name
        await eventually(lambda: leader_is("ar1"), 30, what="ar1 elected", interval_s=0.1)
        token1 = (await status(client.store))["auditor_leader"]["token"]
        ar_cluster.start_autorecovery("ar2")
        first.kill()
        await eventually(lambda: leader_is("ar2"), 30, what="ar2 elected after ar1 was killed", interval_s=0.1)
        assert (await status(client.store))["auditor_leader"]["token"] > token1
        w = await client.create_ledger(3, 3, 2, password=PASSWORD)
        for i in range(50):
            w.append_async(b"%d" % i)
        await w.append(b"end")
        await w.close()
        bookies = [b.bookie_id for b in ar_cluster.cluster.bookies.bookies]
        victim = w.metadata.current_ensemble[0]
        ar_cluster.cluster.bookies.kill(bookies.index(victim))
        await eventually(lambda: _repaired(client, victim), REPAIR_BOUND_S, what="repaired under the new auditor", interval_s=0.1)
        assert await healthy(client, {victim}) == []
        with contextlib.suppress(Exception):
            first.stop()


async def _repaired(client: Client, victim: str) -> bool:
    return await no_records(client) and not await ledgers_using(client.store, BookieId(victim))


async def test_an_open_ledger_is_repaired_while_its_writer_still_appends(ar_cluster: ArCluster) -> None:
    """The writer pauses (its segment holds the lost bookie), a worker repairs up to the
    LAC and splits the segment, the writer resumes (and replaces the bookie itself)."""
    ar_cluster.start_autorecovery("ar1", "--open-ledger-grace-s", "60")
    bookies = [b.bookie_id for b in ar_cluster.cluster.bookies.bookies]
    async with Client.connect(ar_cluster.uri, placement="zone-aware",
                              config=ClientConfig(add_timeout_s=3.0)) as client:
        w = await client.create_ledger(3, 3, 2, password=PASSWORD)
        acked: set[tuple[int, int, bytes]] = set()

        async def append(payload: bytes) -> None:
            acked.add((w.ledger_id, await w.append(payload), payload))

        for i in range(200):
            await append(b"a%d" % i)
        original = w.metadata.current_ensemble
        victim = original[1]
        ar_cluster.cluster.bookies.kill(bookies.index(victim))

        async def split() -> bool:
            md = await client.ledger_metadata(w.ledger_id)
            return not md.is_closed and len(md.ensembles) >= 2 and victim not in md.ensembles[0][1]
        await eventually(split, REPAIR_BOUND_S, what="the open ledger repaired up to its LAC", interval_s=0.1)
        md = await client.ledger_metadata(w.ledger_id)
        # repaired up to the LAC the worker read; the writer's tail stays on its ensemble, unless
        # the idle writer's explicit LAC to the dead bookie made it replace the bookie itself first
        tail = [e for _f, e in md.ensembles][1:]
        assert 190 <= md.ensembles[1][0] <= 200
        assert tail == [original] or (len(tail) == 1 and victim not in tail[0]), md.ensembles
        for i in range(200):
            await append(b"b%d" % i)  # the writer goes on: its own ensemble change
        await w.close()
        await eventually(lambda: _repaired(client, victim), REPAIR_BOUND_S, what="the tail repaired once closed", interval_s=0.1)
        await full_check_and_settle(client, REPAIR_BOUND_S)
        assert await healthy(client, {victim}) == []
        result = check_acked_set(acked, acked, await read_all(client))
        assert result.ok and len(acked) == 400, result.explain()


async def test_r22_restarts_within_the_delay_re_replicate_nothing(ar_cluster: ArCluster) -> None:
    """Every bookie restarted in turn, each down for less than the delay, under writes:
    nothing lost, no ledger ever marked, nothing copied (checked on /metrics)."""
    from scriba.embedded.process import free_port

    port = free_port()
    ar_cluster.start_autorecovery("ar1", "--delay-s", "30", "--http", f"127.0.0.1:{port}")
    cluster = ar_cluster.cluster.bookies
    async with Client.connect(ar_cluster.uri, placement="zone-aware",
                              config=ClientConfig(add_timeout_s=3.0)) as client:
        stop = asyncio.Event()
        acked: set[tuple[int, int, bytes]] = set()
        attempted: set[tuple[int, int, bytes]] = set()
        load = [asyncio.create_task(write_load(client, stop, acked, attempted)) for _ in range(2)]
        ever_marked = False
        for index in range(len(cluster)):
            await asyncio.to_thread(cluster.restart, index)
            ever_marked = ever_marked or not await no_records(client)
        stop.set()
        await asyncio.gather(*load)
        await asyncio.sleep(1.5)  # negative check: several auditor ticks after the last restart mark nothing
        ever_marked = ever_marked or not await no_records(client)
        assert not ever_marked
        result = check_acked_set(attempted, acked, await read_all(client))
        assert result.ok, result.explain()
        metrics = await asyncio.to_thread(_scrape, port)
        assert "scriba_autorecovery_auditor_leader 1.0" in metrics
        assert "scriba_autorecovery_entries_replicated_total 0.0" in metrics
        published = (await status(client.store))["auditor"]
        assert published["marks_written"] == 0 and published["lost_bookies"] == []


def _scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


async def test_a_placement_violation_after_a_topology_change_is_marked_and_repaired(ar_cluster: ArCluster) -> None:
    """A zone-aware ledger (one bookie per zone) whose bookies are moved into one zone
    (restarted with another ``--zone``) fails its policy: the auditor's check marks it
    PLACEMENT, a worker process moves a replica to another zone, and every entry stays."""
    bookies = ar_cluster.cluster.bookies
    async with Client.connect(ar_cluster.uri, placement="zone-aware") as client:
        w = await client.create_ledger(3, 3, 2, password=PASSWORD)
        payloads = [b"p%d" % i for i in range(40)]
        for p in payloads:
            w.append_async(p)
        await w.close()
        md = await client.ledger_metadata(w.ledger_id)
        topology = client.registry.topology()
        policy = make_policy(md.placement_policy, md.placement_options)
        assert policy.adherence(topology, md.current_ensemble, 3, 2) is not Adherence.FAIL
        first, *others = md.current_ensemble
        index = {b.bookie_id: i for i, b in enumerate(bookies.bookies)}
        zone = bookies[index[first]].zone
        for moved in others:  # the topology changes: the other two join the first one's zone
            bookie = bookies[index[moved]]
            bookie.stop()
            bookie.zone = zone
            bookie.start(30.0)

        async def moved_in_topology() -> bool:
            t = client.registry.topology()
            return all(b in t.nodes and t.location(b).zone == zone for b in md.current_ensemble)
        await eventually(moved_in_topology, 30, what="the registry saw the new zones", interval_s=0.1)
        assert policy.adherence(client.registry.topology(), md.current_ensemble, 3, 2) is Adherence.FAIL
        # the auditor alone first: the mark is observed before any worker repairs it
        ar_cluster.start_autorecovery("auditor", "--no-worker")
        await request_audit(client.store, full=False)

        async def marked() -> bool:
            try:
                raw = await client.store.get(underreplicated_key(w.ledger_id))
            except NoSuchKeyError:
                return False
            return any(m.reason is Reason.PLACEMENT for m in UnderReplicated.from_bytes(raw.value).marks)
        await eventually(marked, REPAIR_BOUND_S, what="the ledger marked for placement", interval_s=0.1)
        assert (await client.ledger_metadata(w.ledger_id)).ensembles == md.ensembles  # nobody repaired yet
        ar_cluster.start_autorecovery("worker", auditor=False)

        async def repaired() -> bool:
            now = await client.ledger_metadata(w.ledger_id)
            return await no_records(client) and policy.adherence(
                client.registry.topology(), now.current_ensemble, 3, 2) is not Adherence.FAIL
        await eventually(repaired, REPAIR_BOUND_S, what="the ledger moved back within its policy", interval_s=0.1)
        after = await client.ledger_metadata(w.ledger_id)
        assert len({client.registry.topology().location(b).zone for b in after.current_ensemble}) >= 2
        assert await check_replicas(client.transport, after, digest=DIGEST, master_key=KEY) == []
        reader = await client.open_ledger(w.ledger_id, PASSWORD, recovery=False)
        assert [e.payload async for e in reader.read(0, reader.last_add_confirmed)] == payloads
        await reader.close()
