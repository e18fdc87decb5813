"""The replica service's request handler: what a peer (a forwarding follower) or a remote
client (``RsmClient``) may ask of a replica over ``peer.ReplicaServer`` — propose, open a
session, read, a frame of reads, read index, status, leadership transfer (a mixin of
``ReplicatedStateMachine``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from scriba.rsm import wire
from scriba.rsm.envelope import NO_SESSION, Kind

if TYPE_CHECKING:
    from scriba.rsm.replica import ReplicatedStateMachine


class ReplicaService:
    async def _handle(self: ReplicatedStateMachine, op: wire.Op, flags: int, body: bytes) -> bytes:  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
        forwarded = bool(flags & wire.FORWARDED)
        if op is wire.Op.PROPOSE:
            sid, seq, acked, command = wire.parse_propose(body)
            self._check_command(command)
            committed = await self._submit(Kind.COMMAND, command, sid, seq, acked, forwarded=forwarded)
            return wire.committed_body(committed.position, committed.result)
        if op is wire.Op.OPEN_SESSION:
            committed = await self._submit(Kind.SESSION_OPEN, b"", NO_SESSION, 0, 0, forwarded=forwarded)
            return wire.committed_body(committed.position, committed.result)
        if op is wire.Op.READ:
            consistency, after, request = wire.parse_read(body)
            return await self.read(request, consistency, after=after)
        if op is wire.Op.READ_MANY:
            return wire.read_many_answer(await self.read_many(wire.parse_read_many(body)))
        if op is wire.Op.READ_INDEX:
            return wire.position_body(await self.read_index(forwarded=forwarded))
        if op is wire.Op.TRANSFER:  # on the leader only (a follower says who leads; never forwarded)
            await self.transfer_leadership(wire.parse_transfer(body))
            return b""
        return json.dumps(self.status()).encode()

