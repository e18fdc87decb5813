"""Replicated state machines on log streams.

    from scriba.rsm import StateMachine, ReplicatedStateMachine, RsmConfig
    rsm = ReplicatedStateMachine(client, namespace="apps", name="counter", state_machine=Counter(),
                                 replica_id="r1", address="127.0.0.1:7001", config=RsmConfig())
    await rsm.start()
    session = await rsm.open_session()
    result = await rsm.propose(b"incr", session=session)
    value = await rsm.read(b"get", consistency="linearizable")

The rules live in I/O-free modules (``envelope``, ``sessions``, ``state``, ``role``,
``batching``, ``snapshots_core``); ``replica``, ``term``, ``snapshot_store``, ``peer``
and ``remote`` are the asyncio shells; ``sync`` is the blocking facade.
"""

from scriba.rsm.client_session import ClientSession, Committed
from scriba.rsm.config import RsmConfig
from scriba.rsm.leaderless import while_leaderless
from scriba.rsm.machine import SnapshotReader, SnapshotWriter, StateMachine
from scriba.rsm.membership import Member
from scriba.rsm.replica import ReplicatedStateMachine
from scriba.rsm.role import Role

__all__ = [
    "ClientSession",
    "Committed",
    "Member",
    "ReplicatedStateMachine",
    "Role",
    "RsmConfig",
    "SnapshotReader",
    "SnapshotWriter",
    "StateMachine",
    "while_leaderless",
]
