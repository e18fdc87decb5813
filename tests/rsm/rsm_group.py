"""RSM replica processes for the process tests: a :class:`Group` of three replicas
(``rsm_replica_proc.py``) on a shared backend of real etcd and real bookies, started,
signalled and killed by their own PIDs; the ``backend`` and ``group_factory`` fixtures
live in ``conftest.py``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scriba.embedded.process import free_port
from scriba.errors import ScribaError
from scriba.rsm.remote import RsmClient
from scriba.testing.checkers import Applied, ReplicaTrace
from scriba.testing.waiting import eventually

PROC = str(Path(__file__).with_name("rsm_replica_proc.py"))
REPLICA_CONFIG = {"campaign_backoff_s": 0.1, "suspended_grace_s": 0.5, "snapshot_every_commands": 300,
                  "writer_lock_timeout_s": 60.0, "propose_timeout_s": 20.0}


def free_address() -> str:
    return f"127.0.0.1:{free_port()}"


@dataclass
class Replica:
    rid: str
    address: str
    dir: Path
    incarnation: int = 0
    proc: asyncio.subprocess.Process | None = None
    paused: bool = False
    uri: str | None = None  # its own metadata URI (through a fault proxy); None: the group's
    traces: list[Path] = field(default_factory=list)


class Group:
    def __init__(self, uri: str, machine: str, base: Path, config: dict[str, Any]) -> None:
        self.uri, self.machine, self.config = uri, machine, config
        self.namespace = f"t{uuid.uuid4().hex[:8]}"  # each group its own stream and member ids
        self.replicas = [Replica(f"r{i}", free_address(), base) for i in range(3)]

    async def start(self, r: Replica) -> None:
        r.incarnation += 1
        trace = r.dir / f"{r.rid}-{r.incarnation}.trace"
        r.traces.append(trace)
        with (r.dir / f"{r.rid}-{r.incarnation}.log").open("w") as log_file:
            r.proc = await asyncio.create_subprocess_exec(
                sys.executable, PROC, r.uri or self.uri, self.namespace, r.rid, r.address, str(trace), self.machine, json.dumps(self.config),
                stdout=asyncio.subprocess.PIPE, stderr=log_file,
            )
        assert r.proc.stdout is not None
        line = await asyncio.wait_for(r.proc.stdout.readline(), 60)
        assert line.strip() == b"READY", f"{r.rid} did not start: {line!r}"

    def signal(self, r: Replica, sig: int) -> None:
        assert r.proc is not None and r.proc.returncode is None
        os.kill(r.proc.pid, sig)  # our own child, by its PID

    async def kill(self, r: Replica) -> None:
        if r.proc is not None and r.proc.returncode is None:
            if r.paused:
                self.signal(r, signal.SIGCONT)
                r.paused = False
            self.signal(r, signal.SIGKILL)
            await r.proc.wait()

    async def leader(self, client: RsmClient, exclude: Replica | None = None, timeout_s: float = 60) -> Replica:
        found: list[Replica] = []

        async def one_leads() -> bool:
            for r in self.replicas:
                if r is exclude or r.paused or r.proc is None or r.proc.returncode is not None:
                    continue
                try:
                    if (await client.status(r.address))["role"] == "leader":
                        found.append(r)
                        return True
                except ScribaError:
                    pass
            return False

        await eventually(one_leads, timeout_s, what="a running replica reports the leader role", interval_s=0.05)
        return found[0]

    async def statuses(self, client: RsmClient) -> list[dict[str, Any]]:
        return [await client.status(r.address) for r in self.replicas]

    def traces(self) -> list[ReplicaTrace]:
        out = []
        for r in self.replicas:
            for path in r.traces:
                applied, digests = [], {}
                for line in path.read_text().splitlines():
                    pos, command, digest = json.loads(line)
                    if pos == "restore":
                        continue
                    seg, entry, slot = (int(x) for x in pos.split(":"))
                    number = (seg << 40) | (entry << 16) | slot
                    applied.append(Applied(number, command, digest))
                out.append(ReplicaTrace.build(path.name, applied, digests))
        return out
