"""``compact``: an RSM snapshot built from its command stream by a Spark job, stored where
the replicas restore from, and checked by restoring it.

Theory of operation. An RSM group ``NS/NAME`` keeps its commands in the stream
``NS/NAME`` (every record an :class:`~scriba.rsm.envelope.Envelope`) and its snapshots
in the catalog ``rsm/<group>/snapshots``. The job:

1. starts from the group's newest snapshot whose digest checks (restored into a fresh
   :class:`~scriba.rsm.state.ReplicatedState` around ``machine()``), or from an empty
   state when there is none: a second run only reads what came after the first;
2. fixes the end ``up_to`` (default: the stream's end when the job starts, so
   concurrent appends wait for the next run) and reads ``[start, up_to)`` through the
   ``scriba`` source, partitions in parallel (one per segment or entry range), handed
   to the driver in position order (``toLocalIterator``: one partition in memory at a time);
3. applies every record through ``ReplicatedState.apply``, the replicas' own step:
   sessions deduplicate retried commands, the replicated clock expires sessions,
   and positions must strictly increase (an out-of-order record raises), so the state
   is by construction the one a replica would hold at the last record read: for the KV
   example, last-write-wins per key with etcd's revisions, as of that position;
4. stores the snapshot with the RSM's own ``store_snapshot`` (a new ledger, the catalog
   CAS, the older snapshots beyond ``kept`` dropped, the stream truncated before the
   oldest kept, exactly as a replica does);
5. proves it: reads the stored snapshot back (digest-checked), restores it into a
   second fresh state and requires that state's snapshot digest to equal the replayed
   state's. A mismatch (a machine whose ``restore`` loses something) raises
   :class:`~scriba.errors.SnapshotCorruptError` and names both digests.

The fold runs on the driver because an RSM's apply is sequential by definition (a
session's retry, a Txn's compare, a lease expiry depend on everything before them);
Spark parallelises the reading and decoding of segments. ``machine`` is a
zero-argument callable (``module:attribute`` on the command line); the session
settings must match the group's ``RsmConfig``.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from scriba.errors import ConfigError, PositionTruncatedError, SnapshotCorruptError
from scriba.pipeline.access import Access
from scriba.pipeline.plan import split_stream, tls_options
from scriba.rsm import RsmConfig, StateMachine
from scriba.rsm import membership as mb
from scriba.rsm.envelope import Envelope
from scriba.rsm.snapshot_store import digest_of, load_newest, read_snapshot, store_snapshot
from scriba.rsm.state import ReplicatedState
from scriba.stream import Position
from scriba.stream.position import ZERO
from scriba.tls import TlsConfig


@dataclass(frozen=True, slots=True)
class CompactReport:
    group: str
    started_from: str | None  # the snapshot position the run restored first (None: empty state)
    position: str  # the snapshot covers every record up to and including this one
    records_read: int
    records_applied: int  # since the stream began (the snapshot's count)
    ledger_id: int
    size_bytes: int
    digest: str  # SHA-256 of the stored chunks: the replayed state's = the restored state's

    def line(self) -> str:
        return (f"compact: {self.group} snapshot at {self.position} ({self.records_read} records read, "
                f"{self.size_bytes} bytes, ledger {self.ledger_id}); restored digest {self.digest[:16]} verified")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def machine_factory(spec: str) -> Callable[[], StateMachine]:
    """``module:attribute`` -> the callable it names (``scriba pipeline compact --machine``)."""
    module, _, attribute = spec.partition(":")
    if not module or not attribute:
        raise ConfigError(f"--machine {spec!r}: expected module:attribute, e.g. "
                          "scriba.examples.kvstore.machine:KvMachine")
    try:
        factory = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--machine {spec!r}: {type(exc).__name__}: {exc}") from None
    if not callable(factory):
        raise ConfigError(f"--machine {spec!r} is not callable")
    return factory  # type: ignore[no-any-return]


def compact(
    spark: Any, metadata: str, stream: str, machine: Callable[[], StateMachine], *,
    up_to: str = "latest", password: str = "", config: RsmConfig | None = None,
    max_records_per_partition: int | None = None, tls: TlsConfig | None = None,
) -> CompactReport:
    """Snapshot the RSM group whose command stream is ``stream`` ("ns/name") as of
    ``up_to`` (exclusive; "latest" = its end now; ``tls``: how every connection dials the
    bookies); see the module docstring."""
    cfg = config or RsmConfig()
    cfg.validate()
    ns_name, name = split_stream(stream)
    group = mb.group_token(ns_name, name)
    key = mb.catalog_key(group)
    pw = password.encode()

    def fresh() -> ReplicatedState:
        return ReplicatedState(machine(), session_ttl_ms=cfg.session_ttl_ms,
                               session_results_max=cfg.session_results_max)

    state = fresh()
    with Access(metadata, pw, tls=tls) as access:
        found = access.run(load_newest(access.client, key, None, pw))
        if found is not None:
            state.restore(found[1])
        view = access.view(stream)
        end = view.resolve(up_to)
    started = state.applied
    if started is None and view.record.truncated_before > ZERO:
        raise PositionTruncatedError(
            f"compact {stream}: the stream is truncated before {view.record.truncated_before} and the group has "
            "no usable snapshot: the state cannot be rebuilt")
    start = started if started is not None else ZERO
    read = 0
    if end > start:  # a start before the truncation point fails in the source (failOnDataLoss)
        reader = (spark.read.format("scriba").option("metadata", metadata).option("stream", stream)
                  .option("password", password).option("startingPosition", str(start))
                  .option("endingPosition", str(end)).options(**tls_options(tls)))
        if max_records_per_partition is not None:
            reader = reader.option("maxRecordsPerPartition", str(max_records_per_partition))
        for row in reader.load().select("segment", "entry_id", "slot", "payload").toLocalIterator():
            position = Position(row.segment, row.entry_id, row.slot)
            if started is not None and position <= started:
                continue  # the restored snapshot's own last record
            state.apply(position, Envelope.decode(bytes(row.payload)))
            read += 1
    if state.applied is None:
        raise ConfigError(f"compact {stream}: no command up to {end}: nothing to snapshot")
    if read == 0 and found is not None:
        info = found[0]
        return CompactReport(group, str(started), str(info.position), 0, info.records_applied, info.ledger_id,
                             info.size_bytes, info.digest)
    chunks = state.snapshot(cfg.snapshot_chunk_bytes)
    with Access(metadata, pw, tls=tls) as access:
        info = access.run(store_snapshot(access.namespace(ns_name), name, key, chunks, state.applied,
                                         state.records_applied, state.token, cfg.snapshots_kept, pw))
        stored = access.run(read_snapshot(access.client, info, pw))  # digest-checked
    _verify(group, chunks, stored, cfg.snapshot_chunk_bytes, fresh)
    return CompactReport(group, str(started) if started is not None else None, str(info.position), read,
                         info.records_applied, info.ledger_id, info.size_bytes, info.digest)


def _verify(group: str, replayed: list[bytes], stored: list[bytes], chunk_bytes: int,
            fresh: Callable[[], ReplicatedState]) -> None:
    """The stored snapshot, restored into a fresh state, snapshots to the replayed bytes."""
    restored = fresh()
    restored.restore(stored)
    again = restored.snapshot(chunk_bytes)
    want, got = digest_of(replayed), digest_of(again)
    if got != want:
        raise SnapshotCorruptError(f"compact {group}: the restored state's digest {got[:16]}... differs from "
                                   f"the replayed state's {want[:16]}... (the machine's restore loses state)")
