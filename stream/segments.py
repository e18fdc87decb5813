"""The stream's metadata records and the rules that change them. No I/O.

A stream is one versioned record (``StreamRecord``) holding its ordered list of
segments, each one ledger. Every change is a pure function here — record in,
record out, or a typed error — applied through the store's compare-and-set loop
(``scriba.meta.update_metadata``), so two clients never both think they changed it.

Segment states: OPEN (its ledger may still grow) -> CLOSED (final: last entry,
record count, size and last publish time recorded). Segment numbers (``seq``)
come from ``next_seq`` and are never reused.

Writer rules (DistributedLog's): a writer holds the stream's lock and its fencing
token (the lock record's store-wide creation revision). Opening a writer:
1. take the lock -> token;
2. :func:`fence`: CAS ``writer_epoch = token`` (refused if a larger token is
   recorded). From here every CAS by an older writer fails: it is fenced;
3. :func:`open_segments`: recover each OPEN segment's ledger (open with
   recovery fences the old writer's ledger), read its last entry's record-set
   header, :func:`close_segment` with the recovered summary;
4. create a ledger, :func:`add_segment` (CAS).
A roll is: create a ledger, :func:`add_segment`, drain and close the old ledger,
:func:`close_segment`. A crash between any two steps leaves OPEN segments that
step 3 of the next writer closes: no step depends on a later one having happened.

Adoption (:func:`adopt_segments`, for exactly-once batch writes such as Spark's): ledgers
written elsewhere in segment format ("staged": closed, one record set per entry, record
counts from 0 in each) become CLOSED segments at ``next_seq``, ``next_seq + 1``, ... in
ONE compare-and-set, by the writer holding the lock once it has closed every OPEN
segment. Adopting the same ledgers again changes nothing (a repeated commit); ledgers
partly present are refused. Each staged ledger keeps its own publish times, so across
adopted segments they may go back: a timestamp seek still skips no record at or after
its time (each segment is ordered inside), but may return some from before it.

Truncation deletes whole CLOSED segments below a position (never an OPEN one and
never the last segment), records the truncation point, and lists the segments'
ledgers in ``deleting`` until they are deleted (:func:`truncate`,
:func:`finish_deletes`); a crash in between leaves work that the next truncation,
retention pass or writer finishes. Retention picks such a position from age,
size and cursors (:func:`retention_point`).

Invariants: segments are sorted by ``seq`` and below ``next_seq``; CLOSED
segments carry their final summary; the truncation point never moves back.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, TypeVar

from scriba.errors import (
    BadRequestError,
    CursorRegressionError,
    PositionOutOfRangeError,
    StreamNotFoundError,
    WriterFencedError,
)
from scriba.invariant import invariant
from scriba.meta.records import RecordCodec, dump_record, load_record
from scriba.stream.position import ZERO, Position
from scriba.stream.settings import StreamSettings

STREAMS_PREFIX: Final = "streams/"


# --- keys ---------------------------------------------------------------------------
def namespace_token(namespace: str) -> str:
    """One key segment for a (validated) namespace: ``/`` -> ``.`` (``.`` is not allowed in it)."""
    return namespace.replace("/", ".")


def namespace_from_token(token: str) -> str:
    return token.replace(".", "/")


def namespace_key(namespace: str) -> str:
    return f"{STREAMS_PREFIX}{namespace_token(namespace)}"


def streams_prefix(namespace: str) -> str:
    return f"{namespace_key(namespace)}/"


def stream_key(namespace: str, stream: str) -> str:
    return f"{streams_prefix(namespace)}{stream}"


def cursors_prefix(namespace: str, stream: str) -> str:
    return f"{stream_key(namespace, stream)}/cursors/"


def cursor_key(namespace: str, stream: str, cursor: str) -> str:
    return f"{cursors_prefix(namespace, stream)}{cursor}"


def lock_name(namespace: str, stream: str) -> str:
    """The writer lock's election name (``~`` is in neither a namespace nor a stream name)."""
    return f"stream~{namespace_token(namespace)}~{stream}"


# --- records ------------------------------------------------------------------------
R = TypeVar("R")


def _decode(data: bytes, kind: str, build: Callable[[dict[str, Any]], R]) -> R:
    """A record of ``kind`` from its JSON body; a missing or mistyped field is ``BadRequestError``."""
    doc = load_record(data, kind)
    try:
        return build(doc)
    except (KeyError, TypeError, ValueError) as exc:
        raise BadRequestError(f"{kind} record: malformed ({exc!r})") from None


class SegmentState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    """What closing a segment records: its ledger's last entry and what the entries hold."""

    last_entry_id: int = -1
    last_slot: int = -1  # slot of the last record in the last entry
    record_count: int = 0
    size_bytes: int = 0
    last_publish_ms: int = 0


EMPTY_SUMMARY: Final = SegmentSummary()


@dataclass(frozen=True, slots=True)
class Segment:
    seq: int
    ledger_id: int
    state: SegmentState = SegmentState.OPEN
    writer_epoch: int = 0
    ctime_ms: int = 0
    closed_ms: int = 0
    summary: SegmentSummary = EMPTY_SUMMARY

    @property
    def is_open(self) -> bool:
        return self.state is SegmentState.OPEN

    @property
    def start(self) -> Position:
        return Position(self.seq, 0, 0)

    @property
    def first_position(self) -> Position | None:
        if self.is_open or self.summary.record_count == 0:
            return None
        return Position(self.seq, 0, 0)

    @property
    def last_position(self) -> Position | None:
        if self.is_open or self.summary.record_count == 0:
            return None
        return Position(self.seq, self.summary.last_entry_id, self.summary.last_slot)

    @property
    def end(self) -> Position:
        """The position right after a CLOSED segment: the next segment's start."""
        return Position(self.seq + 1, 0, 0)

    def to_list(self) -> list[Any]:
        s = self.summary
        return [self.seq, self.ledger_id, self.state.value, self.writer_epoch, self.ctime_ms,
                self.closed_ms, s.last_entry_id, s.last_slot, s.record_count, s.size_bytes,
                s.last_publish_ms]

    @classmethod
    def from_list(cls, row: Sequence[Any]) -> Segment:
        seq, ledger_id, state, epoch, ctime, closed, last_entry, last_slot, count, size, publish = row
        return cls(int(seq), int(ledger_id), SegmentState(state), int(epoch), int(ctime), int(closed),
                   SegmentSummary(int(last_entry), int(last_slot), int(count), int(size), int(publish)))


class StreamState(enum.Enum):
    ACTIVE = "active"
    DELETING = "deleting"


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """``streams/<namespace>/<stream>``: settings overrides and the segment list."""

    KIND: ClassVar[str] = "stream"

    name: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    ctime_ms: int = 0
    state: StreamState = StreamState.ACTIVE
    writer_epoch: int = 0
    next_seq: int = 0
    segments: tuple[Segment, ...] = ()
    truncated_before: Position = ZERO
    deleting: tuple[int, ...] = ()  # ledgers of truncated segments not yet deleted

    def __post_init__(self) -> None:
        seqs = [s.seq for s in self.segments]
        invariant(seqs == sorted(set(seqs)), f"stream {self.name}: segments not sorted/unique: {seqs}")
        invariant(not seqs or seqs[-1] < self.next_seq, f"stream {self.name}: seq {seqs[-1:]} >= next_seq")

    def segment(self, seq: int) -> Segment | None:
        for s in self.segments:
            if s.seq == seq:
                return s
        return None

    @property
    def last_segment(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    @property
    def record_count(self) -> int:
        """Records in CLOSED segments (OPEN ones are still growing)."""
        return sum(s.summary.record_count for s in self.segments if not s.is_open)

    @property
    def size_bytes(self) -> int:
        return sum(s.summary.size_bytes for s in self.segments if not s.is_open)

    def to_bytes(self) -> bytes:
        return dump_record(self.KIND, {
            "name": self.name, "settings": dict(self.settings), "ctime_ms": self.ctime_ms,
            "state": self.state.value, "writer_epoch": self.writer_epoch, "next_seq": self.next_seq,
            "segments": [s.to_list() for s in self.segments],
            "truncated_before": str(self.truncated_before), "deleting": list(self.deleting),
        })

    @classmethod
    def from_bytes(cls, data: bytes) -> StreamRecord:
        return _decode(data, cls.KIND, lambda doc: cls(
            name=str(doc["name"]), settings=dict(doc.get("settings", {})),
            ctime_ms=int(doc.get("ctime_ms", 0)), state=StreamState(doc.get("state", "active")),
            writer_epoch=int(doc.get("writer_epoch", 0)), next_seq=int(doc.get("next_seq", 0)),
            segments=tuple(Segment.from_list(r) for r in doc.get("segments", [])),
            truncated_before=Position.parse(doc.get("truncated_before", "0:0:0")),
            deleting=tuple(int(x) for x in doc.get("deleting", [])),
        ))


@dataclass(frozen=True, slots=True)
class NamespaceRecord:
    """``streams/<namespace>``: the namespace's settings overrides."""

    KIND: ClassVar[str] = "stream-namespace"

    name: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    ctime_ms: int = 0

    def to_bytes(self) -> bytes:
        return dump_record(self.KIND, {"name": self.name, "settings": dict(self.settings), "ctime_ms": self.ctime_ms})

    @classmethod
    def from_bytes(cls, data: bytes) -> NamespaceRecord:
        return _decode(data, cls.KIND, lambda doc: cls(
            str(doc["name"]), dict(doc.get("settings", {})), int(doc.get("ctime_ms", 0))
        ))


@dataclass(frozen=True, slots=True)
class CursorRecord:
    """``streams/<namespace>/<stream>/cursors/<name>``: a consumer's durable position."""

    KIND: ClassVar[str] = "stream-cursor"

    name: str
    position: Position
    updated_ms: int = 0

    def to_bytes(self) -> bytes:
        return dump_record(self.KIND, {"name": self.name, "position": str(self.position), "updated_ms": self.updated_ms})

    @classmethod
    def from_bytes(cls, data: bytes) -> CursorRecord:
        return _decode(data, cls.KIND, lambda doc: cls(
            str(doc["name"]), Position.parse(doc["position"]), int(doc.get("updated_ms", 0))
        ))


STREAM_CODEC: Final = RecordCodec(StreamRecord)
NAMESPACE_CODEC: Final = RecordCodec(NamespaceRecord)
CURSOR_CODEC: Final = RecordCodec(CursorRecord)


# --- writer rules -------------------------------------------------------------------
def check_active(stream: StreamRecord) -> None:
    if stream.state is not StreamState.ACTIVE:
        raise StreamNotFoundError(f"stream {stream.name} is being deleted")


def check_writer(stream: StreamRecord, token: int) -> None:
    """The writer with ``token`` still owns the stream, or ``WriterFencedError``."""
    check_active(stream)
    if stream.writer_epoch != token:
        raise WriterFencedError(
            f"stream {stream.name}: writer with token {token} was fenced by token {stream.writer_epoch}"
        )


def fence(stream: StreamRecord, token: int) -> StreamRecord:
    """Step 2 of opening a writer: record ``token``; refused if a newer writer is recorded."""
    check_active(stream)
    if token < stream.writer_epoch:
        raise WriterFencedError(
            f"stream {stream.name}: token {token} is older than the recorded writer {stream.writer_epoch}"
        )
    return dataclasses.replace(stream, writer_epoch=token)


def open_segments(stream: StreamRecord) -> list[Segment]:
    """The segments a new writer must recover and close, in order."""
    return [s for s in stream.segments if s.is_open]


def add_segment(stream: StreamRecord, token: int, ledger_id: int, now_ms: int) -> StreamRecord:
    """A new OPEN segment at ``next_seq``. At most one OPEN segment may precede it (a roll)."""
    check_writer(stream, token)
    still_open = open_segments(stream)
    invariant(len(still_open) <= 1, f"stream {stream.name}: {len(still_open)} open segments before a roll")
    segment = Segment(stream.next_seq, ledger_id, SegmentState.OPEN, token, now_ms)
    return dataclasses.replace(stream, next_seq=stream.next_seq + 1, segments=(*stream.segments, segment))


def close_segment(
    stream: StreamRecord, seq: int, summary: SegmentSummary, now_ms: int, token: int
) -> StreamRecord:
    """Mark segment ``seq`` CLOSED with ``summary`` (idempotent for the same summary)."""
    check_writer(stream, token)
    segment = stream.segment(seq)
    invariant(segment is not None, f"stream {stream.name}: no segment {seq} to close")
    assert segment is not None  # for mypy; the invariant above raises
    if not segment.is_open:
        invariant(segment.summary == summary,
                  f"stream {stream.name}: segment {seq} closed twice, {segment.summary} != {summary}")
        return stream
    closed = dataclasses.replace(segment, state=SegmentState.CLOSED, closed_ms=now_ms, summary=summary)
    return dataclasses.replace(
        stream, segments=tuple(closed if s.seq == seq else s for s in stream.segments)
    )


@dataclass(frozen=True, slots=True)
class StagedSegment:
    """A closed ledger written in segment format outside the stream, and its summary."""

    ledger_id: int
    summary: SegmentSummary


def adopt_segments(
    stream: StreamRecord, token: int, staged: Sequence[StagedSegment], now_ms: int
) -> StreamRecord:
    """Append ``staged`` as CLOSED segments, in order, all at once; see the module docstring.

    Refused: a fenced ``token`` (``WriterFencedError``), an OPEN segment still in the
    stream, an empty or duplicated staged ledger, or one already in the stream while
    others are not (``BadRequestError``). All already adopted: the stream unchanged.
    """
    check_writer(stream, token)
    ids = [s.ledger_id for s in staged]
    if len(set(ids)) != len(ids):
        raise BadRequestError(f"stream {stream.name}: a staged ledger is listed twice: {ids}")
    known = {s.ledger_id for s in stream.segments} | set(stream.deleting)
    present = [i for i in ids if i in known]
    if ids and len(present) == len(ids):
        return stream  # a repeated commit of the same ledgers
    if present:
        raise BadRequestError(f"stream {stream.name}: staged ledgers {present} are already segments but "
                              f"{sorted(set(ids) - set(present))} are not: no commit adopts part of a set")
    if open_segments(stream):
        raise BadRequestError(f"stream {stream.name}: segment {open_segments(stream)[0].seq} is open; "
                              "close it (open the writer) before adopting staged ledgers")
    empty = [s.ledger_id for s in staged if s.summary.record_count <= 0 or s.summary.last_entry_id < 0]
    if empty:
        raise BadRequestError(f"stream {stream.name}: staged ledgers {empty} hold no record (delete them instead)")
    adopted = tuple(Segment(stream.next_seq + i, s.ledger_id, SegmentState.CLOSED, token, now_ms, now_ms, s.summary)
                    for i, s in enumerate(staged))
    return dataclasses.replace(stream, next_seq=stream.next_seq + len(adopted),
                               segments=(*stream.segments, *adopted))


def segment_closed(stream: StreamRecord, seq: int) -> bool:
    segment = stream.segment(seq)
    return segment is None or not segment.is_open


@dataclass(frozen=True, slots=True)
class SegmentStats:
    """What the writer knows of its current segment."""

    records: int
    size_bytes: int
    age_s: float


def roll_due(settings: StreamSettings, stats: SegmentStats) -> str | None:
    """Why the current segment should roll now (``None``: it should not)."""
    if settings.segment_records_max is not None and stats.records >= settings.segment_records_max:
        return "records"
    if settings.segment_bytes_max is not None and stats.size_bytes >= settings.segment_bytes_max:
        return "bytes"
    if settings.segment_age_s_max is not None and stats.records and stats.age_s >= settings.segment_age_s_max:
        return "age"
    return None


def next_publish_ms(previous_ms: int, now_ms: int) -> int:
    """Publish times never go back along a stream (timestamp seeks rely on it)."""
    return now_ms if now_ms > previous_ms else previous_ms


def last_publish_ms(stream: StreamRecord) -> int:
    return max((s.summary.last_publish_ms for s in stream.segments), default=0)


# --- truncation and retention -------------------------------------------------------
def end_position(stream: StreamRecord) -> Position | None:
    """Right after a stream whose last segment is CLOSED (None while one is OPEN or none exist)."""
    last = stream.last_segment
    if last is None:
        return Position(stream.next_seq, 0, 0)
    return None if last.is_open else last.end


def truncate(stream: StreamRecord, before: Position) -> tuple[StreamRecord, tuple[int, ...]]:
    """Drop the CLOSED segments entirely below ``before`` (keeping the last segment).

    Returns the new record and the ledgers to delete (also listed in ``deleting``).
    The truncation point becomes ``max(current, before)``, but never passes an OPEN
    segment's start, so records that still exist are never marked truncated.
    """
    check_active(stream)
    last = stream.last_segment
    limit = Position(stream.next_seq, 0, 0)
    if before > limit:
        raise PositionOutOfRangeError(f"stream {stream.name}: truncation point {before} beyond the end {limit}")
    point = before
    for segment in stream.segments:
        if segment.is_open and segment.start < point:
            point = segment.start
            break
    drop: list[Segment] = []
    for segment in stream.segments:
        if segment.seq >= point.segment_seq or segment.is_open or segment is last:
            break
        drop.append(segment)
    new_point = max(stream.truncated_before, point)
    if not drop and new_point == stream.truncated_before:
        return stream, ()
    ledgers = tuple(s.ledger_id for s in drop)
    kept = stream.segments[len(drop):]
    return dataclasses.replace(
        stream, segments=kept, truncated_before=new_point, deleting=(*stream.deleting, *ledgers)
    ), ledgers


def finish_deletes(stream: StreamRecord, deleted: Iterable[int]) -> StreamRecord:
    done = set(deleted)
    return dataclasses.replace(stream, deleting=tuple(x for x in stream.deleting if x not in done))


def retention_point(
    stream: StreamRecord, settings: StreamSettings, now_ms: int, cursors: Sequence[Position] = ()
) -> Position | None:
    """Where retention truncates the stream now (``None``: nothing to drop).

    Only leading CLOSED segments, never the last segment. By age: segments whose
    last publish (or close) is older than ``retention_age_s_max``. By size: the
    oldest, until the rest fit in ``retention_bytes_max``. With ``retain_unconsumed``
    a segment stays until every cursor has passed it.
    """
    candidates: list[Segment] = []
    for segment in stream.segments[:-1]:
        if segment.is_open:
            break
        candidates.append(segment)
    drop = 0
    if settings.retention_age_s_max is not None:
        horizon_ms = now_ms - int(settings.retention_age_s_max * 1000)
        for segment in candidates:
            stamp = segment.summary.last_publish_ms or segment.closed_ms
            if stamp >= horizon_ms:
                break
            drop += 1
    if settings.retention_bytes_max is not None:
        total = sum(s.summary.size_bytes for s in stream.segments)
        by_size = 0
        for segment in candidates:
            if total <= settings.retention_bytes_max:
                break
            total -= segment.summary.size_bytes
            by_size += 1
        drop = max(drop, by_size)
    if settings.retain_unconsumed and cursors:
        consumed_below = min(c.segment_seq for c in cursors)  # segments < this are fully consumed
        drop = min(drop, sum(1 for s in candidates if s.seq < consumed_below))
    if drop == 0:
        return None
    keep = stream.segments[drop]
    return Position(keep.seq, 0, 0)


# --- cursors ------------------------------------------------------------------------
def advance_cursor(current: Position | None, new: Position, *, force: bool, name: str) -> bool:
    """Whether a commit of ``new`` changes the cursor; ``CursorRegressionError`` if it goes back."""
    if current is None:
        return True
    if new < current and not force:
        raise CursorRegressionError(f"cursor {name}: {new} is before the committed {current} (force=True allows it)")
    return new != current
