"""Prometheus metrics of one bookie (a registry per bookie, so tests may run several).

Counted per batch on the add path (one ``inc(n)`` per batch, not one call per entry).
Storage figures (journal group size, fsync latency, bytes) are read from the storage's
``stats()`` mapping when it has one, through a custom collector at scrape time: among
them the entry logs' bytes, live and reclaimable bytes, and the progress of the
compaction pass under way (``scriba_storage_entry_log_*``, ``scriba_storage_compaction_*``).
GC passes are counted here (``scriba_bookie_compaction_*``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from scriba.bookie.compaction import CompactionResult
from scriba.errors import Status

_LATENCY_BUCKETS = (
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
)
_STATUS_NAMES = {int(s): s.name for s in Status}


class _StorageCollector(Collector):
    def __init__(self, stats: Callable[[], Mapping[str, float]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            stats = self._stats()
        except Exception:  # a scrape never breaks the bookie
            return
        for name, value in sorted(stats.items()):
            if isinstance(value, int | float):
                yield GaugeMetricFamily(f"scriba_storage_{name}", f"storage figure {name}", value=value)


class BookieMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.adds = Counter("scriba_bookie_adds", "Adds answered, by status", ["status"], registry=r)
        self.add_bytes = Counter("scriba_bookie_add_bytes", "Bytes of adds answered OK", registry=r)
        self.add_batch_seconds = Histogram(
            "scriba_bookie_add_batch_seconds",
            "Time from receiving an add batch to its answer",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.reads = Counter("scriba_bookie_reads", "Reads answered, by kind and status", ["kind", "status"], registry=r)
        self.read_seconds = Histogram(
            "scriba_bookie_read_seconds", "Read latency by kind", ["kind"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.read_only = Gauge("scriba_bookie_read_only", "1 when the bookie is read-only", registry=r)
        self.registered = Gauge("scriba_bookie_registered", "1 when registered in the metadata store", registry=r)
        self.free_bytes = Gauge("scriba_bookie_free_bytes", "Free bytes of the ledger disk", registry=r)
        self.total_bytes = Gauge("scriba_bookie_total_bytes", "Total bytes of the ledger disk", registry=r)
        self.gc_deleted = Counter("scriba_bookie_gc_deleted_ledgers", "Ledgers removed by GC", registry=r)
        self.gc_runs = Counter("scriba_bookie_gc_runs", "GC cycles, by outcome", ["outcome"], registry=r)
        self.compaction_runs = Counter(
            "scriba_bookie_compaction_runs", "GC passes over the entry logs, by kind (none: dead logs only)",
            ["kind"], registry=r,
        )
        self.compaction_logs = Counter(
            "scriba_bookie_compaction_logs",
            "Entry logs given back (removed: nothing live; compacted: live entries copied first)"
            " or kept (skipped: unreadable)", ["how"], registry=r,
        )
        self.compaction_reclaimed_bytes = Counter(
            "scriba_bookie_compaction_reclaimed_bytes", "Entry-log bytes given back (less those copied)",
            registry=r,
        )
        self.compaction_copied_bytes = Counter(
            "scriba_bookie_compaction_copied_bytes", "Live entry bytes copied by compaction", registry=r
        )
        self.compaction_copied_entries = Counter(
            "scriba_bookie_compaction_copied_entries", "Live entries copied by compaction", registry=r
        )
        self._ok = self.adds.labels(status="OK")
        self._by_status: dict[int, Any] = {}

    def count_ok(self, count: int, nbytes: int) -> None:
        self._ok.inc(count)
        self.add_bytes.inc(nbytes)

    def count_adds(self, status: int, count: int) -> None:
        child = self._by_status.get(status)
        if child is None:
            child = self.adds.labels(status=_STATUS_NAMES.get(status, str(status)))
            self._by_status[status] = child
        child.inc(count)

    def count_compaction(self, result: CompactionResult) -> None:
        self.compaction_runs.labels(kind=result.kind.value).inc()
        for how, n in (("removed", result.logs_removed), ("compacted", result.logs_compacted),
                       ("skipped", result.logs_skipped)):
            if n:
                self.compaction_logs.labels(how=how).inc(n)
        self.compaction_reclaimed_bytes.inc(max(0, result.bytes_reclaimed))
        self.compaction_copied_bytes.inc(result.bytes_copied)
        self.compaction_copied_entries.inc(result.entries_copied)

    def observe_read(self, kind: str, status: int, seconds: float) -> None:
        self.reads.labels(kind=kind, status=_STATUS_NAMES.get(status, str(status))).inc()
        self.read_seconds.labels(kind=kind).observe(seconds)

    def watch_storage(self, stats: Callable[[], Mapping[str, float]]) -> None:
        self.registry.register(_StorageCollector(stats))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
