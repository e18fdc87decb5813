"""``RsmClient``: propose and read through the replica service, from outside the group.

    client = RsmClient(["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"])
    session = await client.open_session()
    result = await client.propose(b"incr", session=session)
    value = await client.read(b"get")                      # linearizable: the replica proves it
    await client.close()

A request goes to the replica that answered last; an ``RsmNotLeaderError`` naming the
leader's address sends it there next, an unreachable replica the next address. With a
session, a proposal whose outcome is unknown (the connection dropped, the leader was
deposed) is sent again with the same sequence number — applied at most once — until
``timeout_s``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

from scriba.errors import (
    CommandOutcomeUnknownError,
    ConfigError,
    DeadlineExceededError,
    ReplicaStoppedError,
    RsmNotLeaderError,
    ScribaError,
    UnavailableError,
)
from scriba.rsm import wire
from scriba.rsm.client_session import ClientSession, Committed
from scriba.rsm.peer import PeerPool
from scriba.stream import Position
from scriba.tls import TlsConfig

RETRIABLE = (RsmNotLeaderError, UnavailableError, CommandOutcomeUnknownError, DeadlineExceededError, ReplicaStoppedError)


class RsmClient:
    def __init__(self, addresses: Sequence[str], *, timeout_s: float = 30.0, attempt_timeout_s: float = 5.0,
                 retry_pause_s: float = 0.05, tls: TlsConfig | None = None) -> None:
        if not addresses:
            raise ConfigError("RsmClient needs at least one replica address")
        self.addresses = list(addresses)
        self.timeout_s = timeout_s
        self.attempt_timeout_s = attempt_timeout_s
        self.retry_pause_s = retry_pause_s
        self._pool = PeerPool(tls.load() if tls is not None else None)
        self._current = 0
        self._hint: str | None = None

    async def _call(self, op: wire.Op, body: bytes, *, retry: bool = True) -> bytes:
        deadline = time.monotonic() + self.timeout_s
        while True:
            address = self._hint or self.addresses[self._current % len(self.addresses)]
            try:
                return await self._pool.get(address).call(op, body, self.attempt_timeout_s)
            except RsmNotLeaderError as exc:
                self._hint = exc.leader_address if exc.leader_address and exc.leader_address != address else None
                if self._hint is None:
                    self._current += 1
                error: ScribaError = exc
            except RETRIABLE as exc:
                self._hint = None
                self._current += 1
                error = exc
            if not retry or time.monotonic() > deadline:
                raise error
            await asyncio.sleep(self.retry_pause_s)

    async def open_session(self) -> ClientSession:
        position, result = wire.parse_committed(await self._call(wire.Op.OPEN_SESSION, b""))
        return ClientSession(int.from_bytes(result, "big"), last_position=position)

    async def submit(self, command: bytes, *, session: ClientSession | None = None, seq: int | None = None
                     ) -> Committed:
        if session is None:  # without a session a retry could apply twice: one attempt per replica hop
            body = wire.propose_body(0, 0, 0, command)
            position, result = wire.parse_committed(await self._call(wire.Op.PROPOSE, body, retry=False))
            return Committed(result, position)
        seq = session.allocate() if seq is None else seq
        body = wire.propose_body(session.session_id, seq, session.acked_below, command)
        position, result = wire.parse_committed(await self._call(wire.Op.PROPOSE, body))
        session.answered(seq, position)
        return Committed(result, position)

    async def propose(self, command: bytes, *, session: ClientSession | None = None, seq: int | None = None
                      ) -> bytes:
        return (await self.submit(command, session=session, seq=seq)).result

    async def read(self, request: bytes, consistency: str = "linearizable", *, after: Position | None = None,
                   address: str | None = None) -> bytes:
        body = wire.read_body(consistency, after, request)
        if address is not None:
            return await self._pool.get(address).call(wire.Op.READ, body, self.attempt_timeout_s)
        return await self._call(wire.Op.READ, body)

    async def status(self, address: str) -> dict[str, Any]:
        return dict(json.loads(await self._pool.get(address).call(wire.Op.STATUS, b"", self.attempt_timeout_s)))

    async def close(self) -> None:
        await self._pool.close()
