"""``SyncReplicatedStateMachine``: the blocking facade for scripts.

    with SyncReplicatedStateMachine("etcd://127.0.0.1:2379/scriba", namespace="apps", name="counter",
                                    state_machine=Counter(), replica_id="r1") as rsm:
        session = rsm.open_session()
        rsm.propose(b"incr", session=session)
        rsm.read(b"get")

One event loop runs in a daemon thread; each call waits for its coroutine there. The
state machine's methods run on that thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from scriba.client import Client
from scriba.rsm.client_session import ClientSession
from scriba.rsm.config import RsmConfig
from scriba.rsm.machine import StateMachine
from scriba.rsm.membership import Member
from scriba.rsm.replica import ReplicatedStateMachine
from scriba.stream import Position

T = TypeVar("T")


class SyncReplicatedStateMachine:
    def __init__(self, uri: str, *, namespace: str, name: str, state_machine: StateMachine, replica_id: str,
                 address: str | None = None, config: RsmConfig | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"rsm-{replica_id}", daemon=True)
        self._thread.start()
        self._client: Client | None = None
        self._args = dict(namespace=namespace, name=name, state_machine=state_machine, replica_id=replica_id,
                          address=address, config=config)
        self._uri = uri
        self.rsm: ReplicatedStateMachine | None = None

    def _call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def start(self) -> SyncReplicatedStateMachine:
        async def starting() -> ReplicatedStateMachine:
            self._client = await Client.connect(self._uri)
            return await ReplicatedStateMachine(self._client, **self._args).start()  # type: ignore[arg-type]

        self.rsm = self._call(starting())
        return self

    def _r(self) -> ReplicatedStateMachine:
        assert self.rsm is not None, "call start() first"
        return self.rsm

    def open_session(self) -> ClientSession:
        return self._call(self._r().open_session())

    def propose(self, command: bytes, *, session: ClientSession | None = None, seq: int | None = None) -> bytes:
        return self._call(self._r().propose(command, session=session, seq=seq))

    def read(self, request: bytes, consistency: str = "linearizable", *, after: Position | str | None = None
             ) -> bytes:
        return self._call(self._r().read(request, consistency, after=after))

    def members(self) -> list[Member]:
        return self._call(self._r().members())

    def transfer_leadership(self, replica_id: str) -> None:
        self._call(self._r().transfer_leadership(replica_id))

    def snapshot(self) -> Position:
        return self._call(self._r().snapshot())

    def status(self) -> dict[str, Any]:
        return self._r().status()

    def stop(self) -> None:
        async def stopping() -> None:
            if self.rsm is not None:
                await self.rsm.stop()
            if self._client is not None:
                await self._client.close()

        try:
            self._call(stopping(), 30.0)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)

    def __enter__(self) -> SyncReplicatedStateMachine:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
