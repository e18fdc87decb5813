"""Configuration of one bookie process (everything but the storage engine's tunables).

A frozen dataclass built by the CLI (or a test) and checked by :meth:`BookieConfig.validate`,
which fails fast with a :class:`~scriba.errors.ConfigError` naming the field.

Directory layout derived from the config::

    <data_dir>/COOKIE              cookie of the ledger dir
    <data_dir>/ledgers/            storage's ledger dir (entry logs, index)
    <journal_dir or data_dir>/COOKIE
    <journal_dir or data_dir>/journal/   storage's journal dir
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scriba.bookie.compaction import CompactionPolicy
from scriba.config import require
from scriba.entry import ENTRY_SIZE_MAX_DEFAULT
from scriba.meta.records import DEFAULT_RACK, DEFAULT_REGION, DEFAULT_ZONE
from scriba.tls import TlsConfig


@dataclass(frozen=True, slots=True)
class BookieConfig:
    metadata_uri: str
    data_dir: Path
    listen_host: str = "127.0.0.1"
    listen_port: int = 3181
    # The binary data path (bookie/binary_server.py) on listen_host: 0 any free port,
    # None none (clients then use gRPC for this bookie).
    binary_port: int | None = 0
    journal_dir: Path | None = None  # None: the journal lives under data_dir
    bookie_id: str | None = None  # None: the advertised host:port
    advertised_host: str | None = None  # None: listen_host (or 127.0.0.1 for 0.0.0.0)
    region: str = DEFAULT_REGION
    zone: str = DEFAULT_ZONE
    rack: str = DEFAULT_RACK
    http_host: str | None = None  # None: no HTTP endpoint
    http_port: int = 0
    entry_size_max: int = ENTRY_SIZE_MAX_DEFAULT
    inflight_bytes_per_connection_max: int = 64 * 1024 * 1024
    batch_entries_max: int = 4096
    long_poll_timeout_ms_max: int = 30_000
    read_range_entries_max: int = 4096
    read_range_bytes_max: int = 8 * 1024 * 1024
    gc_interval_s: float = 60.0  # GC: deleted ledgers, dead entry logs, compaction when due
    minor_compaction_threshold: float = 0.2  # live ratio under which a minor pass compacts a log
    minor_compaction_interval_s: float = 3600.0  # 0: only when forced (POST /api/gc?minor=1)
    major_compaction_threshold: float = 0.8
    major_compaction_interval_s: float = 86400.0
    compaction_rate_bytes_per_s: float = 64 * 1024 * 1024  # entry-log bytes scanned; 0: unlimited
    compaction_rate_entries_per_s: float = 0.0  # entries copied; 0: unlimited
    registration_retry_s: float = 0.5
    registration_refresh_s: float = 60.0  # disk figures in the registration
    metadata_session_timeout_s: float = 10.0
    metadata_connect_timeout_s: float = 5.0
    # How long each metadata step of start-up (connect, cookie check, registration) keeps
    # retrying a lost connection, an expired session or a deadline before the bookie gives
    # up (meta/startup.py). Of the order of the metadata session timeout, with room for a
    # session to be lost and renewed on a loaded machine.
    metadata_start_timeout_s: float = 30.0
    shutdown_grace_s: float = 5.0
    storage_options: dict[str, Any] = field(default_factory=dict)  # passed to StorageConfig
    # TLS on the gRPC port and the HTTP endpoint (None: plaintext). With mutual TLS the
    # gRPC service admits the client, bookie and admin allow-lists, HTTP the admin one.
    tls: TlsConfig | None = None

    def validate(self) -> BookieConfig:
        require(bool(self.metadata_uri), "metadata_uri", "is required")
        require(bool(str(self.data_dir)), "data_dir", "is required")
        require(0 <= self.listen_port <= 65535, "listen_port", f"{self.listen_port} out of range")
        require(self.binary_port is None or 0 <= self.binary_port <= 65535, "binary_port",
                f"{self.binary_port} out of range")
        require(0 <= self.http_port <= 65535, "http_port", f"{self.http_port} out of range")
        require(self.entry_size_max >= 64, "entry_size_max", "must be at least 64 bytes")
        require(
            self.inflight_bytes_per_connection_max >= self.entry_size_max,
            "inflight_bytes_per_connection_max",
            "must be at least entry_size_max",
        )
        require(self.batch_entries_max >= 1, "batch_entries_max", "must be >= 1")
        require(self.long_poll_timeout_ms_max >= 0, "long_poll_timeout_ms_max", "must be >= 0")
        require(self.read_range_entries_max >= 1, "read_range_entries_max", "must be >= 1")
        require(
            self.read_range_bytes_max >= self.entry_size_max,
            "read_range_bytes_max",
            "must be at least entry_size_max (one entry must fit a chunk)",
        )
        require(self.gc_interval_s > 0, "gc_interval_s", "must be > 0")
        self.compaction_policy.validate(self.gc_interval_s)
        require(self.registration_refresh_s > 0, "registration_refresh_s", "must be > 0")
        require(self.metadata_session_timeout_s > 0, "metadata_session_timeout_s", "must be > 0")
        require(self.metadata_connect_timeout_s > 0, "metadata_connect_timeout_s", "must be > 0")
        require(self.metadata_start_timeout_s > 0, "metadata_start_timeout_s", "must be > 0")
        require(self.shutdown_grace_s >= 0, "shutdown_grace_s", "must be >= 0")
        for name in ("region", "zone", "rack"):
            value = getattr(self, name)
            require(bool(value) and "/" not in value, name, f"{value!r} must be non-empty without '/'")
        if self.tls is not None:
            require(self.tls.cert is not None, "tls.cert", "a bookie serving TLS needs a certificate and key")
            self.tls.validate()
        if self.bookie_id is not None:
            require(
                bool(self.bookie_id) and "/" not in self.bookie_id,
                "bookie_id",
                f"{self.bookie_id!r} must be non-empty without '/'",
            )
        return self

    @property
    def compaction_policy(self) -> CompactionPolicy:
        return CompactionPolicy(
            minor_threshold=self.minor_compaction_threshold,
            minor_interval_s=self.minor_compaction_interval_s,
            major_threshold=self.major_compaction_threshold,
            major_interval_s=self.major_compaction_interval_s,
            rate_bytes_per_s=self.compaction_rate_bytes_per_s,
            rate_entries_per_s=self.compaction_rate_entries_per_s,
        )

    @property
    def advertised_address(self) -> str:
        host = self.advertised_host or self.listen_host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"{host}:{self.listen_port}"

    @property
    def resolved_bookie_id(self) -> str:
        return self.bookie_id or self.advertised_address

    @property
    def journal_root(self) -> Path:
        """The directory holding the journal (and a cookie)."""
        return self.journal_dir if self.journal_dir is not None else self.data_dir

    @property
    def cookie_dirs(self) -> tuple[Path, ...]:
        """Every directory that carries a cookie (data dir first, no duplicates)."""
        dirs = [self.data_dir]
        if self.journal_dir is not None and Path(self.journal_dir).resolve() != Path(
            self.data_dir
        ).resolve():
            dirs.append(self.journal_dir)
        return tuple(dirs)

    @property
    def storage_journal_dir(self) -> Path:
        return self.journal_root / "journal"

    @property
    def storage_ledger_dir(self) -> Path:
        return self.data_dir / "ledgers"

    @property
    def grpc_message_bytes_max(self) -> int:
        """gRPC's receive/send limit: one batch may carry up to the in-flight bound."""
        return self.inflight_bytes_per_connection_max + 1024 * 1024
