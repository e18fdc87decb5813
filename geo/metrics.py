"""Prometheus metrics of a replicator process (a registry per process, so tests may run several).

Per stream and source: ``scriba_geo_lag_records`` (shipped, not yet confirmed in the
target), ``scriba_geo_lag_seconds`` (age of the oldest such record), the records shipped
and skipped (loop prevention) and the sessions started (each a fencing open of the target).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from scriba.geo.replicator import Replicator


class GeoMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r, labels = self.registry, ["stream", "source"]
        self.lag_records = Gauge("scriba_geo_lag_records", "records shipped, not yet confirmed in the target",
                                 labels, registry=r)
        self.lag_seconds = Gauge("scriba_geo_lag_seconds", "age of the oldest record not yet confirmed",
                                 labels, registry=r)
        self.shipped = Gauge("scriba_geo_records_shipped", "records shipped in this session", labels, registry=r)
        self.skipped = Gauge("scriba_geo_records_skipped", "records not shipped (their origin is the target)",
                             labels, registry=r)
        self.sessions = Gauge("scriba_geo_sessions", "sessions started (fencing opens of the target)",
                              ["stream"], registry=r)

    def update(self, replicator: Replicator) -> None:
        stream = f"{replicator.target.namespace.name}/{replicator.stream}"
        self.sessions.labels(stream).set(replicator.sessions)
        for source, lag in replicator.lag().items():
            self.lag_records.labels(stream, source).set(lag.records_behind)
            self.lag_seconds.labels(stream, source).set(lag.seconds_behind)
        for source, core in replicator.links().items():
            self.shipped.labels(stream, source).set(core.shipped)
            self.skipped.labels(stream, source).set(core.skipped)
