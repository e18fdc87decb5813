"""``audit``: the auditor at scale -- every replica of every entry, and every ensemble's placement.

Theory of operation. The driver lists the ledgers (the segment ledgers of a
namespace's streams, explicit ids, or every ledger in the metadata store) and Spark
spreads them over tasks (``ledgers_per_task`` each). A task opens its own client and,
per ledger, reads the metadata, then every confirmed entry (a closed ledger's up to
its last entry, an open one's up to its LAC) from *every* bookie of its write set
(:func:`scriba.autorecovery.replicas.check_replicas`: the digest is verified when the
password given matches the ledger's, else only the header), and checks each
ensemble against the ledger's placement policy on the current topology. What is
found becomes a row (:data:`AUDIT_SCHEMA_DDL`):

- ``missing``: the bookie answered that it has no such entry or ledger;
- ``corrupt``: the copy fails its digest or its header names another entry;
- ``unreadable``: the bookie did not answer (down, timed out);
- ``misplaced``: an ensemble (``entry_id`` = its first entry) fails its placement policy.

The rows come back as a DataFrame; :class:`AuditReport` counts them (and the
ledgers and replicas checked, through accumulators).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from scriba.errors import ConfigError
from scriba.pipeline.access import Access
from scriba.tls import TlsConfig

AUDIT_SCHEMA_DDL = (
    "ledger_id BIGINT, segment_first BIGINT, entry_id BIGINT, bookie STRING, problem STRING, detail STRING"
)
PROBLEMS = ("missing", "corrupt", "unreadable", "misplaced")
_MISSING = ("NoSuchEntryError", "NoSuchLedgerError")
_UNREADABLE = ("UnavailableError", "DeadlineExceededError", "TooManyRequestsError")


@dataclass(frozen=True, slots=True)
class AuditReport:
    ledgers: int
    replicas_checked: int
    missing: int
    corrupt: int
    unreadable: int
    misplaced: int

    @property
    def healthy(self) -> bool:
        return not (self.missing or self.corrupt or self.unreadable or self.misplaced)

    def line(self) -> str:
        verdict = "healthy" if self.healthy else "PROBLEMS"
        return (f"audit: {verdict}: {self.ledgers} ledgers, {self.replicas_checked} replicas checked; "
                f"missing {self.missing}, corrupt {self.corrupt}, unreadable {self.unreadable}, "
                f"misplaced {self.misplaced}")

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "healthy": self.healthy}, sort_keys=True)


def classify(error: str) -> str:
    """A :class:`~scriba.autorecovery.replicas.ReplicaProblem`'s error -> a problem kind."""
    if error in _MISSING:
        return "missing"
    if error in _UNREADABLE:
        return "unreadable"
    return "corrupt"  # digest mismatch, corrupt entry, header naming another entry


async def check_ledger(client: Any, ledger_id: int, password: bytes | None) -> tuple[list[tuple[Any, ...]], int]:
    """(problem rows, replicas checked) of one ledger."""
    from scriba.autorecovery.fragments import fragments
    from scriba.autorecovery.replicas import check_replicas
    from scriba.entry import make_digest, master_key, password_hash
    from scriba.meta.records import LedgerMetadata, ledger_key
    from scriba.placement import Adherence, make_policy

    md = LedgerMetadata.from_bytes((await client.store.get(ledger_key(ledger_id))).value)
    lac = None
    if not md.is_closed:
        reader = await client.open_ledger(ledger_id, password or b"", recovery=False)
        lac = int(reader.last_add_confirmed)
    digest = None
    key = b""
    if password is not None and password_hash(password) == md.password_hash:
        digest = make_digest(md.digest_type.value, password)
        key = master_key(password)
    rows: list[tuple[Any, ...]] = [
        (ledger_id, int(p.segment_first), int(p.entry_id), str(p.bookie_id), classify(p.error), p.error)
        for p in await check_replicas(client.transport, md, digest=digest, master_key=key, lac=lac)
    ]
    checked = 0
    topology = client.registry.topology()
    policy = make_policy(md.placement_policy, md.placement_options)
    for f in fragments(md):
        last = f.last_entry_id if f.last_entry_id is not None else lac
        if last is None or last < f.first_entry_id:
            continue
        checked += (last - f.first_entry_id + 1) * md.write_quorum_size
        if any(b not in topology.nodes for b in f.ensemble):
            continue  # a bookie the topology does not know: its replicas show as unreadable
        adherence = policy.adherence(topology, f.ensemble, md.write_quorum_size, md.ack_quorum_size)
        if adherence is Adherence.FAIL:
            rows.append((ledger_id, int(f.first_entry_id), int(f.first_entry_id), None, "misplaced",
                         f"{md.placement_policy}: {list(map(str, f.ensemble))}"))
    return rows, checked


def audit(
    spark: Any, metadata: str, *, namespace: str | None = None, ledgers: tuple[int, ...] = (),
    password: str | None = "", ledgers_per_task: int = 4, tls: TlsConfig | None = None,
) -> tuple[Any, AuditReport]:
    """Audit the ledgers of ``namespace`` (or ``ledgers``, or every ledger when neither is
    given). ``password``: the ledgers' password for digest checks (None: headers only);
    ``tls``: the driver and every task dial the bookies with it.
    Returns (the problems as a persisted DataFrame, and the report)."""
    if namespace is not None and ledgers:
        raise ConfigError("audit takes a namespace or ledger ids, not both")
    if ledgers_per_task <= 0:
        raise ConfigError(f"ledgers_per_task must be positive, got {ledgers_per_task}")
    with Access(metadata, (password or "").encode(), tls=tls) as access:
        ids = list(ledgers) or access.ledger_ids(namespace)
    sc = spark.sparkContext
    checked, audited = sc.accumulator(0), sc.accumulator(0)
    secret = None if password is None else password.encode()

    def run(part: Iterator[int]) -> Iterator[tuple[Any, ...]]:
        batch = list(part)
        if not batch:
            return
        with Access(metadata, secret or b"", tls=tls) as task_access:
            for ledger_id in batch:
                rows, n = task_access.run(check_ledger(task_access.client, ledger_id, secret))
                checked.add(n)
                audited.add(1)
                yield from rows

    slices = max(1, (len(ids) + ledgers_per_task - 1) // ledgers_per_task)
    problems = spark.createDataFrame(sc.parallelize(ids, slices).mapPartitions(run), AUDIT_SCHEMA_DDL)
    problems = problems.persist()  # counted once here; the caller's reads reuse it
    by_kind = {r["problem"]: int(r["count"]) for r in problems.groupBy("problem").count().collect()}
    report = AuditReport(int(audited.value), int(checked.value),
                         **{kind: by_kind.get(kind, 0) for kind in PROBLEMS})
    return problems, report
