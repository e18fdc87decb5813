"""The exactly-once write's protocol on a connection: start, commit, abort, collect.

The rules and the reasons are in :mod:`scriba.pipeline.staging`; this module does the
reads and writes in the order they need. Every function takes the driver's
:class:`~scriba.pipeline.access.Access`.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from scriba.errors import (
    BadVersionError,
    ConfigError,
    KeyExistsError,
    NamespaceNotFoundError,
    NoSuchKeyError,
    NoSuchLedgerError,
    StreamNotFoundError,
)
from scriba.log import get_logger
from scriba.meta.records import LEDGERS_PREFIX, LedgerMetadata
from scriba.meta.store import Check, Delete, Put, Versioned
from scriba.meta.update import UPDATE_ATTEMPTS_MAX
from scriba.pipeline.access import Access
from scriba.pipeline.plan import split_stream
from scriba.pipeline.staging import (
    Collect,
    GcStep,
    RollForward,
    SinkRecord,
    StagedLedger,
    StagedWriteCollectedError,
    StagingRecord,
    StagingRow,
    begin_commit,
    plan_gc,
    sink_key,
    staging_key,
    staging_prefix,
)
from scriba.stream.position import ZERO, Position

log = get_logger(__name__)


def start_job(access: Access, stream: str, job: str) -> None:
    """The job's staging record, before any task stages a ledger."""
    record = StagingRecord(job, stream, int(time.time() * 1000), _owner())
    try:
        access.run(access.client.store.create(staging_key(stream, job), record.to_bytes()))
    except KeyExistsError:
        pass  # a retried call: the job id is new for every job


def commit_job(access: Access, stream: str, job: str, ledgers: list[int]) -> None:
    """Pass the commit point, then finish the commit. Raises
    :class:`StagedWriteCollectedError` if the collector took the job first."""
    row = pass_commit_point(access, stream, job, ledgers)
    if row is not None:
        finish_commit(access, row)


def pass_commit_point(access: Access, stream: str, job: str, ledgers: list[int]) -> StagingRow | None:
    """The record's CAS to ``committing`` with ``ledgers``: the row written, or ``None`` for a
    repeated commit that already finished. Raises :class:`StagedWriteCollectedError` if the
    record is gone and the ledgers are not in the stream."""
    store, key = access.client.store, staging_key(stream, job)
    for _ in range(UPDATE_ATTEMPTS_MAX):  # a lost CAS is re-read: the record is then gone or committing
        try:
            raw = access.run(store.get(key))
        except NoSuchKeyError:
            if set(ledgers) <= _held(access, stream):
                return None  # a repeated commit: the first one adopted them and deleted the record
            raise StagedWriteCollectedError(
                f"stream {stream}: job {job}'s staging record is gone (collected after the grace period, or "
                "aborted): nothing of it was adopted") from None
        current = StagingRecord.from_bytes(raw.value)
        new = begin_commit(current, ledgers)
        if new is current:
            return StagingRow(key, raw.version, new)
        try:
            return StagingRow(key, access.run(store.set(key, new.to_bytes(), expected_version=raw.version)), new)
        except (BadVersionError, NoSuchKeyError):
            continue  # the collector (or a twin commit) got there first: read what it did
    raise BadVersionError(f"stream {stream}: job {job}'s staging record kept changing ({UPDATE_ATTEMPTS_MAX} reads)")


def finish_commit(access: Access, row: StagingRow) -> None:
    """After the commit point (by the driver, or a roll-forward): see :func:`_roll_forward`."""
    _roll_forward(access, row, others=None)


def abort_job(access: Access, stream: str, job: str) -> None:
    """Before the commit point: the record, then every ledger the job staged. After it (a
    commit that failed late): the commit is finished, as the collector would."""
    store, key = access.client.store, staging_key(stream, job)
    try:
        raw = access.run(store.get(key))
    except NoSuchKeyError:  # (a streaming batch's commit point moves a task's ledgers to the batch's record)
        _delete(access, sorted(set(_staged_by(access, job)) - _held(access, stream) - _listed(access, stream)))
        return
    row = StagingRow(key, raw.version, StagingRecord.from_bytes(raw.value))
    if row.record.state == "committing":
        log.warning("pipeline_abort_past_commit_point", stream=stream, job=job)
        _roll_forward(access, row, others=None)
        return
    _collect(access, row, _staged_by(access, job))


# --- the exactly-once streaming sink: one commit per micro-batch -----------------------------
BATCH_TASKS_MAX = 60
"""Task jobs one micro-batch's commit can take in its one transaction (etcd's 128 operations:
two per task, four for the batch)."""


def commit_batch(access: Access, stream: str, sink: str, batch_id: int, parts: list[tuple[str, list[int]]]) -> bool:
    """Commit micro-batch ``batch_id`` of ``sink``: ``parts`` are its tasks' (job, staged
    ledgers) in partition order. False: a replayed batch (already committed), whose
    staged ledgers are deleted. Raises :class:`StagedWriteCollectedError` if the
    collector took one of its tasks' jobs (nothing of the batch is adopted)."""
    if len(parts) > BATCH_TASKS_MAX:
        raise ConfigError(f"an exactly-once micro-batch commits at most {BATCH_TASKS_MAX} tasks in one "
                          f"transaction, this one has {len(parts)}: coalesce() the stream before writeStream")
    store, key = access.client.store, sink_key(stream, sink)
    for _ in range(UPDATE_ATTEMPTS_MAX):  # a lost transaction is re-read: a task job collected, or a replay
        try:
            raw = access.run(store.get(key))
            version: int | None = raw.version
            progress = SinkRecord.from_bytes(raw.value)
        except NoSuchKeyError:
            version, progress = None, SinkRecord()
        if progress.job:  # the last batch's commit, if its driver died past the commit point
            _finish_if_committing(access, stream, progress.job)
        if batch_id <= progress.batch:
            log.info("pipeline_batch_replayed", stream=stream, sink=sink, batch=batch_id, last=progress.batch)
            for job, _ in parts:
                abort_job(access, stream, job)
            return False
        checks = [Check(key, version)]
        writes: list[Put | Delete] = []
        for job, _ in parts:
            try:
                checks.append(Check(staging_key(stream, job), access.run(store.get(staging_key(stream, job))).version))
            except NoSuchKeyError:
                raise StagedWriteCollectedError(
                    f"stream {stream}: batch {batch_id}'s task job {job} is gone (collected after the grace "
                    "period): nothing of the batch was adopted") from None
            writes.append(Delete(staging_key(stream, job)))
        job = f"{sink}-{batch_id}"
        record = StagingRecord(job, stream, int(time.time() * 1000), _owner(), "committing",
                               tuple(i for _, ledgers in parts for i in ledgers))
        checks.append(Check(staging_key(stream, job), None))
        writes += [Put(staging_key(stream, job), record.to_bytes()), Put(key, SinkRecord(batch_id, job).to_bytes())]
        try:
            access.run(store.txn(checks, writes))
        except BadVersionError:
            continue  # a collector or a twin commit moved: read again
        finish_commit(access, StagingRow(staging_key(stream, job), 0, record))
        return True
    raise BadVersionError(f"stream {stream}: sink {sink}'s records kept changing ({UPDATE_ATTEMPTS_MAX} reads)")


def abort_batch(access: Access, stream: str, sink: str, batch_id: int, jobs: list[str]) -> None:
    """Spark gave batch ``batch_id`` up: its tasks' staged ledgers are deleted, unless the
    batch passed its commit point (then its commit is finished)."""
    try:
        progress = SinkRecord.from_bytes(access.run(access.client.store.get(sink_key(stream, sink))).value)
    except NoSuchKeyError:
        progress = SinkRecord()
    if progress.job:
        _finish_if_committing(access, stream, progress.job)
    for job in jobs:
        abort_job(access, stream, job)


def _finish_if_committing(access: Access, stream: str, job: str) -> None:
    try:
        raw = access.run(access.client.store.get(staging_key(stream, job)))
    except NoSuchKeyError:
        return  # finished
    finish_commit(access, StagingRow(staging_key(stream, job), raw.version, StagingRecord.from_bytes(raw.value)))


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class GcReport:
    """What one collector pass did."""

    collected: list[str] = field(default_factory=list)  # jobs
    rolled_forward: list[str] = field(default_factory=list)  # jobs
    deleted_ledgers: list[int] = field(default_factory=list)
    kept: int = 0  # jobs still within the grace period (or won by their commit)

    def line(self) -> str:
        return (f"gc-staged: {len(self.collected)} job(s) collected, {len(self.rolled_forward)} rolled forward, "
                f"{len(self.deleted_ledgers)} ledger(s) deleted, {self.kept} kept")


def collect_staged(access: Access, *, stream: str | None = None, grace_s: float, now_ms: int | None = None
                   ) -> GcReport:
    """One collector pass over ``stream``'s jobs (``None``: every stream's)."""
    return run_collection(access, plan_collection(access, stream=stream, grace_s=grace_s, now_ms=now_ms))


@dataclass(frozen=True)
class Collection:
    """A collector pass as planned: its steps and how many job records it read."""

    stream: str | None
    steps: list[GcStep]
    records: int


def plan_collection(access: Access, *, stream: str | None, grace_s: float, now_ms: int | None = None
                    ) -> Collection:
    """The reads, in :mod:`~scriba.pipeline.staging`'s order (ledgers, records, streams), and the plan."""
    ledgers = [led for led in _staged_ledgers(access) if stream is None or led.stream == stream]
    rows = [StagingRow(key, raw.version, StagingRecord.from_bytes(raw.value))
            for key, raw in _scan(access, staging_prefix(stream))]
    names = {led.stream for led in ledgers} | {row.record.stream for row in rows}
    segments = {name: _held(access, name) for name in sorted(names)}
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return Collection(stream, plan_gc(ledgers, rows, segments, now_ms=now, grace_ms=int(grace_s * 1000)), len(rows))


def run_collection(access: Access, collection: Collection) -> GcReport:
    report = GcReport(kept=collection.records)
    for step in collection.steps:
        if isinstance(step, Collect):
            if _collect(access, StagingRow(step.key, step.version, step.record), step.ledgers):
                report.collected.append(step.record.job)
                report.deleted_ledgers += step.ledgers
                report.kept -= 1
        elif isinstance(step, RollForward):
            _roll_forward(access, StagingRow(step.key, step.version, step.record), others=step.others)
            report.rolled_forward.append(step.record.job)
            report.deleted_ledgers += step.others
            report.kept -= 1
        else:
            _delete(access, step.ledgers)
            report.deleted_ledgers += step.ledgers
    log.info("pipeline_staged_collected", stream=collection.stream, collected=report.collected,
             rolled_forward=report.rolled_forward, ledgers=report.deleted_ledgers)
    return report


# --- the steps ------------------------------------------------------------------------------
def _collect(access: Access, row: StagingRow, ledgers: Iterable[int]) -> bool:
    """Delete the record at the version read; only if that held, the ledgers."""
    try:
        access.run(access.client.store.delete(row.key, expected_version=row.version))
    except (BadVersionError, NoSuchKeyError):
        return False  # its commit passed the commit point first (or another collector took it)
    _delete(access, sorted(set(ledgers) - _held(access, row.record.stream)))
    return True


def _roll_forward(access: Access, row: StagingRow, others: Iterable[int] | None) -> None:
    """Adopt the committing record's ledgers (a no-op if adopted), delete the job's other
    staged ledgers (``None``: found by a scan), then the record."""
    rec = row.record
    if rec.ledgers and not set(rec.ledgers) <= _held(access, rec.stream):
        try:
            access.adopt(rec.stream, list(rec.ledgers))
        except NoSuchLedgerError:
            # Nothing but truncation deletes a listed ledger, once adopted: a driver that died
            # between adopting and deleting the record, a stream truncated since. Never truncated:
            # the ledgers were lost, which must not pass unseen.
            if _truncated_before(access, rec.stream) == ZERO:
                raise
            log.warning("pipeline_committed_ledgers_truncated", stream=rec.stream, job=rec.job)
    if others is None:
        others = set(_staged_by(access, rec.job)) - set(rec.ledgers)
    _delete(access, sorted(set(others) - _held(access, rec.stream)))
    try:
        access.run(access.client.store.delete(row.key))
    except NoSuchKeyError:
        pass  # a twin (the driver and a collector) finished it too


def _held(access: Access, stream: str) -> set[int]:
    """Every ledger ``stream`` holds (segments and ledgers being deleted); empty if it is gone."""
    if not stream:
        return set()
    ns, name = split_stream(stream)
    try:
        record = access.run(access.namespace(ns).catalog.read_stream(name)).value
    except (NamespaceNotFoundError, StreamNotFoundError):
        return set()
    return {s.ledger_id for s in record.segments} | set(record.deleting)


def _listed(access: Access, stream: str) -> set[int]:
    """The ledgers ``committing`` records of ``stream`` will adopt."""
    records = [StagingRecord.from_bytes(raw.value) for _, raw in _scan(access, staging_prefix(stream))]
    return {i for rec in records if rec.state == "committing" for i in rec.ledgers}


def _truncated_before(access: Access, stream: str) -> Position:
    ns, name = split_stream(stream)
    return access.run(access.namespace(ns).catalog.read_stream(name)).value.truncated_before


def _staged_ledgers(access: Access) -> list[StagedLedger]:
    found = []
    for key, raw in _scan(access, LEDGERS_PREFIX):
        meta = LedgerMetadata.from_bytes(raw.value)
        job = meta.custom_metadata.get("staged")
        if job:
            found.append(StagedLedger(int(key.rsplit("/", 1)[-1]), job, meta.custom_metadata.get("stream", ""),
                                      meta.ctime_ms))
    return found


def _staged_by(access: Access, job: str) -> list[int]:
    return sorted(led.ledger_id for led in _staged_ledgers(access) if led.job == job)


def _scan(access: Access, prefix: str) -> list[tuple[str, Versioned[bytes]]]:
    async def scan() -> list[tuple[str, Versioned[bytes]]]:
        return [(key, raw) async for key, raw in access.client.store.scan(prefix)]
    return access.run(scan())


def _delete(access: Access, ledgers: Iterable[int]) -> None:
    ids = tuple(ledgers)
    if ids:
        access.delete_ledgers(ids)
