"""The exactly-once write's staging records and the rules that end them (I/O-free).

An exactly-once write (``option("delivery", "exactly-once")``) is a two-phase commit
whose coordinator log is one record per job in the metadata store,
``pipeline/staging/<namespace>/<stream>/<job>`` (:func:`staging_key`):

1. the driver creates it (state ``staging``, its creation time and owner) before any
   task runs; tasks write staged ledgers tagged ``staged=<job>`` (closed, outside the
   stream);
2. the driver's ``commit`` compare-and-sets it to ``committing`` with the list of
   ledgers to adopt (:func:`begin_commit`). That CAS is the commit point: from here the
   job's records WILL be adopted, by the driver or, if it dies, by whoever finds the
   record (a roll-forward: adopting the same ledgers again changes nothing);
3. the ledgers are adopted in one CAS on the stream record, the job's other staged
   ledgers (failed or speculative attempts) are deleted, then the record.

A driver that dies before step 2 leaves a ``staging`` record and its ledgers. The
garbage collector (:func:`plan_gc`; run by every later exactly-once job on the stream
for that stream, and by ``scriba pipeline gc-staged``) collects a ``staging`` record
older than the grace period by deleting it AT THE VERSION IT READ, and only then its
ledgers. The collector's conditional delete and the commit's CAS race on the same
record version: exactly one wins. If the collector wins, the commit finds no record
and fails (:class:`StagedWriteCollectedError`) before adopting anything; if the commit
wins, the collector's delete fails and it takes nothing. A ``committing`` record older
than the grace is rolled forward, never collected. A staged ledger whose job has no
record (written by a task still running after its job was collected, aborted or
committed) can never be adopted: once older than the grace it is deleted, unless it is
a segment of its stream (an adopted ledger keeps its tag) or a ``committing`` record
lists it.

The exactly-once streaming sink (one commit per micro-batch, idempotent per batch id)
has each task record its own job (the Python Data Source API tells a task nothing of
its batch); the batch's commit point is ONE transaction that checks every task's
record at the version read and the sink's record (``pipeline/sinks/<ns>/<stream>/<sink>``:
the last batch committed and its job), deletes the task records, creates the batch's
``committing`` record listing all their ledgers and advances the sink's batch. A
replayed batch (its id not above the sink's) is discarded; a batch whose driver died
past its commit point is finished by the next batch's commit before its own (order
kept) or by the collector.

The collector reads in this order: the ledgers (tags, creation times), then the
records, then each stream. A ledger's job record is created before the ledger, so a
record missing at the second read was deleted after a commit adopted its ledgers (the
stream, read third, names them), or by an abort or a collection (they can never be
adopted).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from scriba.errors import BadRequestError, StreamError
from scriba.stream.segments import namespace_token

STAGING_PREFIX: Final = "pipeline/staging/"

State = Literal["staging", "committing"]


class StagedWriteCollectedError(StreamError):
    """The job's staged ledgers were collected (its staging record was older than the
    grace period): nothing of it was adopted. Re-run the job (with a longer
    ``stagingGraceS`` if it is this slow)."""


@dataclass(frozen=True, slots=True)
class StagingRecord:
    """One exactly-once job's entry in the coordinator log."""

    job: str
    stream: str  # "ns/stream"
    created_ms: int
    owner: str  # host:pid of the driver, for people
    state: State = "staging"
    ledgers: tuple[int, ...] = ()  # committing: the ledgers to adopt, in order

    def to_bytes(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> StagingRecord:
        d = json.loads(data)
        if d.get("state") not in ("staging", "committing"):
            raise BadRequestError(f"staging record: unknown state {d.get('state')!r}")
        return cls(job=d["job"], stream=d["stream"], created_ms=int(d["created_ms"]), owner=d.get("owner", ""),
                   state=d["state"], ledgers=tuple(int(i) for i in d.get("ledgers", ())))


def staging_prefix(stream: str | None = None) -> str:
    """Every job's record (``None``), or one stream's (``"ns/stream"``)."""
    if stream is None:
        return STAGING_PREFIX
    ns, _, name = stream.rpartition("/")
    return f"{STAGING_PREFIX}{namespace_token(ns)}/{name}/"


def staging_key(stream: str, job: str) -> str:
    return f"{staging_prefix(stream)}{job}"


SINKS_PREFIX: Final = "pipeline/sinks/"


def sink_key(stream: str, sink: str) -> str:
    ns, _, name = stream.rpartition("/")
    return f"{SINKS_PREFIX}{namespace_token(ns)}/{name}/{sink}"


@dataclass(frozen=True, slots=True)
class SinkRecord:
    """An exactly-once streaming sink's progress: the last micro-batch committed, and its job."""

    batch: int = -1
    job: str = ""

    def to_bytes(self) -> bytes:
        return json.dumps({"batch": self.batch, "job": self.job}, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> SinkRecord:
        d = json.loads(data)
        return cls(int(d["batch"]), str(d.get("job", "")))


def begin_commit(record: StagingRecord, ledgers: Sequence[int]) -> StagingRecord:
    """The commit point: ``staging`` -> ``committing`` with ``ledgers``. Already committing
    the same ledgers (a repeated commit): unchanged; other ledgers: refused."""
    if record.state == "committing":
        if record.ledgers != tuple(ledgers):
            raise BadRequestError(f"job {record.job}: already committing ledgers {list(record.ledgers)}, "
                                  f"not {list(ledgers)}")
        return record
    return dataclasses.replace(record, state="committing", ledgers=tuple(ledgers))


# --- the collector's plan ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StagedLedger:
    """A ledger tagged ``staged=<job>``, as its metadata says."""

    ledger_id: int
    job: str
    stream: str
    ctime_ms: int


@dataclass(frozen=True, slots=True)
class Collect:
    """Delete the record at ``version`` (skip the job if that fails), then ``ledgers``."""

    key: str
    version: int
    record: StagingRecord
    ledgers: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RollForward:
    """Finish a commit past its commit point: adopt ``record.ledgers``, delete ``others``, the record."""

    key: str
    version: int
    record: StagingRecord
    others: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DeleteLoose:
    """Staged ledgers no job record names and no stream holds."""

    ledgers: tuple[int, ...]


GcStep = Collect | RollForward | DeleteLoose


@dataclass(frozen=True, slots=True)
class StagingRow:
    """A staging record as read: key, version, value."""

    key: str
    version: int
    record: StagingRecord


def plan_gc(ledgers: Iterable[StagedLedger], records: Iterable[StagingRow], segments: Mapping[str, set[int]],
            *, now_ms: int, grace_ms: int) -> list[GcStep]:
    """What the collector does, from what it read (in the module docstring's order).
    ``segments``: every ledger each stream holds (segments and ``deleting``); a stream
    missing from it is gone, so its ledgers are no segment."""
    by_job: dict[str, list[StagedLedger]] = {}
    for led in ledgers:
        by_job.setdefault(led.job, []).append(led)
    steps: list[GcStep] = []
    known = set()
    records = list(records)
    listed = {i for row in records if row.record.state == "committing" for i in row.record.ledgers}
    for row in records:
        rec = row.record
        known.add(rec.job)
        if now_ms - rec.created_ms < grace_ms:
            continue  # its job may still commit
        held = segments.get(rec.stream, set())
        mine = tuple(sorted(led.ledger_id for led in by_job.get(rec.job, ()) if led.ledger_id not in held))
        if rec.state == "staging":
            steps.append(Collect(row.key, row.version, rec, mine))
        else:
            steps.append(RollForward(row.key, row.version, rec, tuple(i for i in mine if i not in rec.ledgers)))
    loose = sorted(led.ledger_id for job, group in by_job.items() if job not in known for led in group
                   if led.ledger_id not in segments.get(led.stream, set()) and led.ledger_id not in listed
                   and now_ms - led.ctime_ms >= grace_ms)
    if loose:
        steps.append(DeleteLoose(tuple(loose)))
    return steps
