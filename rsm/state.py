"""The replicated state: the user's state machine, the session table, the replicated
clock and the applied position, changed only by :meth:`ReplicatedState.apply`.

Every replica feeds the same records in the same order (the stream's), so every
replica's replicated state is the same at the same position. :meth:`apply` is the
one deterministic step: decode nothing, read no clock, do no I/O.

Invariants (checked, a violation raises ``InvariantViolation``): positions strictly
increase; fencing tokens never decrease along the stream.

Snapshots (:meth:`snapshot` / :meth:`restore`): chunk 0 is this layer's header (the
position, counts, token, session table as JSON); the user's chunks follow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from scriba.errors import SnapshotCorruptError, StateMachineError
from scriba.invariant import invariant
from scriba.rsm.envelope import NO_SESSION, Envelope, Kind
from scriba.rsm.machine import SnapshotReader, SnapshotWriter, StateMachine
from scriba.rsm.sessions import Duplicate, Rejected, SessionTable
from scriba.stream import Position


@dataclass(frozen=True, slots=True)
class Outcome:
    """What applying one record gave: the caller's answer (or why it was refused)."""

    result: bytes = b""
    rejected: str | None = None
    applied: bool = False  # the user's state machine ran (False: duplicate, barrier, refused)


BARRIER_OUTCOME = Outcome()


class ReplicatedState:
    def __init__(self, machine: StateMachine, *, session_ttl_ms: int, session_results_max: int) -> None:
        self.machine = machine
        self.sessions = SessionTable(session_ttl_ms, session_results_max)
        self.applied: Position | None = None
        self.records_applied = 0  # stream records applied (every kind)
        self.commands_applied = 0  # commands the state machine ran
        self.token = 0  # the largest writer token seen in the stream

    @property
    def clock_ms(self) -> int:
        return self.sessions.clock_ms

    def apply(self, position: Position, envelope: Envelope) -> Outcome:
        invariant(self.applied is None or position > self.applied,
                  f"rsm apply at {position} after {self.applied}: positions must increase")
        invariant(envelope.token >= self.token,
                  f"rsm record at {position} has token {envelope.token} below {self.token} seen before")
        self.applied = position
        self.records_applied += 1
        self.token = envelope.token
        self.sessions.advance(envelope.time_ms)
        if envelope.kind is Kind.BARRIER:
            return BARRIER_OUTCOME
        if envelope.kind is Kind.SESSION_OPEN:
            return Outcome(self.sessions.open().to_bytes(8, "big"))
        if envelope.session_id != NO_SESSION:
            check = self.sessions.check(envelope.session_id, envelope.seq, envelope.acked_below)
            if isinstance(check, Duplicate):
                return Outcome(check.result)
            if isinstance(check, Rejected):
                return Outcome(rejected=check.reason)
        result = self._run(envelope.payload, position)
        if envelope.session_id != NO_SESSION:
            self.sessions.record(envelope.session_id, envelope.seq, result)
        self.commands_applied += 1
        return Outcome(result, applied=True)

    def _run(self, command: bytes, position: Position) -> bytes:
        try:
            result = self.machine.apply(command, position)
        except Exception as exc:
            raise StateMachineError(
                f"state machine {type(self.machine).__name__}.apply raised at {position}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(result, bytes | bytearray | memoryview):
            raise StateMachineError(
                f"state machine {type(self.machine).__name__}.apply returned {type(result).__name__} at "
                f"{position}; it must return bytes"
            )
        return bytes(result)

    # --- snapshots --------------------------------------------------------------------
    def snapshot(self, chunk_bytes: int) -> list[bytes]:
        """This state as chunks (header first), taken now: apply may continue afterwards."""
        invariant(self.applied is not None, "snapshot of a state that applied nothing")
        header = {
            "position": str(self.applied),
            "records_applied": self.records_applied,
            "commands_applied": self.commands_applied,
            "token": self.token,
            "sessions": self.sessions.to_bytes().decode(),
        }
        out = SnapshotWriter(chunk_bytes)
        self.machine.snapshot(out)
        return [json.dumps(header, separators=(",", ":")).encode(), *out.chunks()]

    def restore(self, chunks: list[bytes]) -> None:
        if not chunks:
            raise SnapshotCorruptError("snapshot has no chunks")
        try:
            header = json.loads(chunks[0])
            position = Position.parse(header["position"])
            sessions = SessionTable.from_bytes(header["sessions"].encode(), self.sessions.ttl_ms,
                                               self.sessions.results_max)
            counts = int(header["records_applied"]), int(header["commands_applied"]), int(header["token"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotCorruptError(f"snapshot header does not decode: {exc}") from None
        try:
            self.machine.restore(SnapshotReader(list(chunks[1:])))
        except Exception as exc:
            raise StateMachineError(
                f"state machine {type(self.machine).__name__}.restore raised: {type(exc).__name__}: {exc}"
            ) from exc
        self.sessions = sessions
        self.applied = position
        self.records_applied, self.commands_applied, self.token = counts
