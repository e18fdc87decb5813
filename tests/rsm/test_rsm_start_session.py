"""A replica whose metadata session is lost while it starts (RSM start path, #13).

Under heavy load a 2 s etcd lease can expire right after the store connected, before
``start`` registers the replica. The start must go on under the new session (the
registration is an ephemeral of the session that is live when it is made) or fail
with a typed error -- never hang.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from rsm_machines import Counter

from scriba.client import Client, ClientConfig
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
