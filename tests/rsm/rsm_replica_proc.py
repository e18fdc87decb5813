"""One RSM replica in its own process, for the fail-over tests.

    python rsm_replica_proc.py URI NAMESPACE REPLICA_ID ADDRESS TRACE_FILE MACHINE [CONFIG_JSON]

MACHINE is ``counter`` or ``register``; CONFIG_JSON holds ``RsmConfig`` fields and
optionally ``session_timeout_s`` (the metadata session's, default 2 s). Every apply is appended to TRACE_FILE as one
JSON line ``[position, command, state digest]`` (flushed), so the test can check
convergence after SIGKILLs. Prints ``READY`` once started; exits 3 with the error
on stderr if the replica stops on an error.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from typing import Any, TextIO

from scriba.client import Client, ClientConfig
from scriba.log import configure
from scriba.meta.connect import connect
from scriba.rsm import ReplicatedStateMachine, RsmConfig, SnapshotReader, SnapshotWriter
from scriba.stream import Position


class Traced:
    def __init__(self, trace: TextIO, register: bool) -> None:
        self.trace = trace
        self.register = register
        self.value = b""
        self.count = 0

    def digest(self) -> str:
        state = self.value if self.register else str(self.count).encode()
        return hashlib.sha256(state).hexdigest()[:16]

    def apply(self, command: bytes, position: Position) -> bytes:
        if self.register:
            old, self.value = self.value, command.removeprefix(b"set:")
            result = old
        else:
            self.count += 1
            result = str(self.count).encode()
        self.trace.write(json.dumps([str(position), command.decode(), self.digest()]) + "\n")
        self.trace.flush()
        return result

    def query(self, request: bytes) -> bytes:
        if request == b"digest":
            return self.digest().encode()
        return self.value if self.register else str(self.count).encode()

    def snapshot(self, out: SnapshotWriter) -> None:
        out.write(self.value if self.register else str(self.count).encode())

    def restore(self, src: SnapshotReader) -> None:
        data = src.read()
        if self.register:
            self.value = data
        else:
            self.count = int(data)
        self.trace.write(json.dumps(["restore", "", self.digest()]) + "\n")
        self.trace.flush()


async def main(uri: str, namespace: str, replica_id: str, address: str, trace_path: str, machine: str, config: dict[str, Any]) -> int:
    configure(stream=sys.stderr)  # stdout carries READY only
    store = await connect(uri, session_timeout_s=float(config.pop("session_timeout_s", 2.0)))
    client = await Client.connect(uri, store=store, config=ClientConfig(add_timeout_s=5.0, bookie_wait_s=20.0))
    with open(trace_path, "a") as trace:  # noqa: ASYNC230 - opened once at start, before serving
        rsm = ReplicatedStateMachine(client, namespace=namespace, name=machine, state_machine=Traced(trace, machine == "register"),
                                     replica_id=replica_id, address=address, config=RsmConfig(**config))
        await rsm.start()
        print("READY", flush=True)
        while rsm.error is None:  # the child serves until its replica stops: its main loop, not a test's wait
            await asyncio.sleep(0.1)
        print(f"STOPPED {rsm.error}", file=sys.stderr, flush=True)
        return 3


if __name__ == "__main__":
    a = sys.argv[1:]
    sys.exit(asyncio.run(main(a[0], a[1], a[2], a[3], a[4], a[5], json.loads(a[6]) if len(a) > 6 else {})))
