"""High availability: where each namenode's WebHDFS endpoint is, and ``haadmin``.

    await register(client, "nn", Registration("nn1", "http://127.0.0.1:9870", zone="z1", pid=123))
    await registrations(client, "nn")        # the live namenodes of edit-log namespace "nn"
    scriba-namenode haadmin --metadata URI -getServiceState nn1

Records (this example's key prefix; ephemeral, so a dead namenode's record goes with
its metadata session)::

    examples/namenode/<namespace>/<replica_id>    JSON: id, url, zone, pid

Roles are the RSM's: the leader is **active**, every other replica a **standby**.
Automatic fail-over is the RSM's election (a dead active's session lapses, a standby
wins, fences the edit log and catches up). A *graceful* fail-over is the RSM's
leadership transfer, asked of the active over HTTP (``POST /scriba/ha/transfer``):
the active stops proposing, the target campaigns alone until it leads, fences the
old writer and catches up. Unlike Hadoop's ``haadmin``, ``-transitionToActive`` and
``-transitionToStandby`` need no ``--forcemanual``: they are leadership transfers,
fenced like any election, so they cannot make two actives.

``haadmin`` verbs, as Hadoop names them (exit 0 on success, 1 with a message on stderr):

- ``-getServiceState ID``: prints ``active`` or ``standby``;
- ``-getAllServiceState``: ``ID  URL  state`` for every live namenode;
- ``-checkHealth ID``: exit 0 when the namenode answers and its replica has not stopped;
- ``-failover FROM TO``: FROM must be active; hands the role to TO, waits until TO is active;
- ``-transitionToStandby ID``: the active ID hands its role to the most caught-up standby;
- ``-transitionToActive ID``: the current active hands its role to ID.

Changes of state are the superuser's (``--user``, default ``hdfs``; WebHDFS's simple
``user.name`` identity, as HDFS without Kerberos): another user gets
``AccessControlException``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Final

import aiohttp

from scriba.client import Client
from scriba.errors import KeyExistsError, NoSuchKeyError, ScribaError

PREFIX: Final = "examples/namenode"
HTTP_TIMEOUT_S: Final = 30.0
KEEP_EVERY_S: Final = 0.5


class HaAdminError(Exception):
    """What ``haadmin`` prints on stderr before exiting 1."""


@dataclass(frozen=True, slots=True)
class Registration:
    id: str
    url: str
    zone: str = ""
    pid: int = 0

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @staticmethod
    def from_bytes(data: bytes) -> Registration:
        return Registration(**json.loads(data))


def registration_key(namespace: str, replica_id: str) -> str:
    return f"{PREFIX}/{namespace.replace('/', '.')}/{replica_id}"


async def register(client: Client, namespace: str, registration: Registration) -> None:
    """Publish this namenode's endpoint (ephemeral). A record left by this id's previous,
    killed process (its session not yet lapsed) is replaced: the RSM already refused a
    second *live* replica with this id."""
    key = registration_key(namespace, registration.id)
    for _ in range(3):
        try:
            await client.store.create(key, registration.to_bytes(), ephemeral=True)
            return
        except KeyExistsError:
            with contextlib.suppress(NoSuchKeyError):
                await client.store.delete(key)
    raise HaAdminError(f"could not register {key}: it keeps reappearing")


async def keep_registered(client: Client, namespace: str, registration: Registration,
                          every_s: float = KEEP_EVERY_S) -> None:
    """Publish again whenever the record is gone (a LOST metadata session took its
    ephemerals; the client's new session does not bring them back). Runs until cancelled."""
    key = registration_key(namespace, registration.id)
    while True:
        await asyncio.sleep(every_s)
        try:
            await client.store.get(key)
        except NoSuchKeyError:
            with contextlib.suppress(ScribaError, HaAdminError):
                await register(client, namespace, registration)
        except ScribaError:
            pass  # the store is unreachable now: try again at the next turn


async def registrations(client: Client, namespace: str) -> dict[str, Registration]:
    prefix = f"{PREFIX}/{namespace.replace('/', '.')}/"
    return {key[len(prefix):]: Registration.from_bytes(v.value) for key, v in await client.store.list(prefix)}


# --- haadmin ------------------------------------------------------------------------------
class HaAdmin:
    def __init__(self, nodes: dict[str, Registration], http: aiohttp.ClientSession, user: str = "hdfs") -> None:
        self.nodes, self.http, self.user = nodes, http, user

    def url(self, replica_id: str) -> str:
        node = self.nodes.get(replica_id)
        if node is None:
            raise HaAdminError(f"no live namenode {replica_id!r} (live: {', '.join(sorted(self.nodes)) or 'none'})")
        return node.url

    async def status(self, replica_id: str) -> dict[str, Any]:
        try:
            async with self.http.get(f"{self.url(replica_id)}/scriba/status") as answer:
                return dict(await answer.json())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise HaAdminError(f"namenode {replica_id} at {self.url(replica_id)} does not answer: {exc!r}") from None

    async def state(self, replica_id: str) -> str:
        return str((await self.status(replica_id))["role"])

    async def active(self) -> str | None:
        for replica_id in sorted(self.nodes):
            with contextlib.suppress(HaAdminError):
                if await self.state(replica_id) == "active":
                    return replica_id
        return None

    async def check_health(self, replica_id: str) -> None:
        status = await self.status(replica_id)
        if status["rsm"].get("stopped"):
            raise HaAdminError(f"namenode {replica_id} is unhealthy: its replica stopped: {status['rsm']['stopped']}")

    async def transfer(self, source: str, target: str | None) -> str:
        """Ask the active ``source`` to hand its role to ``target`` (None: the most caught-up
        standby); returns the new active once it serves as active."""
        params = {"user.name": self.user, **({"to": target} if target else {})}
        async with self.http.post(f"{self.url(source)}/scriba/ha/transfer", params=params) as answer:
            body = await answer.json()
            if answer.status != 200:
                raise HaAdminError(body["RemoteException"]["message"])
        new_active = str(body["active"])
        deadline = time.monotonic() + HTTP_TIMEOUT_S
        while await self.state(new_active) != "active":  # the target's own view, not just the election's
            if time.monotonic() > deadline:
                raise HaAdminError(f"{new_active} did not become active within {HTTP_TIMEOUT_S} s")
            await asyncio.sleep(0.05)
        return new_active

    async def failover(self, source: str, target: str) -> str:
        if source == target:
            raise HaAdminError("-failover needs two different namenodes")
        self.url(target)
        if await self.state(source) != "active":
            raise HaAdminError(f"{source} is not active (the active is {await self.active() or 'not known yet'})")
        return await self.transfer(source, target)

    async def transition_to_active(self, replica_id: str) -> str:
        self.url(replica_id)
        active = await self.active()
        if active == replica_id:
            return replica_id
        if active is None:
            raise HaAdminError("no namenode is active now (an election is running): try again")
        return await self.transfer(active, replica_id)

    async def transition_to_standby(self, replica_id: str) -> str:
        if await self.state(replica_id) != "active":
            return replica_id  # already a standby
        return await self.transfer(replica_id, None)


def add_parser(sub: Any) -> None:
    h = sub.add_parser("haadmin", help="HA state of the namenodes: status, graceful fail-over")
    h.add_argument("--metadata", required=True, help="metadata URI, e.g. etcd://127.0.0.1:2379/scriba")
    h.add_argument("--namespace", default="namenode", help="stream namespace of the edit log")
    h.add_argument("--user", default="hdfs", help="who asks (changes of state need the superuser, hdfs)")
    verbs = h.add_mutually_exclusive_group(required=True)
    verbs.add_argument("-getServiceState", metavar="ID", help="print active or standby")
    verbs.add_argument("-getAllServiceState", action="store_true", help="ID, URL and state of every namenode")
    verbs.add_argument("-checkHealth", metavar="ID", help="exit 0 if the namenode is healthy")
    verbs.add_argument("-failover", nargs=2, metavar=("FROM", "TO"), help="hand the active role from FROM to TO")
    verbs.add_argument("-transitionToActive", metavar="ID", help="make ID the active (a leadership transfer)")
    verbs.add_argument("-transitionToStandby", metavar="ID", help="make the active ID a standby")


async def haadmin(args: argparse.Namespace) -> int:
    try:
        async with Client.connect(args.metadata) as client:
            nodes = await registrations(client, args.namespace)
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            admin = HaAdmin(nodes, http, args.user)
            for line in await _run_verb(admin, args):
                print(line)
        return 0
    except (HaAdminError, ScribaError) as exc:
        print(f"haadmin: {exc}", file=sys.stderr)
        return 1


async def _run_verb(admin: HaAdmin, args: argparse.Namespace) -> list[str]:
    if args.getServiceState:
        return [await admin.state(args.getServiceState)]
    if args.getAllServiceState:
        lines = []
        for replica_id in sorted(admin.nodes):
            try:
                state = await admin.state(replica_id)
            except HaAdminError:
                state = "unreachable"
            lines.append(f"{replica_id}\t{admin.url(replica_id)}\t{state}")
        return lines
    if args.checkHealth:
        await admin.check_health(args.checkHealth)
        return []
    if args.failover:
        return [f"Failover to {await admin.failover(*args.failover)} successful"]
    if args.transitionToActive:
        return [f"{await admin.transition_to_active(args.transitionToActive)} is active"]
    replica_id = args.transitionToStandby
    new_active = await admin.transition_to_standby(replica_id)
    return [f"{replica_id} is standby; {new_active} is active" if new_active != replica_id
            else f"{replica_id} is standby"]
