"""The public Client API against real bookie processes, real etcd and the gRPC transport.

Fixtures from ``scriba.testing.fixtures``: ``bookie_cluster`` (bookie processes on a
fresh etcd prefix). R1 and R2 also run many more trials against in-process bookies in
``tests/sim/test_sim_client_async.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from scriba.client import Client, ClientConfig, SyncClient
from scriba.client.driver import DriverConfig
from scriba.entry import make_digest, master_key, pack_entry
from scriba.errors import (
    LedgerFencedError,
    NoSuchLedgerError,
    Status,
    UnauthorizedError,
)
from scriba.ids import BookieId, EntryId, LedgerId

CONFIG = ClientConfig(
    add_timeout_s=5.0, bookie_wait_s=20.0,
    driver=DriverConfig(read_timeout_s=5.0, metadata_timeout_s=10.0, long_poll_s=0.5),
)


@pytest.fixture
async def client(bookie_cluster: Any) -> AsyncIterator[Client]:
    bookie_cluster.start_bookies(3, zones=["z1", "z2", "z3"])
    async with Client.connect(bookie_cluster.metadata_uri, config=CONFIG) as c:
        await c.registry.wait_for_bookies(3, 20.0)
        yield c


async def test_client_api_write_read_close(client: Client) -> None:
    w = await client.create_ledger(3, 3, 2, password=b"pw")
    futures = [w.append_async(b"entry-%05d" % i + b"x" * 1000) for i in range(2000)]
    assert await asyncio.gather(*futures) == list(range(2000))
    await w.close()
    r = await client.open_ledger(w.ledger_id, password=b"pw")
    assert r.metadata.last_entry_id == 1999
    got = [e async for e in r.read(0, 1999)]
    assert [e.entry_id for e in got] == list(range(2000))
    assert all(e.payload.startswith(b"entry-%05d" % e.entry_id) for e in got)
    assert await r.read_last_add_confirmed() == 1999
    assert w.ledger_id in await client.list_ledgers()
    await client.delete_ledger(w.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        await client.open_ledger(w.ledger_id, password=b"pw")


async def test_client_api_hmac_digest_and_wrong_password(client: Client) -> None:
    w = await client.create_ledger(3, 2, 2, password=b"secret", digest="hmac-sha256")
    for i in range(20):
        await w.append(b"h%d" % i)
    with pytest.raises(UnauthorizedError):
        await client.open_ledger(w.ledger_id, password=b"not-it")
    # The wrong-password open touched no bookie: the writer is not fenced.
    assert await w.append(b"still mine") == 20
    await w.close()
    r = await client.open_ledger(w.ledger_id, password=b"secret")
    assert [e.payload async for e in r.read()] == [b"h%d" % i for i in range(20)] + [b"still mine"]


@pytest.mark.slow
async def test_client_api_r1_recovery_fences_old_writer(client: Client, bookie_cluster: Any) -> None:
    trials = 50
    fenced = 0
    async with Client.connect(bookie_cluster.metadata_uri, config=CONFIG) as other:
        for trial in range(trials):
            w = await client.create_ledger(3, 3, 2, password=b"pw")
            pending = [w.append_async(b"r1-%d-%d" % (trial, i)) for i in range(50)]
            await pending[trial % 10]
            r = await other.open_ledger(w.ledger_id, password=b"pw")
            try:
                for _ in range(3):
                    await w.append(b"after")
            except LedgerFencedError:
                fenced += 1
            await asyncio.gather(*pending, return_exceptions=True)
            assert w.last_add_confirmed <= r.metadata.last_entry_id
        assert fenced == trials
        # The fence survives a bookie restart: a raw add from the old writer's key is refused.
        bookie_cluster.restart(0)
        await client.registry.wait_for_bookies(3, 20.0)
        md = r.metadata
        digest = make_digest("crc32c", b"pw")
        key = master_key(b"pw")
        entry_id = md.last_entry_id + 1
        data = pack_entry(digest, md.ledger_id, entry_id, md.last_entry_id, md.length + 1, b"z")
        answers: asyncio.Queue[Status] = asyncio.Queue()
        target = BookieId(bookie_cluster[0].bookie_id)
        if target in md.current_ensemble:
            # Dial the restarted bookie until it answers (bounded by a deadline).
            status = Status.UNAVAILABLE
            async with asyncio.timeout(30):
                while status in (Status.UNAVAILABLE, Status.TIMEOUT):
                    client.transport.add(
                        target, LedgerId(md.ledger_id), EntryId(entry_id), key, data,
                        lambda _b, _l, _e, s: answers.put_nowait(s),
                    )
                    status = await answers.get()
                    if status in (Status.UNAVAILABLE, Status.TIMEOUT):
                        await asyncio.sleep(0.2)  # retry pacing, not synchronisation
            assert status == Status.FENCED


async def test_client_api_r2_concurrent_recoveries_agree(client: Client, bookie_cluster: Any) -> None:
    others = [await Client.connect(bookie_cluster.metadata_uri, config=CONFIG) for _ in range(3)]
    try:
        for rep in range(10):
            w = await client.create_ledger(3, 3, 2, password=b"pw")
            pending = [w.append_async(b"r2-%d-%d" % (rep, i)) for i in range(30)]
            await pending[rep]
            readers = await asyncio.gather(*(o.open_ledger(w.ledger_id, password=b"pw") for o in others))
            lasts = {r.metadata.last_entry_id for r in readers}
            assert len(lasts) == 1, f"repetition {rep}: {lasts}"
            contents = [[e.payload async for e in r.read()] for r in readers]
            assert all(c == contents[0] for c in contents)
            await asyncio.gather(*pending, return_exceptions=True)
    finally:
        for o in others:
            await o.close()


async def test_client_api_corrupt_replica_served_by_another(client: Client) -> None:
    w = await client.create_ledger(3, 3, 2)
    first = w.metadata.current_ensemble[0]
    # Plant a corrupt copy of entry 0 on the bookie read first; it keeps the first bytes
    # it was given, so the writer's later add of entry 0 leaves the corrupt copy there.
    digest = make_digest("crc32c", b"")
    good = pack_entry(digest, w.ledger_id, 0, -1, 4, b"good")
    bad = good[:-1] + b"X"
    answers: asyncio.Queue[Status] = asyncio.Queue()
    client.transport.add(first, w.ledger_id, EntryId(0), master_key(b""), bad,
                         lambda _b, _l, _e, s: answers.put_nowait(s))
    async with asyncio.timeout(10):
        assert await answers.get() == Status.OK
    assert await w.append(b"good") == 0
    await w.append(b"next")
    await w.close()
    r = await client.open_ledger(w.ledger_id)
    assert [e.payload async for e in r.read()] == [b"good", b"next"]


async def test_client_api_tailing_reader(client: Client) -> None:
    w = await client.create_ledger(3, 2, 2, password=b"t")
    r = await client.open_ledger(w.ledger_id, password=b"t", recovery=False)

    async def write() -> None:
        for i in range(300):
            if i % 100 == 99:
                await asyncio.sleep(0.3)  # let the reader catch up and long-poll
            await w.append(b"t%d" % i)
        await w.close()

    task = asyncio.create_task(write())
    got = []
    async with asyncio.timeout(60):
        async for entry in r.tail(0):
            got.append(entry.payload)
    await task
    assert got == [b"t%d" % i for i in range(300)]


def test_client_api_sync_client(bookie_cluster: Any) -> None:
    bookie_cluster.start_bookies(3)
    with SyncClient.connect(bookie_cluster.metadata_uri, config=CONFIG) as c:
        w = c.create_ledger(3, 3, 2, password=b"sync")
        assert w.append(b"a") == 0
        assert w.append_many([b"b%d" % i for i in range(100)]) == list(range(1, 101))
        w.close()
        r = c.open_ledger(w.ledger_id, password=b"sync")
        assert [e.payload for e in r.read()] == [b"a"] + [b"b%d" % i for i in range(100)]
        assert w.ledger_id in c.list_ledgers()
