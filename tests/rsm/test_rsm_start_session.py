"""A replica whose metadata session is lost, or whose store does not answer, while it
starts (RSM start path, #13; ``meta/startup.py``).

Under heavy load a 2 s etcd lease can expire right after the store connected, before
``start`` registers the replica, and a request can time out after the store applied it.
The start must go on under the new session (the registration is an ephemeral of the
session that is live when it is made), keep a registration whose answer was lost
instead of refusing its own id, or fail at its bound with a typed error naming the step
-- never hang.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from rsm_machines import Counter

from scriba.client import Client, ClientConfig
from scriba.errors import MetadataUnavailableError, ReplicaIdInUseError
from scriba.meta import connect
from scriba.meta.etcd import EtcdStore
from scriba.rsm import ReplicatedStateMachine, RsmConfig
from scriba.rsm import membership as mb
from scriba.testing.waiting import eventually

pytestmark = [pytest.mark.timeout(120)]

START_S = 60.0


@pytest.fixture
async def client(backend: str) -> AsyncIterator[Client]:
    store = await connect(backend, session_timeout_s=2.0)
    client = await Client.connect(backend, store=store, config=ClientConfig(add_timeout_s=5.0))
    try:
        yield client
    finally:
        await client.close()
        await store.close()


async def test_a_lease_lost_before_registration_gets_a_new_session_and_the_start_goes_on(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    store = client.store
    assert isinstance(store, EtcdStore)
    old = store.session.session_id
    real_create = store.create
    revoked = []

    async def create(key: str, value: bytes, *, ephemeral: bool = False) -> int:
        if ephemeral and not revoked:  # the lease expires just before the registration is written
            revoked.append(key)
            await store.revoke_lease_for_test()
        return await real_create(key, value, ephemeral=ephemeral)

    monkeypatch.setattr(store, "create", create)
    rsm = ReplicatedStateMachine(client, namespace=f"s{uuid.uuid4().hex[:8]}", name="counter", state_machine=Counter(),
                                 replica_id="r1", config=RsmConfig())
    await asyncio.wait_for(rsm.start(), START_S)
    try:
        assert revoked and store.session.session_id != old
        members = await mb.list_members(store, rsm.group)
        assert [m.replica_id for m in members] == ["r1"]  # registered under the live session
        await eventually(lambda: rsm.is_leader, START_S, what="the started replica leads")
    finally:
        await rsm.stop()


def _replica(client: Client, **config: float) -> ReplicatedStateMachine:
    return ReplicatedStateMachine(client, namespace=f"s{uuid.uuid4().hex[:8]}", name="counter",
                                  state_machine=Counter(), replica_id="r1", config=RsmConfig(**config))


def failing_registrations(store: Any, monkeypatch: pytest.MonkeyPatch, *, applied: bool, times: int) -> list[str]:
    """Make the store's first ``times`` ephemeral creates fail with a retriable error, after
    the store applied them (``applied``: the answer was lost) or not; returns their keys."""
    real_create = store.create
    failed: list[str] = []

    async def create(key: str, value: bytes, *, ephemeral: bool = False) -> int:
        if not ephemeral or len(failed) >= times:
            return await real_create(key, value, ephemeral=ephemeral)
        failed.append(key)
        if applied:
            await real_create(key, value, ephemeral=ephemeral)
        raise MetadataUnavailableError(f"create {key}: no answer")

    monkeypatch.setattr(store, "create", create)
    return failed


async def test_a_registration_whose_answer_was_lost_is_kept_and_the_start_goes_on(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = client.store
    lost = failing_registrations(store, monkeypatch, applied=True, times=1)
    rsm = _replica(client)
    await asyncio.wait_for(rsm.start(), START_S)
    try:
        assert lost  # the step was tried again, and found its own record
        members = await mb.list_members(store, rsm.group)
        assert [m.replica_id for m in members] == ["r1"]
        found = await store.get(lost[0])
        assert found.owner == store.session.session_id
        await eventually(lambda: rsm.is_leader, START_S, what="the started replica leads")
    finally:
        await rsm.stop()


async def test_a_registration_that_keeps_failing_ends_the_start_at_its_bound_naming_the_step(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = client.store
    calls = failing_registrations(store, monkeypatch, applied=False, times=1_000_000)
    rsm = _replica(client, start_timeout_s=1.0)
    with pytest.raises(MetadataUnavailableError, match=r"replica r1 of .*: register still failing at the end of its 1s"):
        await asyncio.wait_for(rsm.start(), START_S)
    assert len(calls) >= 2  # retried, then gave up at the bound
    assert await mb.list_members(store, rsm.group) == []


async def test_the_same_id_registered_by_another_session_is_still_refused(backend: str, client: Client) -> None:
    group = mb.group_token(f"s{uuid.uuid4().hex[:8]}", "counter")
    member = mb.Member(replica_id="r1", address="", zone="", role="follower")
    await mb.register(client.store, group, member)
    assert await mb.register(client.store, group, member) >= 0  # its own session: kept
    other = await connect(backend, session_timeout_s=2.0)
    try:
        with pytest.raises(ReplicaIdInUseError):
            await mb.register(other, group, member)
    finally:
        await other.close()
    assert [m.replica_id for m in await mb.list_members(client.store, group)] == ["r1"]


async def test_a_member_record_rewritten_after_a_lost_lease_is_made_under_the_new_session(client: Client) -> None:
    """``update_member`` (a role change, a replaced session) recreates a missing record
    with ``create_ephemeral``, which rides out a session being replaced on its own: no
    start-up retry is around it there."""
    store = client.store
    assert isinstance(store, EtcdStore)
    group = mb.group_token(f"s{uuid.uuid4().hex[:8]}", "counter")
    old = store.session.session_id
    await store.revoke_lease_for_test()  # the lease is gone just before the record is written
    await mb.update_member(store, group, mb.Member(replica_id="r1", address="", role="leader"))
    found = await store.get(mb.member_key(group, "r1"))
    assert found.owner == store.session.session_id != old
