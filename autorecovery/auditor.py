"""The auditor: one elected instance marks under-replicated ledgers.

Election: ``scriba.meta.election`` on ``elections/autorecovery-auditor/leader``; the
record's ``created`` revision is the **fencing token**. Every record the auditor
writes goes in a transaction that also checks the election record is still at the
version it won with, so a deposed auditor (paused, partitioned, its session gone)
cannot write a mark after a successor took over.

While leading, every ``audit_tick_s``:

- the bookie registry's membership feeds ``marks.Membership``; a bookie gone for
  ``lost_bookie_recovery_delay_s`` (0: at once) is **lost**, a bookie with a DRAINING
  decommission record is **draining**;
- when that set gains a bookie, when ``audit-now`` asks (``autorecovery/requests/
  audit``) or every ``check_interval_s``, a pass scans every ledger's metadata and
  merges a mark per (fragment, bookie) into the ledger's under-replication record
  (compare-and-set, fenced as above). The periodic and requested passes also check
  placement adherence (a fragment whose ensemble now fails its policy is marked on
  the bookie whose move fixes it) and read sampled entries (every entry with
  ``--full``) from every replica of their write sets (a copy missing or corrupt on a
  live bookie is marked UNREADABLE).

Open ledgers whose writer is gone are recovered by the worker that holds their record
once their LAC and metadata have not moved for ``open_ledger_grace_s`` (see
``worker``). The auditor publishes its state in ``autorecovery/auditor``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scriba.autorecovery.config import AutorecoveryConfig
from scriba.autorecovery.marks import Membership, marks_for, placement_marks
from scriba.autorecovery.metrics import AutorecoveryMetrics
from scriba.autorecovery.records import (
    AUDIT_REQUEST_KEY,
    AUDITOR_ELECTION,
    AUDITOR_STATUS_KEY,
    DECOMMISSION_PREFIX,
    UNDERREPLICATED_PREFIX,
    AuditorStatus,
    AuditRequest,
    Decommission,
    DecommissionState,
    Mark,
    Reason,
    UnderReplicated,
    underreplicated_key,
)
from scriba.autorecovery.replicas import check_replicas
from scriba.client import Client
from scriba.clock import Clock, SystemClock
from scriba.entry import make_digest, master_key
from scriba.errors import BadVersionError, ConfigError, NoSuchKeyError, NotLeaderError, ScribaError
from scriba.ids import BookieId, LedgerId
from scriba.log import get_logger
from scriba.meta.election import Election, Leadership, election_key
from scriba.meta.records import LEDGERS_PREFIX, LedgerMetadata
from scriba.meta.store import Check, Put

log = get_logger(__name__)

MARK_ATTEMPTS_MAX = 16


@dataclass(slots=True)
class PassReport:
    ledgers: int = 0
    marked_ledgers: int = 0
    marks: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


class Auditor:
    def __init__(
        self,
        client: Client,
        config: AutorecoveryConfig | None = None,
        *,
        candidate: str,
        clock: Clock | None = None,
        metrics: AutorecoveryMetrics | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._client = client
        self._store = client.store
        self._config = (config or AutorecoveryConfig()).validate()
        self.candidate = candidate
        self._clock = clock or SystemClock()
        self._metrics = metrics
        self._rng = rng or random.Random()
        self._election = Election(self._store, AUDITOR_ELECTION)
        self._election_key = election_key(AUDITOR_ELECTION)
        self.leadership: Leadership | None = None
        self.passes: list[PassReport] = []
        self._status = AuditorStatus(candidate, 0, 0)

    # --- election ---------------------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Campaign, lead until leadership is lost or ``stop`` is set, campaign again."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            campaign = asyncio.ensure_future(self._election.campaign(self.candidate))
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({campaign, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not campaign.done():
                campaign.cancel()
                with contextlib.suppress(asyncio.CancelledError, ScribaError):
                    await campaign
                stopping.cancel()
                break
            stopping.cancel()
            leadership = campaign.result()
            self.leadership = leadership
            try:
                await self._lead(leadership, stop)
            finally:
                if self._metrics is not None:
                    self._metrics.auditor_leader.set(0)
                await self._election.resign()
                self.leadership = None

    async def _lead(self, leadership: Leadership, stop: asyncio.Event) -> None:
        log.info("auditor_elected", candidate=self.candidate, token=leadership.token)
        if self._metrics is not None:
            self._metrics.auditor_leader.set(1)
            self._metrics.auditor_token.set(leadership.token)
        membership = Membership(self._config.lost_bookie_recovery_delay_s, self._clock.monotonic())
        self._status = AuditorStatus(self.candidate, leadership.token, self._wall_ms())
        marked: frozenset[BookieId] = frozenset()
        request_seen = await self._audit_request()
        next_check = self._clock.monotonic()  # a full check at once when elected
        while not stop.is_set() and not leadership.lost.is_set():
            now = self._clock.monotonic()
            membership.observe(self._client.registry.registrations.keys(), now)
            moves = self._moves(membership.lost(now), await self._draining())
            request = await self._audit_request()
            check = now >= next_check or (request is not None and request != request_seen)
            if check or not frozenset(moves) <= marked:
                full = request is not None and request != request_seen and request.full
                report = await self._pass(leadership, membership, moves, check=check, full=full)
                marked = frozenset(moves)
                if check:
                    request_seen = request
                    next_check = now + self._config.check_interval_s
                    self._status = _replace_status(self._status, last_full_check_ms=self._wall_ms())
                    if self._metrics is not None:
                        self._metrics.last_full_check.set(self._clock.wall())
                self._status = _replace_status(
                    self._status, last_check_ms=self._wall_ms(), ledgers_checked=report.ledgers,
                    marks_written=self._status.marks_written + report.marks)
            await self._publish(leadership, membership, now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_either(stop, leadership.lost), self._config.audit_tick_s)

    # --- one pass over every ledger -----------------------------------------------------
    async def audit_now(self, *, full: bool = False) -> PassReport:
        """One checking pass now (the caller must lead: tests and ``audit-now`` in-process)."""
        leadership = self.leadership
        if leadership is None:
            raise NotLeaderError(f"auditor {self.candidate} does not lead")
        membership = Membership(self._config.lost_bookie_recovery_delay_s, self._clock.monotonic())
        membership.observe(self._client.registry.registrations.keys(), self._clock.monotonic())
        moves = self._moves(membership.lost(self._clock.monotonic()), await self._draining())
        return await self._pass(leadership, membership, moves, check=True, full=full)

    async def _pass(
        self, leadership: Leadership, membership: Membership, moves: Mapping[BookieId, Reason],
        *, check: bool, full: bool,
    ) -> PassReport:
        report = PassReport()
        topology = self._client.registry.topology()
        live = frozenset(self._client.registry.registrations)
        async for _key, raw in self._store.scan(LEDGERS_PREFIX):
            try:
                md = LedgerMetadata.from_bytes(raw.value)
            except ScribaError as exc:
                log.warning("ledger_record_unreadable", key=_key, error=str(exc))
                continue
            report.ledgers += 1
            membership.referenced(md.bookies())
            marks = marks_for(md, moves)
            if check:
                marks.extend(await self._check_ledger(md, topology, live, full=full))
            if marks:
                written = await self._mark(leadership, md.ledger_id, marks)
                report.marked_ledgers += 1 if written else 0
                report.marks += len(marks) if written else 0
                for m in marks:
                    report.by_reason[m.reason.value] = report.by_reason.get(m.reason.value, 0) + 1
        await self._count_underreplicated()
        self.passes.append(report)
        log.info("audit_pass", candidate=self.candidate, ledgers=report.ledgers,
                 marked=report.marked_ledgers, marks=report.marks, check=check, full=full)
        return report

    async def _check_ledger(
        self, md: LedgerMetadata, topology: Any, live: frozenset[BookieId], *, full: bool
    ) -> list[Mark]:
        marks: list[Mark] = []
        if self._config.check_placement:
            marks.extend(placement_marks(md, topology, self._policy(md)))
        sample = None if full else self._config.check_sample_entries
        if sample == 0:
            return marks
        password = self._config.password_for(md.password_hash, md.password)
        digest = None if password is None else make_digest(md.digest_type.value, password)
        key = b"" if password is None else master_key(password)
        problems = await check_replicas(
            self._client.transport, md, digest=digest, master_key=key, sample=sample,
            skip=md.bookies() - live, rng=self._rng,
        )
        # Only answers that say the copy is not there or not right; a bookie that did not
        # answer is a membership matter, not a mark, and one that refused a read of a
        # ledger whose password is unknown here (no admin identity) says nothing of the copy.
        for p in problems:
            if p.error in ("UnavailableError", "DeadlineExceededError", "UnauthorizedError"):
                continue
            marks.append(Mark(p.segment_first, p.bookie_id, Reason.UNREADABLE))
        return marks

    async def _mark(self, leadership: Leadership, ledger_id: LedgerId, marks: list[Mark]) -> bool:
        """Merge ``marks`` into the ledger's record, fenced by the election record."""
        key = underreplicated_key(ledger_id)
        fence = Check(self._election_key, leadership.version)
        for _ in range(MARK_ATTEMPTS_MAX):
            try:
                raw = await self._store.get(key)
            except NoSuchKeyError:
                record = UnderReplicated(ledger_id, (), self._wall_ms(), leadership.token).merged(marks)
                check = Check(key, None)
            else:
                current = UnderReplicated.from_bytes(raw.value)
                if current.covers(marks):
                    return False
                record = current.merged(marks)
                record = UnderReplicated(
                    record.ledger_id, record.marks, self._wall_ms(), leadership.token,
                    record.attempts, 0, record.deferred, record.last_error,
                )
                check = Check(key, raw.version)
            try:
                await self._store.txn([fence, check], [Put(key, record.to_bytes())])
            except BadVersionError:
                await self._check_still_leading(leadership)
                continue
            log.info("ledger_marked_underreplicated", ledger_id=ledger_id,
                     bookies=list(record.bookies), token=leadership.token)
            return True
        raise BadVersionError(f"{key}: gave up after {MARK_ATTEMPTS_MAX} conflicting updates")

    async def _check_still_leading(self, leadership: Leadership) -> None:
        try:
            raw = await self._store.get(self._election_key)
        except NoSuchKeyError:
            raw = None
        if raw is None or raw.created != leadership.token or raw.version != leadership.version:
            leadership.lose("election record changed under a fenced write")
            raise NotLeaderError(f"auditor {self.candidate} (token {leadership.token}) was deposed")

    # --- helpers ----------------------------------------------------------------------
    def _moves(self, lost: frozenset[BookieId], draining: set[BookieId]) -> dict[BookieId, Reason]:
        moves = {b: Reason.LOST for b in lost}
        moves.update({b: Reason.DECOMMISSION for b in draining})
        return moves

    async def _draining(self) -> set[BookieId]:
        out: set[BookieId] = set()
        for _key, raw in await self._store.list(DECOMMISSION_PREFIX):
            with contextlib.suppress(ScribaError):
                record = Decommission.from_bytes(raw.value)
                if record.state is DecommissionState.DRAINING:
                    out.add(record.bookie_id)
        return out

    async def _audit_request(self) -> AuditRequest | None:
        try:
            raw = await self._store.get(AUDIT_REQUEST_KEY)
            return AuditRequest.from_bytes(raw.value)
        except (NoSuchKeyError, ScribaError):
            return None

    async def _count_underreplicated(self) -> None:
        if self._metrics is None:
            return
        ledgers = fragments = 0
        async for _key, raw in self._store.scan(UNDERREPLICATED_PREFIX):
            with contextlib.suppress(ScribaError):
                fragments += len(UnderReplicated.from_bytes(raw.value).fragment_firsts)
                ledgers += 1
        self._metrics.underreplicated_ledgers.set(ledgers)
        self._metrics.underreplicated_fragments.set(fragments)

    async def _publish(self, leadership: Leadership, membership: Membership, now: float) -> None:
        lost = tuple(sorted(membership.lost(now)))
        if self._metrics is not None:
            self._metrics.lost_bookies.set(len(lost))
        status = _replace_status(
            self._status, updated_ms=self._wall_ms(), lost_bookies=lost,
            pending_bookies={str(b): round(s, 1) for b, s in membership.pending(now).items()},
        )
        self._status = status
        with contextlib.suppress(BadVersionError):
            await self._store.txn([Check(self._election_key, leadership.version)],
                                  [Put(AUDITOR_STATUS_KEY, status.to_bytes())])

    def _policy(self, md: LedgerMetadata) -> Any:
        from scriba.placement import make_policy

        try:
            return make_policy(md.placement_policy, md.placement_options, rng=self._rng)
        except ConfigError:
            return make_policy("random", rng=self._rng)

    def _wall_ms(self) -> int:
        return int(self._clock.wall() * 1000)


def _replace_status(status: AuditorStatus, **changes: Any) -> AuditorStatus:
    import dataclasses

    return dataclasses.replace(status, **changes)


async def _either(a: asyncio.Event, b: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
