"""Refused adds on real bookie processes (#23 A2, A3): no ensemble change, the writer goes on.

- A payload over the bookies' limit (6 MiB against the default 5 MiB, advertised in
  their registrations) is refused by the client before anything is sent.
- A bookie that refuses an add as a request error (BAD_REQUEST for an entry over a
  limit the writer did not know, UNAUTHORIZED for a wrong master key) fails the append
  with that error; the writer is not moved to other bookies. The intruder case uses
  E=2, Qa=1 and two spare bookies: were UNAUTHORIZED taken for a bookie failure, a fresh
  bookie (which binds the first key it sees) would confirm the intruder's entry.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from scriba.client import Client, ClientConfig
from scriba.client.driver import DriverConfig
from scriba.client.write_core import WriteCore
from scriba.client.writer import LedgerWriter
from scriba.entry import ENTRY_SIZE_MAX_DEFAULT, make_digest, master_key
from scriba.errors import BadRequestError, EntryTooLargeError, ScribaError, UnauthorizedError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.testing.waiting import eventually

CONFIG = ClientConfig(
    add_timeout_s=5.0, bookie_wait_s=20.0,
    driver=DriverConfig(read_timeout_s=5.0, metadata_timeout_s=10.0, long_poll_s=0.5),
)
SMALL_LIMIT = 64 * 1024


@pytest.fixture
async def client(bookie_cluster: Any, request: pytest.FixtureRequest) -> AsyncIterator[Client]:
    extra = getattr(request, "param", ())
    bookie_cluster.start_bookies(4, zones=["z1", "z2", "z3", "z1"], extra_args=extra)
    async with Client.connect(bookie_cluster.metadata_uri, config=CONFIG) as c:
        await c.registry.wait_for_bookies(4, 20.0)
        yield c


class Chooser:
    """Replacement choice from the registered bookies, counting the calls."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.calls = 0

    def __call__(self, ensemble: tuple[BookieId, ...], index: int, exclude: frozenset[BookieId]) -> BookieId:
        self.calls += 1
        return next(b for b in self.client.registry.writable_bookies() if b not in exclude)


class Limits:
    entry_size_max = ENTRY_SIZE_MAX_DEFAULT  # what a writer with a stale view believes


def second_writer(client: Client, original: LedgerWriter, password: bytes, limits: Any = None) -> tuple[LedgerWriter, Chooser]:
    """Another writer on ``original``'s ledger (as a buggy or hostile client would open it)."""
    chooser = Chooser(client)
    core = WriteCore(original.metadata, digest=make_digest("crc32c", password), choose_replacement=chooser)
    writer = LedgerWriter(
        core, store=client.store, transport=client.transport, master_key=master_key(password),
        config=CONFIG.driver, limits=limits,
    )
    return writer, chooser


async def test_a_6_mib_append_is_refused_at_once_and_the_ledger_goes_on(client: Client) -> None:
    transport: Any = client.transport
    assert client.registry.entry_size_max == ENTRY_SIZE_MAX_DEFAULT  # advertised by every bookie
    w = await client.create_ledger(3, 3, 2)
    ensemble = w.metadata.current_ensemble
    sent = transport.entries_sent
    with pytest.raises(EntryTooLargeError, match=(
        rf"payload of {6 * 1024 * 1024} bytes exceeds the limit of {ENTRY_SIZE_MAX_DEFAULT - 36} bytes "
        rf"\(the bookies' entry_size_max of {ENTRY_SIZE_MAX_DEFAULT} bytes"
    )):
        await asyncio.wait_for(w.append(b"x" * (6 * 1024 * 1024)), 5)
    assert transport.entries_sent == sent  # nothing went to a bookie
    assert await asyncio.wait_for(w.append(b"after"), 10) == 0
    largest = b"L" * w.payload_bytes_max
    assert await asyncio.wait_for(w.append(largest), 30) == 1  # exactly the limit: stored
    await asyncio.wait_for(w.close(), 10)
    md = await client.ledger_metadata(w.ledger_id)
    assert md.ensembles == ((0, ensemble),) and md.last_entry_id == 1  # 0 ensemble changes
    r = await client.open_ledger(w.ledger_id)
    assert [e.payload async for e in r.read()] == [b"after", largest]


@pytest.mark.parametrize("client", [("--entry-size-max", str(SMALL_LIMIT))], indirect=True)
async def test_bookies_advertise_their_limit_and_refuse_beyond_it(client: Client) -> None:
    assert client.registry.entry_size_max == SMALL_LIMIT
    w = await client.create_ledger(3, 3, 2)
    with pytest.raises(EntryTooLargeError, match=f"entry_size_max of {SMALL_LIMIT} bytes"):
        await w.append(b"y" * SMALL_LIMIT)
    assert await w.append(b"fits") == 0
    # A writer that believes the limit is larger: the bookies answer BAD_REQUEST, a request
    # error. The append fails with it and no bookie is replaced.
    stale, chooser = second_writer(client, await client.create_ledger(3, 3, 2), b"", Limits())
    with pytest.raises(BadRequestError, match="refused entry 0"):
        await asyncio.wait_for(stale.append(b"z" * (SMALL_LIMIT + 1)), 10)
    assert chooser.calls == 0
    with pytest.raises(BadRequestError):
        await stale.append(b"later")  # the writer failed: it cannot skip entry 0
    await asyncio.wait_for(stale.close(), 10)  # closes at its last confirmed entry
    md = await client.ledger_metadata(stale.ledger_id)
    assert md.is_closed and md.last_entry_id == -1 and len(md.ensembles) == 1
    await w.close()


async def holds_entry_0(client: Client, writer: LedgerWriter, ensemble: tuple[BookieId, ...]) -> bool:
    """Whether every bookie of ``ensemble`` answers a read of ``writer``'s entry 0."""
    for bookie in ensemble:
        try:
            await client.transport.read_entry(
                bookie, LedgerId(writer.ledger_id), EntryId(0), master_key=master_key(b"pw"), timeout_s=5.0,
            )
        except ScribaError:
            return False
    return True


async def test_a_wrong_master_key_is_refused_not_moved_to_a_fresh_bookie(client: Client) -> None:
    owner = await client.create_ledger(2, 2, 1, password=b"pw")
    ensemble = owner.metadata.current_ensemble
    assert await owner.append(b"owner's entry") == 0
    # Qa=1 confirmed entry 0 at one bookie; the other binds the first key it sees, so the
    # intruder writes only once both hold the owner's entry (else it races the owner there)
    await eventually(lambda: holds_entry_0(client, owner, ensemble), 20.0, what="both bookies hold entry 0")
    intruder, chooser = second_writer(client, owner, b"wrong")
    with pytest.raises(UnauthorizedError, match="rejected the master key"):
        await asyncio.wait_for(intruder.append(b"intruder's entry"), 10)
    assert chooser.calls == 0
    assert (await client.ledger_metadata(owner.ledger_id)).ensembles == ((0, ensemble),)
    assert await owner.append(b"owner again") == 1
    await owner.close()
    r = await client.open_ledger(owner.ledger_id, password=b"pw")
    assert [e.payload async for e in r.read()] == [b"owner's entry", b"owner again"]
