"""What the operator commands do, over the metadata store (the CLI and shell verbs print it).

- :func:`list_underreplicated` — every record, with its claim if a worker holds one;
- :func:`request_audit` — ask the elected auditor for a checking pass now (a counter
  record it polls; ``full`` reads every entry of every replica);
- :func:`mark_bookie` — mark every fragment that uses a bookie (``recover-bookie``,
  ``decommission``): the same CAS merge the auditor does, without its fence (an
  operator's mark is not an auditor's);
- :func:`ledgers_using` — the ledgers whose metadata still references a bookie;
- :func:`start_decommission` / :func:`finish_decommission` — the DRAINING / DONE record;
- :func:`drain` — run a worker here over the marked ledgers until none is left (the
  progress callback sees how many ledgers still use the bookie);
- :func:`status` — the auditor's published state, the leader, records, claims, drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from scriba.autorecovery.config import AutorecoveryConfig
from scriba.autorecovery.marks import marks_for, references
from scriba.autorecovery.records import (
    AUDIT_REQUEST_KEY,
    AUDITOR_ELECTION,
    AUDITOR_STATUS_KEY,
    DECOMMISSION_CODEC,
    DECOMMISSION_PREFIX,
    UNDERREPLICATED_CODEC,
    UNDERREPLICATED_PREFIX,
    AuditorStatus,
    AuditRequest,
    Decommission,
    DecommissionState,
    Reason,
    UnderReplicated,
    decommission_key,
    underreplicated_key,
)
from scriba.autorecovery.worker import ReplicationWorker, claims
from scriba.errors import BadVersionError, KeyExistsError, NoSuchKeyError, ScribaError
from scriba.ids import BookieId, LedgerId
from scriba.meta.election import Election
from scriba.meta.records import LEDGERS_PREFIX, LedgerMetadata
from scriba.meta.store import MetadataStore
from scriba.meta.update import update_metadata

MARK_ATTEMPTS_MAX = 16


def _now_ms() -> int:
    return int(time.time() * 1000)


async def list_underreplicated(store: MetadataStore) -> list[dict[str, Any]]:
    held = await claims(store)
    out = []
    for _key, raw in await store.list(UNDERREPLICATED_PREFIX):
        with contextlib.suppress(ScribaError):
            record = UnderReplicated.from_bytes(raw.value)
            doc = record.to_json()
            claim = held.get(record.ledger_id)
            doc["claimed_by"] = claim.worker_id if claim is not None else ""
            out.append(doc)
    return out


async def request_audit(store: MetadataStore, *, full: bool = False) -> int:
    """Bump the audit request's sequence; returns the new sequence."""
    for _ in range(MARK_ATTEMPTS_MAX):
        try:
            raw = await store.get(AUDIT_REQUEST_KEY)
        except NoSuchKeyError:
            try:
                await store.create(AUDIT_REQUEST_KEY, AuditRequest(1, full).to_bytes())
                return 1
            except KeyExistsError:
                continue
        seq = AuditRequest.from_bytes(raw.value).sequence + 1
        try:
            await store.set(AUDIT_REQUEST_KEY, AuditRequest(seq, full).to_bytes(), expected_version=raw.version)
            return seq
        except BadVersionError:
            continue
    raise BadVersionError(f"{AUDIT_REQUEST_KEY}: gave up after {MARK_ATTEMPTS_MAX} conflicting updates")


async def ledgers_using(store: MetadataStore, bookie: BookieId) -> list[LedgerId]:
    out = []
    async for _key, raw in store.scan(LEDGERS_PREFIX):
        with contextlib.suppress(ScribaError):
            md = LedgerMetadata.from_bytes(raw.value)
            if references(md, bookie):
                out.append(md.ledger_id)
    return out


async def mark_bookie(store: MetadataStore, bookie: BookieId, reason: Reason) -> int:
    """Mark every fragment that uses ``bookie``; returns the ledgers marked."""
    marked = 0
    async for _key, raw in store.scan(LEDGERS_PREFIX):
        try:
            md = LedgerMetadata.from_bytes(raw.value)
        except ScribaError:
            continue
        marks = marks_for(md, {bookie: reason})
        if not marks:
            continue
        key = underreplicated_key(md.ledger_id)
        fresh = UnderReplicated(md.ledger_id, (), _now_ms()).merged(marks)
        try:
            await store.create(key, fresh.to_bytes())
        except KeyExistsError:
            await update_metadata(
                store, key, UNDERREPLICATED_CODEC,
                lambda r, m=marks: not r.covers(m),  # type: ignore[misc]
                lambda r, m=marks: replace(r.merged(m), retry_after_ms=0),  # type: ignore[misc]
            )
        marked += 1
    return marked


async def start_decommission(store: MetadataStore, bookie: BookieId) -> Decommission:
    record = Decommission(bookie, DecommissionState.DRAINING, _now_ms())
    key = decommission_key(bookie)
    try:
        await store.create(key, record.to_bytes())
    except KeyExistsError:
        current = await update_metadata(
            store, key, DECOMMISSION_CODEC,
            lambda r: r.state is not DecommissionState.DRAINING,
            lambda r: Decommission(bookie, DecommissionState.DRAINING, _now_ms()),
        )
        value: Decommission = current.value
        return value
    return record


async def finish_decommission(store: MetadataStore, bookie: BookieId) -> Decommission:
    current = await update_metadata(
        store, decommission_key(bookie), DECOMMISSION_CODEC,
        lambda r: r.state is not DecommissionState.DONE,
        lambda r: replace(r, state=DecommissionState.DONE, finished_ms=_now_ms()),
    )
    value: Decommission = current.value
    return value


async def drain(
    client: Any, bookie: BookieId, config: AutorecoveryConfig, reason: Reason,
    *, progress: Callable[[int, int], None], poll_s: float = 0.5,
) -> int:
    """Mark, then repair here (beside any other worker) until no ledger uses ``bookie``.

    ``progress(left, total)`` after every pass. Returns the ledgers that used it at first.
    """
    store = client.store
    total = len(await ledgers_using(store, bookie))
    worker = ReplicationWorker(client, config, worker_id=f"drain-{bookie}")
    left = total
    progress(left, total)
    while left:
        await mark_bookie(store, bookie, reason)
        using = await ledgers_using(store, bookie)
        await worker.run_once(only=set(using))
        left = len(await ledgers_using(store, bookie))
        progress(left, total)
        if left:
            await asyncio.sleep(poll_s)
    return total


async def status(store: MetadataStore) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    leader = await Election(store, AUDITOR_ELECTION).leader()
    doc["auditor_leader"] = None if leader is None else {"candidate": leader[0], "token": leader[1]}
    try:
        raw = await store.get(AUDITOR_STATUS_KEY)
        published = AuditorStatus.from_bytes(raw.value).to_json()
        published["age_s"] = round(max(0, _now_ms() - published["updated_ms"]) / 1000, 1)
        doc["auditor"] = published
    except (NoSuchKeyError, ScribaError):
        doc["auditor"] = None
    records = await list_underreplicated(store)
    doc["underreplicated_ledgers"] = len(records)
    doc["underreplicated_fragments"] = sum(r["fragments"] for r in records)
    doc["claims"] = {str(k): c.worker_id for k, c in (await claims(store)).items()}
    drains = []
    for _key, raw in await store.list(DECOMMISSION_PREFIX):
        with contextlib.suppress(ScribaError):
            d = Decommission.from_bytes(raw.value)
            drains.append({"bookie_id": d.bookie_id, "state": d.state.value, "started_ms": d.started_ms})
    doc["decommissions"] = drains
    return doc
