"""The RSM layer's ``scriba shell`` verbs (registered through :data:`SHELL_VERBS`).

``rsm-status NS/NAME``: the group's members (role, token, applied position as each
replica reports it over the replica service, or its registration when it does not
answer; lag in records and in replicated-clock seconds behind the most advanced), the elected leader, and the snapshot catalog (positions, sizes, age).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from typing import Any

from scriba.errors import ConfigError, ScribaError
from scriba.meta.election import Election
from scriba.rsm import membership as mb
from scriba.rsm import wire
from scriba.rsm.peer import PeerClient
from scriba.rsm.snapshots_core import SnapshotCatalog
from scriba.rsm.status import fill_lag
from scriba.shell import ShellVerb, emit, table
from scriba.tls import TlsConfig

STATUS_TIMEOUT_S = 2.0


def _target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="NS/NAME", help="the state machine: namespace/name, e.g. apps/counter")


async def rsm_status(uri: str, target: str, tls: TlsConfig | None = None) -> dict[str, Any]:
    """``tls``: how to dial the replicas' service (``scriba shell --tls-*``; None: plaintext)."""
    from scriba.meta.connect import connect

    namespace, sep, name = target.rpartition("/")
    if not sep:
        raise ConfigError(f"{target!r}: expected NAMESPACE/NAME, e.g. apps/counter")
    group = mb.group_token(namespace, name)
    loaded = tls.load() if tls is not None else None
    store = await connect(uri)
    try:
        leader = await Election(store, mb.election_name(group)).leader()
        rows = []
        for member in await mb.list_members(store, group):
            row: dict[str, Any] = {"replica_id": member.replica_id, "address": member.address, "zone": member.zone,
                                   "role": member.role, "token": member.token, "applied": member.applied,
                                   "lag_records": None, "lag_s": None, "answered": False}
            if member.address:
                peer = PeerClient(member.address, loaded)
                with contextlib.suppress(ScribaError, OSError):
                    status = json.loads(await peer.call(wire.Op.STATUS, b"", STATUS_TIMEOUT_S))
                    row.update(role=status["role"], token=status["token"], applied=status["applied"],
                               records_applied=status["records_applied"], clock_ms=status["clock_ms"],
                               answered=True)
                await peer.close()
            rows.append(row)
        fill_lag(rows)
        try:
            catalog = SnapshotCatalog.from_bytes((await store.get(mb.catalog_key(group))).value)
        except ScribaError:
            catalog = SnapshotCatalog()
        now_ms = time.time() * 1000
        snapshots = [{"position": str(s.position), "ledger_id": s.ledger_id, "size_bytes": s.size_bytes,
                      "age_s": round((now_ms - s.created_ms) / 1000, 1)} for s in catalog.snapshots]
        return {"state_machine": target, "leader": leader[0] if leader else None,
                "election_token": leader[1] if leader else None, "members": rows, "snapshots": snapshots}
    finally:
        await store.close()


async def cmd_rsm_status(args: argparse.Namespace, uri: str) -> int:
    doc = await rsm_status(uri, args.target, getattr(args, "client_tls", None))
    lines = [f"{doc['state_machine']}: leader {doc['leader'] or '(none)'} (election token {doc['election_token']})",
             table(doc["members"], ["replica_id", "address", "zone", "role", "token", "applied", "lag_records", "lag_s"])
             if doc["members"] else "(no live replicas)"]
    if doc["snapshots"]:
        lines.append("snapshots:\n" + table(doc["snapshots"], ["position", "ledger_id", "size_bytes", "age_s"]))
    emit(args, doc, "\n".join(lines))
    return 0


SHELL_VERBS = (
    ShellVerb("rsm-status", "a replicated state machine's members, leader, lag and snapshots", cmd_rsm_status,
              _target),
)
