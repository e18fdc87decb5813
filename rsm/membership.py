"""The RSM's metadata records: member registrations, the leader election, a pending
leadership transfer, and the snapshot catalog's key.

    rsm/<group>/members/<replica_id>   ephemeral JSON: id, address, zone, role, token, applied
    rsm/<group>/transfer               JSON: target replica id, deadline (wall ms)
    rsm/<group>/snapshots              the snapshot catalog (``snapshots_core.SnapshotCatalog``)
    elections/rsm~<group>/leader       the election (``scriba.meta.election``); value: id + address

``<group>`` is ``<namespace with / as .>~<name>`` (one key segment). A replica id is
``[A-Za-z0-9][A-Za-z0-9._-]*``; a second live replica with the same id is refused
(its ephemeral registration already exists).

A registration is an ephemeral of the session that is live when it is written. A
session lost just before (a 2 s lease that expired while a loaded machine starved the
keep-alive) fails that write with ``SessionExpiredError`` and nothing is applied; the
store opens a new session at once, so the write is tried again under it
(:data:`REGISTER_RETRY`), and only a store that stays without a session fails the start.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass
from typing import Final

from scriba.errors import (
    ConfigError,
    KeyExistsError,
    NoSuchKeyError,
    ReplicaIdInUseError,
    SessionExpiredError,
)
from scriba.meta.store import MetadataStore
from scriba.retry import RetryPolicy, retry_async
from scriba.stream.settings import check_name, check_namespace_name

REGISTER_RETRY: Final = RetryPolicy(attempts_max=40, delay_s_min=0.05, delay_s_max=1.0).validate()
"""An ephemeral write waits out about 20-40 s without a session, then the error stands."""


def _session_replaced(error: BaseException) -> bool:
    return isinstance(error, SessionExpiredError)


async def create_ephemeral(store: MetadataStore, key: str, value: bytes) -> int:
    """``store.create(ephemeral=True)`` under the live session, riding out a session being replaced."""
    return await retry_async(
        lambda: store.create(key, value, ephemeral=True),
        policy=REGISTER_RETRY, what=f"create {key}", retry_if=_session_replaced,
    )


def group_token(namespace: str, name: str) -> str:
    return f"{check_namespace_name(namespace).replace('/', '.')}~{check_name(name, 'state machine')}"


def check_replica_id(replica_id: object) -> str:
    return check_name(replica_id, "replica id")


def members_prefix(group: str) -> str:
    return f"rsm/{group}/members/"


def member_key(group: str, replica_id: str) -> str:
    return f"{members_prefix(group)}{replica_id}"


def transfer_key(group: str) -> str:
    return f"rsm/{group}/transfer"


def catalog_key(group: str) -> str:
    return f"rsm/{group}/snapshots"


def election_name(group: str) -> str:
    return f"rsm~{group}"


@dataclass(frozen=True, slots=True)
class Member:
    replica_id: str
    address: str
    zone: str = ""
    role: str = "follower"
    token: int = 0
    applied: str = ""

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Member:
        try:
            return cls(**json.loads(data))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"rsm member record does not decode: {exc}") from None


@dataclass(frozen=True, slots=True)
class LeaderClaim:
    replica_id: str
    address: str

    def to_bytes(self) -> bytes:
        return json.dumps({"replica_id": self.replica_id, "address": self.address}).encode()


async def register(store: MetadataStore, group: str, member: Member) -> int:
    """Create the ephemeral registration; ``ReplicaIdInUseError`` if that id is live.

    A record the live session already owns is this replica's own, from an attempt whose
    answer was lost (a start-up step tried again, ``meta/startup.py``): it is kept (its
    value brought up to date), not refused, and nothing is registered twice."""
    key = member_key(group, member.replica_id)
    try:
        return await create_ephemeral(store, key, member.to_bytes())
    except KeyExistsError:
        with contextlib.suppress(NoSuchKeyError):
            found = await store.get(key)
            if found.owner and found.owner == store.session.session_id:
                return await store.set(key, member.to_bytes(), expected_version=found.version)
        raise ReplicaIdInUseError(
            f"replica id {member.replica_id!r} of {group} is already running (its registration exists); "
            "pick another id or stop that replica"
        ) from None


async def update_member(store: MetadataStore, group: str, member: Member) -> None:
    key = member_key(group, member.replica_id)
    try:
        current = await store.get(key)
        await store.set(key, member.to_bytes(), expected_version=current.version)
    except NoSuchKeyError:
        await create_ephemeral(store, key, member.to_bytes())


async def list_members(store: MetadataStore, group: str) -> list[Member]:
    return [Member.from_bytes(v.value) async for _, v in store.scan(members_prefix(group))]


async def deregister(store: MetadataStore, group: str, replica_id: str) -> None:
    try:
        await store.delete(member_key(group, replica_id))
    except NoSuchKeyError:
        pass
