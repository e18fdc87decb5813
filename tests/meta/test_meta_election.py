"""Election details beyond the contract hand-over: lost on suspension or a vanished record,
resign, observe, one campaign at a time. Run on memory:// (the same code runs on every driver)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest

from scriba.errors import BadRequestError, MetadataUnavailableError
from scriba.meta import connect
from scriba.meta import election as election_module
from scriba.meta.election import Election
from scriba.meta.memory import MemoryStore
from scriba.meta.store import MetadataStore, SessionState
from scriba.retry import RetryPolicy

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


def lossy_create(store: MetadataStore, *, lose_answers: int, apply: bool = True) -> list[int]:
    """Make ``store.create`` fail with "outcome unknown" ``lose_answers`` times (after applying it)."""
    real = store.create
    calls = [0]

    async def create(key: str, value: bytes, *, ephemeral: bool = False) -> int:
        calls[0] += 1
        if calls[0] > lose_answers:
            return await real(key, value, ephemeral=ephemeral)
        if apply:
            await real(key, value, ephemeral=ephemeral)
        raise MetadataUnavailableError("create: no answer (outcome unknown)")

    store.create = create  # type: ignore[method-assign]
    return calls


async def test_a_campaign_whose_create_answer_was_lost_still_leads(stores: list[MetadataStore]) -> None:
    store = stores[0]
    calls = lossy_create(store, lose_answers=1)  # our record exists; we were not told
    lead = await asyncio.wait_for(Election(store, "g").campaign("a"), WAIT_S)  # must not wait for itself
    assert calls[0] == 2
    assert await Election(stores[1], "g").leader() == ("a", lead.token)


async def test_a_campaign_retries_an_unreachable_store_then_gives_up(
    stores: list[MetadataStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(election_module, "CAMPAIGN_RETRY", RetryPolicy(attempts_max=4, delay_s_min=0.001, delay_s_max=0.002))
    calls = lossy_create(stores[0], lose_answers=2, apply=False)
    lead = await asyncio.wait_for(Election(stores[0], "g").campaign("a"), WAIT_S)
    assert calls[0] == 3 and lead.token > 0
    calls = lossy_create(stores[1], lose_answers=100, apply=False)
    with pytest.raises(MetadataUnavailableError):
        await asyncio.wait_for(Election(stores[1], "h").campaign("b"), WAIT_S)
    assert calls[0] == 4


async def test_a_campaign_cancelled_after_its_claim_landed_withdraws_it(stores: list[MetadataStore]) -> None:
    store = stores[0]
    real_get = store.get
    landed = asyncio.Event()
    hold = asyncio.Event()
    calls = [0]

    async def get(key: str) -> object:
        calls[0] += 1
        if calls[0] == 1:  # the campaign's read-back after its create landed
            landed.set()
            await hold.wait()
        return await real_get(key)

    store.get = get  # type: ignore[method-assign,assignment]
    task = asyncio.create_task(Election(store, "g").campaign("a"))
    await asyncio.wait_for(landed.wait(), WAIT_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The claim is gone at once (not at the end of the session): another candidate leads.
    lead_b = await asyncio.wait_for(Election(stores[1], "g").campaign("b"), WAIT_S)
    assert await Election(stores[2], "g").leader() == ("b", lead_b.token)
    assert store.session.state is not SessionState.LOST


async def test_a_vacancy_watch_that_fails_sends_the_campaign_back_to_claiming(
    stores: list[MetadataStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watch gives up after a long outage (it cannot vouch that it missed nothing): the
    campaign claims again, re-reading the record, instead of ending on the failed wait."""
    lead = await Election(stores[0], "g").campaign("a")
    waiting = Election(stores[1], "g")
    real_wait = waiting._wait_vacant
    failures: list[str] = []

    async def wait_vacant() -> None:
        if not failures:
            failures.append("watch")
            raise MetadataUnavailableError("watch elections/g/leader: etcd unreachable for 60s")
        await real_wait()

    monkeypatch.setattr(waiting, "_wait_vacant", wait_vacant)
    campaign = asyncio.create_task(waiting.campaign("b"))
    await asyncio.sleep(0)
    await stores[0].delete("elections/g/leader")  # the leader goes while b re-claims
    second = await asyncio.wait_for(campaign, WAIT_S)
    assert failures and second.candidate == "b" and second.token > lead.token
