"""Prometheus metrics of autorecovery (a registry per process, so tests may run several).

Workers count what they copied (``scriba_autorecovery_entries_replicated_total``,
``..._bytes_replicated_total``: rate() gives entries/s and bytes/s) and what they
finished; the auditor sets the under-replicated ledgers and fragments it sees, whether
it leads and with which token, and when its last full check ended.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class AutorecoveryMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.entries_replicated = Counter(
            "scriba_autorecovery_entries_replicated", "entries copied to new bookies", registry=r)
        self.bytes_replicated = Counter(
            "scriba_autorecovery_bytes_replicated", "bytes copied to new bookies", registry=r)
        self.fragments_repaired = Counter(
            "scriba_autorecovery_fragments_repaired", "ensemble changes written by workers", registry=r)
        self.ledgers_repaired = Counter(
            "scriba_autorecovery_ledgers_repaired", "under-replication records closed", registry=r)
        self.underreplicated_ledgers = Gauge(
            "scriba_autorecovery_underreplicated_ledgers", "ledgers with an under-replication record",
            registry=r)
        self.underreplicated_fragments = Gauge(
            "scriba_autorecovery_underreplicated_fragments", "fragments marked under-replicated",
            registry=r)
        self.auditor_leader = Gauge(
            "scriba_autorecovery_auditor_leader", "1 while this process is the elected auditor",
            registry=r)
        self.auditor_token = Gauge(
            "scriba_autorecovery_auditor_token", "fencing token of this process's auditor term",
            registry=r)
        self.last_full_check = Gauge(
            "scriba_autorecovery_last_full_check_seconds",
            "wall time (s since the epoch) at which the last check of every ledger ended", registry=r)
        self.lost_bookies = Gauge(
            "scriba_autorecovery_lost_bookies", "bookies gone longer than the recovery delay",
            registry=r)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
