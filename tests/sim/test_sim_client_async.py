"""The asyncio drivers and the public Client against in-process bookies and memory://.

Fast stand-ins for real processes (those run in tests/client/test_client_api.py):
``InMemoryLedgerStorage`` per bookie behind ``scriba.testing.sim.StorageTransport``;
the metadata store is ``memory://``. Covers R1 (50 trials) and R2 (100 repetitions) in seconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

import scriba.meta
from scriba.client import Client, ClientConfig, SyncClient
from scriba.client.driver import DriverConfig
from scriba.client.registry import BookieRegistry
from scriba.client.transport import AddCallback, LacResult
from scriba.client.write_core import WriteConfig
from scriba.errors import (
    ConfigError,
    DeadlineExceededError,
    DigestMismatchError,
    LedgerClosedError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    TooManyRequestsError,
    UnauthorizedError,
)
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.records import LedgerState
from scriba.meta.store import MetadataStore
from scriba.testing.sim import StorageTransport, register_bookies
from scriba.testing.waiting import eventually

BOOKIES = [f"bk{i}" for i in range(4)]
CONFIG = ClientConfig(
    add_timeout_s=2.0, bookie_wait_s=2.0,
    driver=DriverConfig(read_timeout_s=2.0, metadata_timeout_s=5.0, long_poll_s=0.2),
)


class RecordingTransport(StorageTransport):
    """``StorageTransport`` that logs each add and read as ``(kind, bookie, flag)``: the
    recovery flag of adds, the fence flag of LAC and entry reads (False for ranges)."""

    def __init__(self, bookie_ids: list[str], **kwargs: Any) -> None:
        super().__init__(bookie_ids, **kwargs)
        self.calls: list[tuple[str, BookieId, bool]] = []

    def add(
        self, bookie_id: BookieId, ledger_id: LedgerId, entry_id: EntryId, master_key: bytes,
        entry: bytes, on_response: AddCallback, *, recovery: bool = False,
    ) -> None:
        self.calls.append(("add", bookie_id, recovery))
        super().add(bookie_id, ledger_id, entry_id, master_key, entry, on_response, recovery=recovery)

    async def read_lac(
        self, bookie_id: BookieId, ledger_id: LedgerId, *, fence: bool = False,
        master_key: bytes = b"", timeout_s: float | None = None,
    ) -> LacResult:
        self.calls.append(("read_lac", bookie_id, fence))
        return await super().read_lac(
            bookie_id, ledger_id, fence=fence, master_key=master_key, timeout_s=timeout_s
        )

    async def read_entry(
        self, bookie_id: BookieId, ledger_id: LedgerId, entry_id: EntryId, *,
        fence: bool = False, master_key: bytes = b"", timeout_s: float | None = None,
    ) -> bytes:
        self.calls.append(("read_entry", bookie_id, fence))
        return await super().read_entry(
            bookie_id, ledger_id, entry_id, fence=fence, master_key=master_key, timeout_s=timeout_s
        )

    async def read_range(self, bookie_id: BookieId, *args: Any, **kwargs: Any) -> list[bytes]:
        self.calls.append(("read_range", bookie_id, False))
        return await super().read_range(bookie_id, *args, **kwargs)


@pytest.fixture
def recoveries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every recovery attempt ``open_ledger`` makes: "ok" or "failed: <error>". A test
    that expects one attempt per recovery fails when a first attempt failed and a retry
    (or the old writer's explicit LAC) covered it up."""
    module = importlib.import_module("scriba.client.client")
    real = module.recover_ledger
    outcomes: list[str] = []

    async def counted(*args: Any, **kwargs: Any) -> Any:
        try:
            record = await real(*args, **kwargs)
        except Exception as exc:
            outcomes.append(f"failed: {exc!r}")
            raise
        outcomes.append("ok")
        return record

    monkeypatch.setattr(module, "recover_ledger", counted)
    return outcomes


@dataclass
class Env:
    store: MetadataStore
    transport: RecordingTransport
    client: Client

    async def second_client(self) -> Client:
        return await Client.connect(
            self.store.uri, store=self.store, transport=self.transport, config=CONFIG
        )


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    store = await scriba.meta.connect(f"memory://client-{uuid.uuid4().hex[:10]}")
    await register_bookies(store, BOOKIES)
    transport = RecordingTransport(BOOKIES)
    client = await Client.connect(store.uri, store=store, transport=transport, config=CONFIG)
    try:
        yield Env(store, transport, client)
    finally:
        await client.close()
        await transport.close()
        await store.close()


async def test_sim_client_write_read_close(env: Env) -> None:
    w = await env.client.create_ledger(3, 3, 2, password=b"pw", custom_metadata={"app": "t"})
    assert await w.append(b"first") == 0
    ids = await asyncio.gather(*(w.append_async(b"e%04d" % i) for i in range(1, 300)))
    assert ids == list(range(1, 300))
    assert w.last_add_confirmed == 299
    total = len(b"first") + sum(len(b"e%04d" % i) for i in range(1, 300))
    assert w.length == total
    await w.close()
    assert w.length == w.metadata.length == total
    with pytest.raises(LedgerClosedError):
        await w.append(b"late")
    r = await env.client.open_ledger(w.ledger_id, password=b"pw")
    assert r.is_closed and r.metadata.last_entry_id == 299 and r.metadata.length == total
    assert r.metadata.custom_metadata == {"app": "t"}
    got = [e async for e in r.read(0, 299)]
    assert [e.payload for e in got] == [b"first"] + [b"e%04d" % i for i in range(1, 300)]
    assert await r.read_last_add_confirmed() == 299
    with pytest.raises(NoSuchEntryError):
        [e async for e in r.read(0, 300)]
    assert w.ledger_id in await env.client.list_ledgers()
    await env.client.delete_ledger(w.ledger_id)
    assert w.ledger_id not in await env.client.list_ledgers()
    with pytest.raises(NoSuchLedgerError):
        await env.client.open_ledger(w.ledger_id, password=b"pw")


async def test_sim_client_wrong_password_rejected_before_bookies(env: Env) -> None:
    w = await env.client.create_ledger(3, 2, 2, password=b"right", digest="hmac-sha256")
    await w.append(b"x")
    adds = env.transport.adds
    with pytest.raises(UnauthorizedError):
        await env.client.open_ledger(w.ledger_id, password=b"wrong")
    assert env.transport.adds == adds
    assert (await env.client.ledger_metadata(w.ledger_id)).state is LedgerState.OPEN
    r = await env.client.open_ledger(w.ledger_id, password=b"right")
    assert [e.payload async for e in r.read()] == [b"x"]


async def test_sim_client_r1_old_writer_fenced_50_of_50(env: Env, recoveries: list[str]) -> None:
    other = await env.second_client()
    fenced = 0
    for trial in range(50):
        w = await env.client.create_ledger(3, 3, 2, password=b"pw")
        futures = [w.append_async(b"t%d-%d" % (trial, i)) for i in range(20 + trial)]
        await asyncio.sleep(0)
        r = await other.open_ledger(w.ledger_id, password=b"pw")
        confirmed = w.last_add_confirmed
        assert r.metadata.last_entry_id >= confirmed
        try:
            for _ in range(5):
                await w.append(b"after recovery")
        except LedgerFencedError:
            fenced += 1
        await asyncio.gather(*futures, return_exceptions=True)
        # every append the writer saw confirmed is in the recovered ledger
        assert w.last_add_confirmed <= r.metadata.last_entry_id
    assert fenced == 50
    assert recoveries == ["ok"] * 50  # each recovery succeeded at its first attempt
    await other.close()


async def test_sim_client_r2_concurrent_recoveries_agree_100(env: Env, recoveries: list[str]) -> None:
    clients = [await env.second_client() for _ in range(3)]
    for rep in range(100):
        w = await env.client.create_ledger(3, 3, 2, password=b"pw")
        for i in range(rep % 7):
            w.append_async(b"r%d-%d" % (rep, i)).add_done_callback(lambda f: f.exception())
        if rep % 3 == 0:
            await asyncio.sleep(0)
        readers = await asyncio.gather(
            *(c.open_ledger(w.ledger_id, password=b"pw") for c in clients)
        )
        lasts = {r.metadata.last_entry_id for r in readers}
        assert len(lasts) == 1, f"repetition {rep}: recoveries disagree: {lasts}"
        contents = [[e.payload async for e in r.read()] for r in readers]
        assert all(c == contents[0] for c in contents)
        await w.abort()
    assert recoveries and all(r == "ok" for r in recoveries), recoveries  # no retried attempt
    for c in clients:
        await c.close()


async def test_sim_client_corrupt_replica_served_by_another(env: Env) -> None:
    w = await env.client.create_ledger(3, 3, 2)
    for i in range(10):
        await w.append(b"v%d" % i)
    await w.close()
    md = await env.client.ledger_metadata(w.ledger_id)
    ensemble = md.current_ensemble
    env.transport.corrupt(ensemble[0], w.ledger_id, 4)
    env.transport.corrupt(ensemble[1], w.ledger_id, 4)
    r = await env.client.open_ledger(w.ledger_id)
    assert [e.payload async for e in r.read()] == [b"v%d" % i for i in range(10)]
    env.transport.corrupt(ensemble[2], w.ledger_id, 4)
    with pytest.raises(DigestMismatchError):
        [e async for e in r.read(4, 4)]


async def test_sim_client_tail_sees_every_entry_and_ends_on_close(env: Env) -> None:
    w = await env.client.create_ledger(3, 2, 2, password=b"t")
    r = await env.client.open_ledger(w.ledger_id, password=b"t", recovery=False)

    async def write() -> None:
        for i in range(200):
            await w.append(b"tail%d" % i)
            if i % 50 == 0:
                await asyncio.sleep(0.01)  # the writer's pacing: the reader catches up and long-polls
        await w.close()

    writer = asyncio.create_task(write())
    got = []
    async with asyncio.timeout(30):
        async for entry in r.tail(0):
            got.append(entry.payload)
    await writer
    assert got == [b"tail%d" % i for i in range(200)]


async def test_sim_client_ensemble_change_when_a_bookie_goes_down(env: Env) -> None:
    w = await env.client.create_ledger(3, 3, 2)
    for i in range(20):
        await w.append(b"a%d" % i)
    victim = w.metadata.current_ensemble[1]
    env.transport.down.add(victim)
    ids = await asyncio.gather(*(w.append_async(b"b%d" % i) for i in range(50)))
    assert ids == list(range(20, 70))
    assert len(w.metadata.ensembles) == 2 and victim not in w.metadata.current_ensemble
    await w.close()
    env.transport.down.discard(victim)
    r = await env.client.open_ledger(w.ledger_id)
    payloads = [e.payload async for e in r.read()]
    assert payloads == [b"a%d" % i for i in range(20)] + [b"b%d" % i for i in range(50)]


async def test_sim_client_connect_as_context_manager(env: Env) -> None:
    async with Client.connect(env.store.uri, store=env.store, transport=env.transport, config=CONFIG) as c:
        w = await c.create_ledger(2, 2, 1)
        assert await w.append(b"x") == 0
        await w.close()


def test_sim_sync_client_roundtrip() -> None:
    transport = StorageTransport(BOOKIES)
    uri = f"memory://sync-{uuid.uuid4().hex[:8]}"
    with SyncClient.connect(uri, transport=transport, config=CONFIG) as client:
        client.call(register_bookies(client.client.store, BOOKIES))
        w = client.create_ledger(3, 3, 2, password=b"s")
        assert w.append(b"one") == 0
        assert w.append_many([b"two", b"three"]) == [1, 2]
        w.close()
        r = client.open_ledger(w.ledger_id, password=b"s")
        assert [e.payload for e in r.read()] == [b"one", b"two", b"three"]
        assert w.ledger_id in client.list_ledgers()
        with pytest.raises(DeadlineExceededError):
            client.call(asyncio.sleep(30), timeout_s=0.05)  # cancelled on the loop, not left running

        async def from_the_loop() -> None:
            client.call(asyncio.sleep(0))

        with pytest.raises(ConfigError, match="own event loop"):
            client.call(from_the_loop())


async def test_sim_client_replacement_falls_back_to_a_recently_failed_bookie(env: Env) -> None:
    w = await env.client.create_ledger(3, 3, 2)
    await w.append(b"0")
    first_victim = w.metadata.current_ensemble[0]
    env.transport.down.add(first_victim)
    await w.append(b"1")
    spare = w.metadata.current_ensemble[0]
    assert spare != first_victim
    env.transport.down.discard(first_victim)
    env.transport.down.add(spare)
    await w.append(b"2")  # the only candidate left is the recently failed one: used anyway
    assert w.metadata.current_ensemble[0] == first_victim
    await w.close()


async def test_sim_client_no_spare_bookie_retries_the_same_one() -> None:
    ids = ["n0", "n1", "n2"]
    store = await scriba.meta.connect(f"memory://nospare-{uuid.uuid4().hex[:8]}")
    await register_bookies(store, ids)
    transport = StorageTransport(ids)
    config = ClientConfig(
        add_timeout_s=2.0, bookie_wait_s=2.0,
        write=WriteConfig(replacement_retry_s=0.05), driver=CONFIG.driver,
    )
    async with Client.connect(store.uri, store=store, transport=transport, config=config) as client:
        w = await client.create_ledger(3, 3, 3)
        await w.append(b"before")
        transport.down.add(BookieId("n1"))
        pending = [w.append_async(b"during%d" % i) for i in range(10)]
        await asyncio.sleep(0.2)  # negative check: nothing confirms while n1 is down
        assert not any(f.done() for f in pending)  # A=3: nothing confirms without n1
        transport.down.discard(BookieId("n1"))
        async with asyncio.timeout(10):
            assert await asyncio.gather(*pending) == list(range(1, 11))
        assert len(w.metadata.ensembles) == 1  # no ensemble change happened
        await w.close()
    await transport.close()
    await store.close()


async def test_sim_registry_follows_registrations() -> None:
    store = await scriba.meta.connect(f"memory://registry-{uuid.uuid4().hex[:8]}")
    other = await scriba.meta.connect(store.uri)
    registry = await BookieRegistry(store).start(5.0)
    try:
        assert registry.registrations == {}
        with pytest.raises(NotEnoughBookiesError):
            await registry.wait_for_bookies(1, 0.05)
        waiter = asyncio.create_task(registry.wait_for_bookies(2, 5.0))
        await register_bookies(other, ["r0", "r1"])
        assert await waiter == ["r0", "r1"]
        assert registry.address(BookieId("r1")) == "memory:r1"
        assert set(registry.topology().nodes) == {"r0", "r1"}
        await other.close()  # its ephemeral registrations go with its session
        await eventually(lambda: not registry.registrations, 5, what="the closed session's registrations gone")
        assert registry.address(BookieId("r1")) == "memory:r1"  # last known address kept
        assert set(registry.topology().nodes) == set()
    finally:
        await registry.close()
        await store.close()


async def test_sim_client_idle_writer_publishes_its_lac_for_tailing_readers(env: Env) -> None:
    w = await env.client.create_ledger(3, 3, 2)
    r = await env.client.open_ledger(w.ledger_id, recovery=False)
    for i in range(10):
        await w.append(b"idle%d" % i)
    # The last entry's LAC is only piggybacked on a later entry; an idle writer sends it
    # explicitly, so a tailing reader gets every confirmed entry without a close.
    got = []
    tail = r.tail(0)
    async with asyncio.timeout(10):
        while len(got) < 10:
            got.append((await anext(tail)).payload)
    assert got == [b"idle%d" % i for i in range(10)]
    assert await r.read_last_add_confirmed() == 9
    await w.close()
    async with asyncio.timeout(10):
        assert [e async for e in tail] == []


async def test_sim_client_striped_ledger_e5_w3_reads_back() -> None:
    ids = [f"s{i}" for i in range(5)]
    store = await scriba.meta.connect(f"memory://striped-{uuid.uuid4().hex[:8]}")
    await register_bookies(store, ids)
    transport = StorageTransport(ids)
    async with Client.connect(store.uri, store=store, transport=transport, config=CONFIG) as client:
        w = await client.create_ledger(5, 3, 2, password=b"s")
        assert await asyncio.gather(*(w.append_async(b"s%d" % i) for i in range(500))) == list(range(500))
        await w.close()
        md = await client.ledger_metadata(w.ledger_id)
        transport.corrupt(md.write_set(7)[0], w.ledger_id, 7)
        r = await client.open_ledger(w.ledger_id, password=b"s")
        assert [e.payload async for e in r.read()] == [b"s%d" % i for i in range(500)]
        assert [e.payload async for e in r.read(100, 102)] == [b"s100", b"s101", b"s102"]
    await transport.close()
    await store.close()


async def test_sim_client_backpressure_bounds_inflight_and_waiting() -> None:
    ids = ["p0", "p1", "p2"]
    store = await scriba.meta.connect(f"memory://bp-{uuid.uuid4().hex[:8]}")
    await register_bookies(store, ids)
    transport = StorageTransport(ids)
    config = ClientConfig(
        add_timeout_s=2.0, bookie_wait_s=2.0, write=WriteConfig(entries_inflight_max=8),
        driver=DriverConfig(appends_waiting_max=16, long_poll_s=0.2),
    )
    async with Client.connect(store.uri, store=store, transport=transport, config=config) as client:
        w = await client.create_ledger(3, 3, 2)
        futures = [w.append_async(b"x%d" % i) for i in range(24)]  # 8 in flight + 16 waiting
        assert w.pending == 24
        with pytest.raises(TooManyRequestsError):
            w.append_async(b"one too many")
        # append() waits for room instead of failing.
        blocked = asyncio.create_task(w.append(b"patient"))
        assert await asyncio.gather(*futures) == list(range(24))
        assert await blocked == 24
        await w.close()
    await transport.close()
    await store.close()


async def test_sim_client_late_timeout_after_quorum_replaces_the_slow_bookie(env: Env) -> None:
    env.transport.add_timeout_s = 0.05
    w = await env.client.create_ledger(3, 3, 2)
    await w.append(b"first")
    victim = w.metadata.current_ensemble[2]
    env.transport.add_delay_s[victim] = 1.0  # every add to it times out, after the others confirm
    assert await w.append(b"confirmed-by-two") == 1  # A=2 confirms without the victim
    await eventually(lambda: victim not in w.metadata.current_ensemble, 5, what="the slow bookie replaced in the ensemble")
    ids = [await w.append(b"later%d" % i) for i in range(5)]
    assert ids == [2, 3, 4, 5, 6]
    ensemble = w.metadata.current_ensemble
    assert victim not in ensemble and len(w.metadata.ensembles) == 2
    ledger_id = int(w.ledger_id)
    # Later entries sit on the full write set (three replicas), none on the slow bookie.
    for entry_id in ids:
        holders = [
            b for b in ensemble if env.transport.storages[b].read_entry(ledger_id, entry_id)
        ]
        assert len(holders) == 3
    await w.close()


async def _closed_ledger_and_read_order(env: Env, n: int) -> tuple[int, list[BookieId]]:
    w = await env.client.create_ledger(3, 3, 2)
    await asyncio.gather(*(w.append_async(b"e%d" % i) for i in range(n)))
    await w.close()
    ensemble = w.metadata.current_ensemble
    order = list(env.client._read_order(w.metadata)(ensemble))
    return int(w.ledger_id), order


async def test_sim_reader_falls_back_to_range_reads_on_the_next_replica(env: Env) -> None:
    n = 600
    ledger_id, order = await _closed_ledger_and_read_order(env, n)
    env.transport.down.update(order[:-1])  # the first two replicas in read order fail
    env.transport.entry_reads = env.transport.range_reads = 0
    r = await env.client.open_ledger(ledger_id)
    payloads = [e.payload async for e in r.read()]
    assert payloads == [b"e%d" % i for i in range(n)]
    # Range reads on the next replica, not one entry read per entry.
    assert env.transport.entry_reads == 0
    assert env.transport.range_reads <= 3 * (n // 64 + 2)


async def test_sim_reader_after_a_short_read_continues_with_ranges(env: Env) -> None:
    n = 600
    ledger_id, order = await _closed_ledger_and_read_order(env, n)
    entries = env.transport.storages[order[0]]._entries[ledger_id]
    for entry_id in range(20, n):  # the first replica lost everything after entry 19
        del entries[entry_id]
    env.transport.entry_reads = env.transport.range_reads = 0
    r = await env.client.open_ledger(ledger_id)
    payloads = [e.payload async for e in r.read()]
    assert payloads == [b"e%d" % i for i in range(n)]
    assert env.transport.entry_reads == 0
    assert env.transport.range_reads <= 3 * (n // 64 + 2)


async def test_sim_reader_corrupt_copy_in_a_range_is_read_from_another_replica(env: Env) -> None:
    n = 300
    ledger_id, order = await _closed_ledger_and_read_order(env, n)
    env.transport.corrupt(order[0], ledger_id, 150)
    env.transport.entry_reads = env.transport.range_reads = 0
    r = await env.client.open_ledger(ledger_id)
    payloads = [e.payload async for e in r.read()]
    assert payloads == [b"e%d" % i for i in range(n)]
    assert env.transport.entry_reads <= 1  # only the bad entry, from the next replica


async def test_sim_recovery_fences_every_bookie_of_the_last_ensemble_before_any_read(
    env: Env, recoveries: list[str]
) -> None:
    w = await env.client.create_ledger(3, 3, 2)
    for i in range(5):
        await w.append(b"a%d" % i)
    victim = w.metadata.current_ensemble[0]
    env.transport.down.add(victim)
    await w.append(b"after the change")  # the last segment no longer holds the victim
    env.transport.down.discard(victim)
    await asyncio.gather(*(w.append_async(b"b%d" % i) for i in range(5)))
    last_ensemble = w.metadata.current_ensemble
    assert len(w.metadata.ensembles) == 2 and victim not in last_ensemble
    await w.abort()  # abandoned, open
    env.transport.calls.clear()
    other = await env.second_client()
    r = await other.open_ledger(w.ledger_id)
    calls = env.transport.calls
    first_read = next(i for i, c in enumerate(calls) if c[0] in ("read_entry", "read_range"))
    lac_reads = [c for c in calls[:first_read] if c[0] == "read_lac"]
    assert sorted(b for _, b, _ in lac_reads) == sorted(last_ensemble)
    assert all(fence for _, _, fence in lac_reads), lac_reads
    reads = [c for c in calls if c[0] in ("read_entry", "read_range")]
    assert reads and all(kind == "read_entry" and fence for kind, _, fence in reads), reads
    assert all(env.transport.storages[b].lac_state(w.ledger_id).fenced for b in last_ensemble)
    assert r.metadata.last_entry_id == 10 and recoveries == ["ok"]
    await other.close()


@pytest.mark.parametrize("seed", range(16))
async def test_sim_abandoned_writer_is_recovered_by_the_production_driver(
    seed: int, recoveries: list[str]
) -> None:
    """A writer abandoned mid-stream (confirmed entries, entries in flight, no close, no
    explicit LAC) is recovered by ``open_ledger``: in one attempt, rewriting its tail with
    the recovery flag, closed at or after its confirmed LAC, with the length of what it
    holds and every payload as appended."""
    rng = random.Random(seed)
    e, w, a = rng.choice([(3, 3, 2), (3, 2, 2), (4, 3, 2), (3, 3, 3), (4, 2, 2), (2, 2, 1), (5, 3, 2)])
    ids = [f"ab{i}" for i in range(e + 1)]
    store = await scriba.meta.connect(f"memory://abandoned-{uuid.uuid4().hex[:8]}")
    await register_bookies(store, ids)
    transport = RecordingTransport(ids)
    # no explicit LAC: pushes would raise the bookies' LAC to the last confirmed entry
    # before the abort as fast as the loop turns (one push per bookie), leaving nothing
    # above it to re-write
    no_push = dataclasses.replace(CONFIG, driver=dataclasses.replace(CONFIG.driver, explicit_lac_delay_s=None))
    clients = [
        await Client.connect(store.uri, store=store, transport=transport, config=no_push)
        for _ in range(2)
    ]
    try:
        writer = await clients[0].create_ledger(e, w, a, password=b"ab")
        payloads = [b"s%d-e%d-" % (seed, i) + b"x" * rng.randint(0, 50) for i in range(rng.randint(1, 40))]
        n_awaited = rng.randint(1, len(payloads))
        assert await asyncio.gather(
            *(writer.append_async(p) for p in payloads[:n_awaited])
        ) == list(range(n_awaited))
        in_flight = [writer.append_async(p) for p in payloads[n_awaited:]]
        for _ in range(rng.randint(0, 3)):
            await asyncio.sleep(0)
        confirmed = writer.last_add_confirmed
        await writer.abort()
        transport.calls.clear()
        r = await clients[1].open_ledger(writer.ledger_id, password=b"ab")
        last = r.metadata.last_entry_id
        assert recoveries == ["ok"], "recovery needed more than one attempt"
        assert confirmed <= last < len(payloads)
        assert [x.payload async for x in r.read()] == payloads[: last + 1]
        assert r.metadata.length == sum(len(p) for p in payloads[: last + 1])
        # The tail above every bookie's LAC (at least the last confirmed entry: its LAC
        # rides only on a later entry) was re-written, with the recovery flag.
        rewrites = [c for c in transport.calls if c[0] == "add"]
        assert rewrites and all(recovery for _, _, recovery in rewrites), rewrites
        await asyncio.gather(*in_flight, return_exceptions=True)
    finally:
        for c in clients:
            await c.close()
        await transport.close()
        await store.close()
