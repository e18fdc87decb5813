"""The exactly-once session table: part of the replicated state (and of snapshots).

As in the Raft dissertation (§6.3): a client opens a session (a ``SESSION_OPEN``
record; its id is the table's next id, the same on every replica) and numbers its
commands ``seq = 1, 2, ...``. Every replica, when it applies a command under a
session, asks :meth:`SessionTable.check` first:

- a ``seq`` whose result is kept -> :class:`Duplicate` (the first result; not applied again);
- a ``seq`` below the client's ``acked_below`` (it said it has every answer below) whose
  result is no longer kept -> :class:`Rejected` (stale: never applied twice);
- an unknown session id -> :class:`Rejected`: expired if it was ever opened (its
  results are gone, so a retry cannot be told from a new command), else never opened;
- more than ``results_max`` unanswered results kept -> :class:`Rejected` (window full);
- otherwise :class:`Fresh`: apply it, then :meth:`record` the result.

Time is the replicated clock (:meth:`advance`: the leader's stamps, maximum so far):
a session expires once no command touched it for ``ttl_ms`` of that clock. No
replica ever reads its own clock here, so all expire the same sessions at the same
record.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

from scriba.config import require
from scriba.errors import ClientSessionError, ConfigError
from scriba.invariant import invariant

FIRST_SESSION_ID: Final = 1


@dataclass(frozen=True, slots=True)
class Fresh:
    pass


@dataclass(frozen=True, slots=True)
class Duplicate:
    result: bytes


@dataclass(frozen=True, slots=True)
class Rejected:
    reason: str

    def error(self) -> ClientSessionError:
        return ClientSessionError(self.reason)


Check = Fresh | Duplicate | Rejected


@dataclass(slots=True)
class _Session:
    last_active_ms: int
    acked_below: int = 0
    results: dict[int, bytes] = field(default_factory=dict)


class SessionTable:
    def __init__(self, ttl_ms: int, results_max: int) -> None:
        require(ttl_ms >= 1, "session_ttl_ms", "must be >= 1")
        require(results_max >= 1, "session_results_max", "must be >= 1")
        self.ttl_ms = ttl_ms
        self.results_max = results_max
        self.clock_ms = 0
        self.next_id = FIRST_SESSION_ID
        self._sessions: OrderedDict[int, _Session] = OrderedDict()  # least recently active first

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: int) -> bool:
        return session_id in self._sessions

    # --- the replicated clock --------------------------------------------------------
    def advance(self, time_ms: int) -> list[int]:
        """Move the clock to ``max(clock, time_ms)``; returns the session ids that expired."""
        if time_ms > self.clock_ms:
            self.clock_ms = time_ms
        expired = []
        while self._sessions:
            sid, session = next(iter(self._sessions.items()))
            if session.last_active_ms + self.ttl_ms >= self.clock_ms:
                break
            del self._sessions[sid]
            expired.append(sid)
        return expired

    # --- sessions ------------------------------------------------------------------------
    def open(self) -> int:
        sid = self.next_id
        self.next_id += 1
        self._sessions[sid] = _Session(self.clock_ms)
        return sid

    def check(self, session_id: int, seq: int, acked_below: int) -> Check:
        session = self._sessions.get(session_id)
        if session is None:
            if FIRST_SESSION_ID <= session_id < self.next_id:
                return Rejected(f"client session {session_id} expired (no command for {self.ttl_ms} ms of "
                                "the replicated clock): open a new session")
            return Rejected(f"client session {session_id} was never opened")
        if seq < 1:
            return Rejected(f"client session {session_id}: sequence numbers start at 1, got {seq}")
        self._touch(session_id, session)
        if acked_below > session.acked_below:
            session.acked_below = acked_below
            for old in [s for s in session.results if s < acked_below]:
                del session.results[old]
        kept = session.results.get(seq)
        if kept is not None:
            return Duplicate(kept)
        if seq < session.acked_below:
            return Rejected(f"client session {session_id}: seq {seq} is below acked_below "
                            f"{session.acked_below} (its answer was already taken) and is not applied again")
        if len(session.results) >= self.results_max:
            return Rejected(f"client session {session_id}: {len(session.results)} unacknowledged results kept "
                            f"(session_results_max): acknowledge answers (acked_below) before sending more")
        return Fresh()

    def peek(self, session_id: int, seq: int) -> bytes | None:
        """The kept result of ``seq`` without touching anything (the leader's fast path)."""
        session = self._sessions.get(session_id)
        return None if session is None else session.results.get(seq)

    def record(self, session_id: int, seq: int, result: bytes) -> None:
        session = self._sessions.get(session_id)
        invariant(session is not None, f"recording a result for session {session_id} that is not open")
        assert session is not None
        invariant(seq not in session.results, f"session {session_id} seq {seq} applied twice")
        session.results[seq] = result

    def _touch(self, session_id: int, session: _Session) -> None:
        session.last_active_ms = max(session.last_active_ms, self.clock_ms)
        self._sessions.move_to_end(session_id)

    # --- snapshots -----------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        doc = {
            "clock_ms": self.clock_ms,
            "next_id": self.next_id,
            "sessions": [
                [sid, s.last_active_ms, s.acked_below,
                 [[seq, base64.b64encode(r).decode()] for seq, r in sorted(s.results.items())]]
                for sid, s in self._sessions.items()
            ],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, ttl_ms: int, results_max: int) -> SessionTable:
        table = cls(ttl_ms, results_max)
        try:
            doc = json.loads(data)
            table.clock_ms = int(doc["clock_ms"])
            table.next_id = int(doc["next_id"])
            for sid, last, acked, results in doc["sessions"]:
                table._sessions[int(sid)] = _Session(
                    int(last), int(acked), {int(seq): base64.b64decode(r) for seq, r in results}
                )
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"session table in snapshot does not decode: {exc}") from None
        return table

    def digest(self) -> str:
        return hashlib.sha256(self.to_bytes()).hexdigest()
