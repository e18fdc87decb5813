"""Election details beyond the contract hand-over: lost on suspension or a vanished record,
resign, observe, one campaign at a time. Run on memory:// (the same code runs on every driver)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest

from scriba.errors import BadRequestError
from scriba.meta import connect
from scriba.meta.election import Election
from scriba.meta.memory import MemoryStore
from scriba.meta.store import MetadataStore, SessionState

WAIT_S = 5.0


@pytest.fixture
async def stores() -> AsyncIterator[list[MetadataStore]]:
    uri = f"memory://e{uuid.uuid4().hex[:10]}"
    opened = [await connect(uri) for _ in range(3)]
    yield opened
    for s in opened:
        await s.close()


async def test_a_suspension_longer_than_the_grace_loses_leadership(stores: list[MetadataStore]) -> None:
    store = stores[0]
    assert isinstance(store, MemoryStore)
    lead = await Election(store, "g", suspended_grace_s=0.1).campaign("a")
    store.session.set_state(SessionState.SUSPENDED)  # what a driver does when keep-alives fail
    await asyncio.wait_for(lead.lost.wait(), WAIT_S)
    assert "suspended" in lead.reason


async def test_a_short_suspension_keeps_leadership(stores: list[MetadataStore]) -> None:
    store = stores[0]
    assert isinstance(store, MemoryStore)
    lead = await Election(store, "g", suspended_grace_s=5.0).campaign("a")
    store.session.set_state(SessionState.SUSPENDED)
    store.session.set_state(SessionState.CONNECTED)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(lead.lost.wait()), 0.2)
    assert not lead.lost.is_set()


async def test_leadership_is_lost_when_the_record_is_deleted(stores: list[MetadataStore]) -> None:
    lead = await Election(stores[0], "g").campaign("a")
    await stores[1].delete("elections/g/leader")  # e.g. an operator
    await asyncio.wait_for(lead.lost.wait(), WAIT_S)
    assert lead.reason == "leader record gone"


async def test_observe_reports_none_then_each_leader(stores: list[MetadataStore]) -> None:
    seen: list[tuple[str, int] | None] = []
    async with contextlib.aclosing(Election(stores[2], "g").observe()) as leaders:
        seen.append(await asyncio.wait_for(anext(leaders), WAIT_S))
        a = Election(stores[0], "g")
        lead_a = await a.campaign("a", b"payload")
        seen.append(await asyncio.wait_for(anext(leaders), WAIT_S))
        b_task = asyncio.create_task(Election(stores[1], "g").campaign("b"))
        await a.resign()
        lead_b = await asyncio.wait_for(b_task, WAIT_S)
        while seen[-1] != ("b", lead_b.token):
            seen.append(await asyncio.wait_for(anext(leaders), WAIT_S))
    assert seen[0] is None and seen[1] == ("a", lead_a.token) and seen[-1] == ("b", lead_b.token)
    assert lead_b.token > lead_a.token


async def test_one_campaign_at_a_time_and_names_are_checked(stores: list[MetadataStore]) -> None:
    election = Election(stores[0], "g")
    await election.campaign("a")
    with pytest.raises(BadRequestError):
        await election.campaign("a-again")
    with pytest.raises(BadRequestError):
        Election(stores[0], "bad/name")
    await election.resign()
    assert await election.leader() is None
    again = await election.campaign("a")  # a resigned candidate may run again
    assert not again.lost.is_set()
