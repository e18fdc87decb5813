"""Asking every RSM replica the console knows of for its live status (the replica service's STATUS).

The mirror knows each group's registered members (ephemeral records: a replica that
died drops out once its session ends) and the elected leader. Their registrations carry
role, token and applied position as of the last registration; the live numbers — role,
token, applied position, records applied, replicated clock, last snapshot — come from
asking the replica itself. Every ``interval_s`` the prober asks all of them at once, each
with a short deadline, and keeps the last answer (or the error) per replica. Memory is
bounded by the registered members: replicas that are no longer registered are forgotten
and their connections closed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from scriba.console.periodic import Periodic
from scriba.errors import ScribaError
from scriba.log import get_logger
from scriba.rsm import wire
from scriba.rsm.peer import PeerClient
from scriba.tls import LoadedTls

log = get_logger(__name__)

STATUS_TIMEOUT_S: Final = 1.0
Replica = tuple[str, str]  # (group "NS/NAME", replica id)


@dataclass(slots=True)
class ReplicaProbe:
    address: str
    probed_s: float = 0.0  # wall time of the last probe (0: never)
    status: dict[str, Any] = field(default_factory=dict)  # the last answer ({} until one came)
    error: str = ""  # why the last probe failed ("" when it answered)


class RsmProber(Periodic):
    """Probes the replicas ``targets()`` names ((group, replica id) -> service address)."""

    name = "console-rsm-prober"

    def __init__(self, targets: Callable[[], Mapping[Replica, str]], *, interval_s: float = 1.0,
                 tls: LoadedTls | None = None) -> None:
        """``tls``: ask replicas over TLS with this client certificate (the console's own)."""
        super().__init__(interval_s)
        self._targets = targets
        self._tls = tls
        self.probes: dict[Replica, ReplicaProbe] = {}
        self._peers: dict[str, PeerClient] = {}

    async def closed(self) -> None:
        for peer in self._peers.values():
            await peer.close()
        self._peers.clear()

    async def tick(self) -> None:
        await self.probe_all()

    async def probe_all(self) -> None:
        targets = dict(self._targets())
        for replica in [r for r in self.probes if r not in targets]:
            del self.probes[replica]
        for replica, address in targets.items():
            probe = self.probes.get(replica)
            if probe is None or probe.address != address:
                self.probes[replica] = ReplicaProbe(address)
        live = {p.address for p in self.probes.values()}
        for address in [a for a in self._peers if a not in live]:
            await self._peers.pop(address).close()
        await asyncio.gather(*(self._probe(p) for p in list(self.probes.values())))

    async def _probe(self, probe: ReplicaProbe) -> None:
        probe.probed_s = time.time()
        if not probe.address:
            probe.status, probe.error = {}, "no service address registered"
            return
        peer = self._peers.get(probe.address)
        if peer is None:
            peer = self._peers[probe.address] = PeerClient(probe.address, self._tls)
        try:
            probe.status = dict(json.loads(await peer.call(wire.Op.STATUS, b"", STATUS_TIMEOUT_S)))
            probe.error = ""
        except (ScribaError, OSError, ValueError) as exc:
            probe.status, probe.error = {}, f"{type(exc).__name__}: {exc}"
