"""Replication worker: claim an under-replicated ledger, copy, change the ensemble, release.

One pass over a ledger (:meth:`ReplicationWorker.repair_ledger`):

1. read its under-replication record (version ``v``) and its metadata;
2. turn the marks into work against the current metadata (``marks.work_for``);
   nothing left -> delete the record *at version v* (a mark added meanwhile makes
   the delete fail and the pass starts again) and stop;
3. per segment: plan (``plan.plan_repair``: the ledger's own placement policy picks
   the replacements), copy the entries (``copier``), then compare-and-set the
   ensemble change into the ledger's metadata through ``scriba.meta.update_metadata``
   (``plan.ensemble_change``); a plan the metadata no longer matches is made again;
4. work left (the part of an open ledger's last segment beyond its LAC, a segment no
   bookie can take yet) -> the record is rewritten with ``retry_after_ms``; an open
   ledger whose LAC and metadata have not moved for ``open_ledger_grace_s`` is
   recovered (fenced and closed, as BookKeeper does) so all of it can be repaired.

:meth:`ReplicationWorker.run` looks for records and takes one at a time under a
**claim**: an ephemeral record in the worker's metadata session, gone when the worker
dies (etcd lease / ZooKeeper session, ``claim_ttl_s``). The claim only saves work;
safety never rests on it: copies are idempotent, the metadata changes are CAS, and
the record is deleted only at the version whose marks were repaired. So two workers
on one ledger, a worker killed at any step, and a writer still appending leave the
metadata consistent and every mark either repaired or still recorded.

Workers run as ``scriba autorecovery run`` processes (or in the sandbox), not inside
bookies: the worker uses the ledger client, and ``bookie`` must not import ``client``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from scriba.autorecovery.config import AutorecoveryConfig
from scriba.autorecovery.copier import FragmentCopier
from scriba.autorecovery.fragments import is_last_segment
from scriba.autorecovery.marks import work_for
from scriba.autorecovery.metrics import AutorecoveryMetrics
from scriba.autorecovery.plan import RepairPlan, StalePlanError, ensemble_change, plan_repair
from scriba.autorecovery.records import (
    CLAIMS_PREFIX,
    DECOMMISSION_CODEC,
    DECOMMISSION_PREFIX,
    UNDERREPLICATED_CODEC,
    UNDERREPLICATED_PREFIX,
    Claim,
    DecommissionState,
    Deferred,
    UnderReplicated,
    claim_key,
    ledger_id_of,
    underreplicated_key,
)
from scriba.autorecovery.throttle import Throttle
from scriba.client import Client
from scriba.clock import Clock, SystemClock
from scriba.entry import make_digest, master_key
from scriba.errors import (
    BadVersionError,
    ConfigError,
    KeyExistsError,
    NoSuchKeyError,
    NotEnoughBookiesError,
    ScribaError,
)
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.log import get_logger
from scriba.meta.records import LEDGER_CODEC, LedgerMetadata, ledger_key
from scriba.meta.store import Versioned
from scriba.meta.update import read_record, update_metadata

log = get_logger(__name__)

PASSES_MAX = 8  # passes over one ledger per claim before it is released with work left


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one claim of a ledger ended with."""

    ledger_id: LedgerId
    state: str  # repaired | deferred | skipped | gone | failed
    entries: int = 0
    bytes: int = 0
    fragments: int = 0
    detail: str = ""


def make_throttle(config: AutorecoveryConfig, clock: Clock) -> Any:
    throttle = Throttle.of(config.entries_per_s, config.bytes_per_s)

    def wait(entries: int, size: int) -> float:
        return throttle.take(entries, size, clock.monotonic())

    return wait


class ReplicationWorker:
    def __init__(
        self,
        client: Client,
        config: AutorecoveryConfig | None = None,
        *,
        worker_id: str | None = None,
        clock: Clock | None = None,
        metrics: AutorecoveryMetrics | None = None,
        ensemble_cas: bool = True,
    ) -> None:
        self._client = client
        self._store = client.store
        self._config = (config or AutorecoveryConfig()).validate()
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:8]}"
        self._clock = clock or SystemClock()
        self._metrics = metrics
        self._throttle_wait = make_throttle(self._config, self._clock)
        self._ensemble_cas = ensemble_cas  # False: blind write (negative control only)
        self.outcomes: list[Outcome] = []

    # --- the loop ---------------------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Take records one at a time until ``stop`` is set."""
        stop = stop or asyncio.Event()
        log.info("replication_worker_started", worker=self.worker_id)
        while not stop.is_set():
            try:
                did = await self.run_once()
            except ScribaError as exc:
                log.warning("replication_worker_pass_failed", worker=self.worker_id, error=str(exc))
                did = False
            if not did:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._config.worker_poll_s)

    async def run_once(self, only: Collection[int] | None = None) -> bool:
        """Claim and process every eligible record once; True if any was processed."""
        did = False
        now_ms = int(self._clock.wall() * 1000)
        for key, raw in await self._store.list(UNDERREPLICATED_PREFIX):
            ledger_id = ledger_id_of(key)
            if only is not None and ledger_id not in only:
                continue
            try:
                record = UnderReplicated.from_bytes(raw.value)
            except ScribaError as exc:
                log.warning("underreplicated_unreadable", key=key, error=str(exc))
                continue
            if record.retry_after_ms > now_ms:
                continue
            outcome = await self.process(ledger_id)
            did = did or outcome.state != "skipped"
        return did

    async def process(self, ledger_id: int) -> Outcome:
        """Claim ``ledger_id``, repair it, release the claim."""
        lid = LedgerId(ledger_id)
        claim = Claim(self.worker_id, int(self._clock.wall() * 1000))
        try:
            version = await self._store.create(claim_key(lid), claim.to_bytes(), ephemeral=True)
        except KeyExistsError:
            return Outcome(lid, "skipped", detail="claimed by another worker")
        try:
            outcome = await self.repair_ledger(lid)
        except ScribaError as exc:
            outcome = Outcome(lid, "failed", detail=f"{type(exc).__name__}: {exc}")
            await self._note_failure(lid, outcome.detail)
        finally:
            with contextlib.suppress(NoSuchKeyError, BadVersionError):
                await self._store.delete(claim_key(lid), expected_version=version)
        self.outcomes.append(outcome)
        log.info("ledger_repair_pass", ledger_id=lid, worker=self.worker_id, state=outcome.state,
                 entries=outcome.entries, detail=outcome.detail)
        return outcome

    # --- one ledger -------------------------------------------------------------------
    async def repair_ledger(self, ledger_id: int) -> Outcome:
        """Repair what the ledger's record asks for (no claim: the caller holds one or not)."""
        lid = LedgerId(ledger_id)
        entries = size = done = 0
        for _ in range(PASSES_MAX):
            try:
                record = await read_record(self._store, underreplicated_key(lid), UNDERREPLICATED_CODEC)
            except NoSuchKeyError:
                return Outcome(lid, "gone", entries, size, done)
            try:
                versioned = await read_record(self._store, ledger_key(lid), LEDGER_CODEC)
            except NoSuchKeyError:
                await self._delete_record(record)
                return Outcome(lid, "gone", entries, size, done, "ledger deleted")
            md: LedgerMetadata = versioned.value
            password = self._config.password_for(md.password_hash, md.password)
            if password is None:
                await self._note_failure(lid, "the ledger's password is not among the configured ones")
                return Outcome(lid, "failed", entries, size, done, "password unknown")
            registered = set(self._client.registry.registrations)
            work = work_for(md, record.value.marks, registered=registered)
            if not work:
                if await self._delete_record(record):
                    if self._metrics is not None:
                        self._metrics.ledgers_repaired.inc()
                    return Outcome(lid, "repaired", entries, size, done)
                continue  # new marks arrived: another pass
            result = await self.repair_segments(md, work, password)
            entries, size, done = entries + result[0], size + result[1], done + result[2]
            left, lac = result[3], result[4]
            if result[5]:
                continue  # a plan went stale: plan again from fresh metadata
            if not left:
                continue  # all planned work applied: the next pass deletes the record
            if await self._defer_or_recover(record, lid, password, lac):
                continue  # recovered: the ledger is closed, repair the rest now
            return Outcome(lid, "deferred", entries, size, done, left)
        return Outcome(lid, "deferred", entries, size, done, "passes exhausted")

    async def repair_segments(
        self, md: LedgerMetadata, work: dict[EntryId, frozenset[BookieId]], password: bytes
    ) -> tuple[int, int, int, str, int | None, bool]:
        """(entries, bytes, fragments changed, why work is left, LAC read, stale)."""
        entries = size = done = 0
        left = ""
        lac: int | None = None
        if not md.is_closed and md.ensembles[-1][0] in work:
            lac = await self._read_lac(md.ledger_id, password)
        exclude = await self._draining()
        exclude |= {b for bookies in work.values() for b in bookies}
        copier = self._copier(md, password)
        topology = self._client.registry.topology()
        policy = self._policy(md)
        for first, move in work.items():
            try:
                plan = plan_repair(md, first, move, topology=topology, policy=policy,
                                   exclude=exclude, lac=lac if is_last_segment(md, first) else None)
            except NotEnoughBookiesError as exc:
                left = f"segment {first}: {exc}"
                continue
            if plan is None:
                continue
            if not plan.copies_anything:
                left = f"segment {first}: open, nothing confirmed beyond its start yet (LAC {lac})"
                continue
            stats = await copier.copy(md, plan)
            entries, size = entries + stats.entries, size + stats.bytes
            try:
                md = await self._apply(plan, md)
            except StalePlanError as exc:
                log.info("repair_plan_stale", ledger_id=md.ledger_id, error=str(exc))
                return entries, size, done, left, lac, True
            done += 1
            if self._metrics is not None:
                self._metrics.fragments_repaired.inc()
            log.info("fragment_repaired", ledger_id=md.ledger_id, entry_id=plan.segment_first,
                     detail=plan.describe(), entries=stats.entries)
            if not md.is_closed and is_last_segment(md, EntryId(plan.last_entry_id + 1)):
                left = f"segment {first}: repaired up to LAC {plan.last_entry_id}; the writer's tail remains"
        return entries, size, done, left, lac, False

    async def _apply(self, plan: RepairPlan, base: LedgerMetadata) -> LedgerMetadata:
        needs_update, transform = ensemble_change(plan)
        key = ledger_key(plan.ledger_id)
        if not self._ensemble_cas:
            # Negative control only: the change computed from the metadata the plan was
            # made from, written over whatever is there now (what the CAS prevents).
            current = await read_record(self._store, key, LEDGER_CODEC)
            new: LedgerMetadata = transform(base)
            await self._store.set(key, new.to_bytes(), expected_version=current.version)
            return new
        record = await update_metadata(
            self._store, key, LEDGER_CODEC, needs_update, transform,
            attempts_max=self._config.update_attempts_max,
        )
        value: LedgerMetadata = record.value
        return value

    # --- helpers ----------------------------------------------------------------------
    def _copier(self, md: LedgerMetadata, password: bytes) -> FragmentCopier:
        policy = self._policy(md)
        topology = self._client.registry.topology()

        def order(write_set: Any, failed: Any) -> list[BookieId]:
            return [BookieId(b) for b in policy.read_order(topology, write_set, failed=failed)]

        def progress(n: int, size: int) -> None:
            if self._metrics is not None:
                self._metrics.entries_replicated.inc(n)
                self._metrics.bytes_replicated.inc(size)

        return FragmentCopier(
            self._client.transport, digest=make_digest(md.digest_type.value, password),
            master_key=master_key(password), read_order=order, throttle_wait=self._throttle_wait,
            batch_entries=self._config.batch_entries, batch_bytes=self._config.batch_bytes,
            read_timeout_s=5.0, on_progress=progress,
        )

    def _policy(self, md: LedgerMetadata) -> Any:
        from scriba.placement import make_policy

        try:
            return make_policy(md.placement_policy, md.placement_options)
        except ConfigError as exc:
            log.warning("ledger_policy_unknown", ledger_id=md.ledger_id, error=str(exc))
            return make_policy("random")

    async def _read_lac(self, ledger_id: LedgerId, password: bytes) -> int:
        reader = await self._client.open_ledger(ledger_id, password, recovery=False)
        return int(await reader.read_last_add_confirmed())

    async def _draining(self) -> set[BookieId]:
        out: set[BookieId] = set()
        for _key, raw in await self._store.list(DECOMMISSION_PREFIX):
            try:
                record = DECOMMISSION_CODEC.from_bytes(raw.value)
            except ScribaError:
                continue
            if record.state is DecommissionState.DRAINING:
                out.add(record.bookie_id)
        return out

    async def _delete_record(self, record: Versioned[UnderReplicated]) -> bool:
        try:
            await self._store.delete(underreplicated_key(record.value.ledger_id),
                                     expected_version=record.version)
        except BadVersionError:
            return False
        except NoSuchKeyError:
            return True
        return True

    async def _defer_or_recover(
        self, record: Versioned[UnderReplicated], ledger_id: LedgerId, password: bytes,
        lac: int | None,
    ) -> bool:
        """Record work left; recover an open ledger stalled past the grace (True: recovered)."""
        now_ms = int(self._clock.wall() * 1000)
        versioned = await read_record(self._store, ledger_key(ledger_id), LEDGER_CODEC)
        md: LedgerMetadata = versioned.value
        deferred = record.value.deferred
        if not md.is_closed and lac is not None:
            same = (deferred is not None and deferred.lac == lac
                    and deferred.metadata_version == versioned.version)
            if same and deferred is not None and now_ms - deferred.since_ms >= self._config.open_ledger_grace_s * 1000:
                log.info("stalled_open_ledger_recovering", ledger_id=ledger_id, lac=lac)
                await self._client.open_ledger(ledger_id, password, recovery=True)
                return True
            if not same:
                deferred = Deferred(EntryId(lac), versioned.version, now_ms)
        new = replace(
            record.value, attempts=record.value.attempts + 1, deferred=deferred,
            retry_after_ms=now_ms + int(self._config.worker_retry_s * 1000),
        )
        with contextlib.suppress(BadVersionError, NoSuchKeyError):
            await self._store.set(underreplicated_key(ledger_id), new.to_bytes(),
                                  expected_version=record.version)
        return False

    async def _note_failure(self, ledger_id: LedgerId, error: str) -> None:
        now_ms = int(self._clock.wall() * 1000)

        def needs(record: UnderReplicated) -> bool:
            return record.last_error != error or record.retry_after_ms <= now_ms

        def change(record: UnderReplicated) -> UnderReplicated:
            return replace(record, last_error=error, attempts=record.attempts + 1,
                           retry_after_ms=now_ms + int(self._config.worker_retry_s * 1000))

        with contextlib.suppress(ScribaError):
            await update_metadata(self._store, underreplicated_key(ledger_id),
                                  UNDERREPLICATED_CODEC, needs, change)


async def claims(store: Any) -> dict[LedgerId, Claim]:
    """The ledgers being worked on now, and by whom."""
    out: dict[LedgerId, Claim] = {}
    for key, raw in await store.list(CLAIMS_PREFIX):
        with contextlib.suppress(ScribaError):
            out[ledger_id_of(key)] = Claim.from_bytes(raw.value)
    return out


def wall_ms() -> int:
    return int(time.time() * 1000)
