"""Autorecovery's records in the metadata store, under its own key prefix.

Key layout (relative to the store's root)::

    autorecovery/underreplicated/<ledger id, 20 digits>   UnderReplicated (one per ledger)
    autorecovery/claims/<ledger id, 20 digits>            Claim (ephemeral: a worker's lease)
    autorecovery/decommission/<bookie id>                 Decommission (drain a live bookie)
    autorecovery/auditor                                  AuditorStatus (written by the leader)
    autorecovery/requests/audit                           AuditRequest (``audit-now``)
    elections/autorecovery-auditor/leader                 the auditor's election (scriba.meta)

An :class:`UnderReplicated` record lists, per fragment (a segment of the ledger named by
its first entry), the bookies whose replicas must be moved and why. It changes only by
compare-and-set: the auditor merges new marks into it (:meth:`UnderReplicated.merged`),
a worker rewrites it with what is left, or deletes it at the version it read once
nothing is left. Records are JSON with a ``kind`` and a ``format`` version, as in
``scriba.meta.records``.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from scriba.errors import BadRequestError
from scriba.ids import BookieId, EntryId, LedgerId

# one JSON framing and codec adapter for every record kind (scriba.meta.records owns them)
from scriba.meta.records import RecordCodec, dump_record, load_record

PREFIX = "autorecovery/"
UNDERREPLICATED_PREFIX = "autorecovery/underreplicated/"
CLAIMS_PREFIX = "autorecovery/claims/"
DECOMMISSION_PREFIX = "autorecovery/decommission/"
AUDITOR_STATUS_KEY = "autorecovery/auditor"
AUDIT_REQUEST_KEY = "autorecovery/requests/audit"
AUDITOR_ELECTION = "autorecovery-auditor"


def underreplicated_key(ledger_id: int) -> str:
    return f"{UNDERREPLICATED_PREFIX}{ledger_id:020d}"


def claim_key(ledger_id: int) -> str:
    return f"{CLAIMS_PREFIX}{ledger_id:020d}"


def decommission_key(bookie_id: str) -> str:
    if not bookie_id or "/" in bookie_id:
        raise BadRequestError(f"bad bookie id {bookie_id!r}")
    return f"{DECOMMISSION_PREFIX}{bookie_id}"


def ledger_id_of(key: str) -> LedgerId:
    try:
        return LedgerId(int(key.rsplit("/", 1)[-1]))
    except ValueError:
        raise BadRequestError(f"{key}: not a ledger key") from None


class Reason(enum.Enum):
    """Why a bookie's replicas of a fragment must move."""

    LOST = "lost"  # the bookie has been gone longer than the recovery delay
    RECOVER = "recover"  # an operator asked (recover-bookie): gone or not
    DECOMMISSION = "decommission"  # a live bookie being drained
    UNREADABLE = "unreadable"  # a sampled entry could not be read from it
    PLACEMENT = "placement"  # the ensemble breaks its placement policy; move this one

    @property
    def needs_absence(self) -> bool:
        """Whether the mark lapses when the bookie is back (a restart within the delay
        race, say): only for LOST."""
        return self is Reason.LOST


@dataclass(frozen=True, slots=True, order=True)
class Mark:
    """Move ``bookie_id``'s replicas of the fragment starting at ``first_entry_id``."""

    first_entry_id: EntryId
    bookie_id: BookieId
    reason: Reason = field(compare=False)


@dataclass(frozen=True, slots=True)
class Deferred:
    """An open ledger's last fragment waits for its writer: the LAC seen, and since when."""

    lac: EntryId
    metadata_version: int
    since_ms: int


@dataclass(frozen=True, slots=True)
class UnderReplicated:
    """One ledger's under-replicated fragments and the bookies to move off them."""

    KIND: ClassVar[str] = "underreplicated"

    ledger_id: LedgerId
    marks: tuple[Mark, ...]
    marked_ms: int = 0
    auditor_token: int = 0  # the fencing token of the auditor that last marked it (0: a command)
    attempts: int = 0  # worker passes that ended with work left
    retry_after_ms: int = 0  # workers leave it alone until then
    deferred: Deferred | None = None
    last_error: str = ""

    @property
    def bookies(self) -> tuple[BookieId, ...]:
        """The bookies to move off, each once, sorted."""
        return tuple(sorted({m.bookie_id for m in self.marks}))

    @property
    def fragment_firsts(self) -> tuple[EntryId, ...]:
        return tuple(sorted({m.first_entry_id for m in self.marks}))

    def marks_of(self, first_entry_id: int) -> tuple[Mark, ...]:
        return tuple(m for m in self.marks if m.first_entry_id == first_entry_id)

    def merged(self, marks: Iterable[Mark]) -> UnderReplicated:
        """This record with ``marks`` added (one mark per fragment and bookie; the first
        reason given is kept)."""
        have = {(m.first_entry_id, m.bookie_id): m for m in self.marks}
        for m in marks:
            have.setdefault((m.first_entry_id, m.bookie_id), m)
        return replace(self, marks=tuple(sorted(have.values())))

    def covers(self, marks: Iterable[Mark]) -> bool:
        have = {(m.first_entry_id, m.bookie_id) for m in self.marks}
        return all((m.first_entry_id, m.bookie_id) in have for m in marks)

    def to_bytes(self) -> bytes:
        return dump_record(self.KIND, {
            "ledger_id": self.ledger_id,
            "marks": [[m.first_entry_id, m.bookie_id, m.reason.value] for m in self.marks],
            "marked_ms": self.marked_ms,
            "auditor_token": self.auditor_token,
            "attempts": self.attempts,
            "retry_after_ms": self.retry_after_ms,
            "deferred": None if self.deferred is None else [
                self.deferred.lac, self.deferred.metadata_version, self.deferred.since_ms
            ],
            "last_error": self.last_error,
        })

    @classmethod
    def from_bytes(cls, data: bytes) -> UnderReplicated:
        d = load_record(data, cls.KIND)
        try:
            deferred = d.get("deferred")
            return cls(
                ledger_id=LedgerId(int(d["ledger_id"])),
                marks=tuple(sorted(
                    Mark(EntryId(int(first)), BookieId(str(b)), Reason(r)) for first, b, r in d["marks"]
                )),
                marked_ms=int(d.get("marked_ms", 0)),
                auditor_token=int(d.get("auditor_token", 0)),
                attempts=int(d.get("attempts", 0)),
                retry_after_ms=int(d.get("retry_after_ms", 0)),
                deferred=None if deferred is None else Deferred(
                    EntryId(int(deferred[0])), int(deferred[1]), int(deferred[2])
                ),
                last_error=str(d.get("last_error", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BadRequestError(f"under-replication record: malformed ({exc!r})") from None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.to_bytes())
        doc["bookies"] = list(self.bookies)
        doc["fragments"] = len(self.fragment_firsts)
        return doc


@dataclass(frozen=True, slots=True)
class Claim:
    """A worker's lease on one ledger (an ephemeral record: it goes with the worker)."""

    KIND: ClassVar[str] = "claim"

    worker_id: str
    since_ms: int

    def to_bytes(self) -> bytes:
        return dump_record(self.KIND, {"worker_id": self.worker_id, "since_ms": self.since_ms})

    @classmethod
    def from_bytes(cls, data: bytes) -> Claim:
        d = load_record(data, cls.KIND)
        try:
            return cls(str(d["worker_id"]), int(d["since_ms"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadRequestError(f"claim: malformed ({exc!r})") from None


class DecommissionState(enum.Enum):
    DRAINING = "DRAINING"
    DONE = "DONE"  # no ledger references the bookie: it may be removed


@dataclass(frozen=True, slots=True)
class Decommission:
    KIND: ClassVar[str] = "decommission"

    bookie_id: BookieId
    state: DecommissionState = DecommissionState.DRAINING
    started_ms: int = 0
    finished_ms: int = 0

    def to_bytes(self) -> bytes:
        return dump_record(self.KIND, {
            "bookie_id": self.bookie_id, "state": self.state.value,
            "started_ms": self.started_ms, "finished_ms": self.finished_ms,
        })

    @classmethod
    def from_bytes(cls, data: bytes) -> Decommission:
        d = load_record(data, cls.KIND)
        try:
            return cls(BookieId(str(d["bookie_id"])), DecommissionState(d["state"]),
                       int(d.get("started_ms", 0)), int(d.get("finished_ms", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadRequestError(f"decommission: malformed ({exc!r})") from None


@dataclass(frozen=True, slots=True)
class AuditorStatus:
    """What the elected auditor publishes about itself (for ``autorecovery-status``)."""

    KIND: ClassVar[str] = "auditor-status"

    candidate: str
    token: int
    updated_ms: int
    last_check_ms: int = 0
    last_full_check_ms: int = 0
    lost_bookies: tuple[BookieId, ...] = ()
    pending_bookies: Mapping[str, float] = field(default_factory=dict)  # gone, within the delay
    ledgers_checked: int = 0
    marks_written: int = 0

    def to_bytes(self) -> bytes:
        return dump_record(self.KIND, {
            "candidate": self.candidate, "token": self.token, "updated_ms": self.updated_ms,
            "last_check_ms": self.last_check_ms, "last_full_check_ms": self.last_full_check_ms,
            "lost_bookies": list(self.lost_bookies), "pending_bookies": dict(self.pending_bookies),
            "ledgers_checked": self.ledgers_checked, "marks_written": self.marks_written,
        })

    @classmethod
    def from_bytes(cls, data: bytes) -> AuditorStatus:
        d = load_record(data, cls.KIND)
        try:
            return cls(
                str(d["candidate"]), int(d["token"]), int(d["updated_ms"]),
                int(d.get("last_check_ms", 0)), int(d.get("last_full_check_ms", 0)),
                tuple(BookieId(b) for b in d.get("lost_bookies", ())),
                {str(k): float(v) for k, v in d.get("pending_bookies", {}).items()},
                int(d.get("ledgers_checked", 0)), int(d.get("marks_written", 0)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadRequestError(f"auditor status: malformed ({exc!r})") from None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.to_bytes())
        return doc


@dataclass(frozen=True, slots=True)
class AuditRequest:
    """``audit-now``: a request the auditor answers by checking every ledger."""

    KIND: ClassVar[str] = "audit-request"

    sequence: int
    full: bool = False  # read every entry from every replica, not a sample

    def to_bytes(self) -> bytes:
        return dump_record(self.KIND, {"sequence": self.sequence, "full": self.full})

    @classmethod
    def from_bytes(cls, data: bytes) -> AuditRequest:
        d = load_record(data, cls.KIND)
        try:
            return cls(int(d["sequence"]), bool(d.get("full", False)))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadRequestError(f"audit request: malformed ({exc!r})") from None


UNDERREPLICATED_CODEC = RecordCodec(UnderReplicated)
DECOMMISSION_CODEC = RecordCodec(Decommission)
