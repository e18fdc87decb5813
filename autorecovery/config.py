"""Autorecovery's configuration (one frozen dataclass, ``validate()`` fails fast).

Passwords: a worker must add copies with the ledger's master key and the auditor
checks HMAC digests with the ledger's password. As in BookKeeper (whose ledger
metadata has carried the password for its admin opens and autorecovery since 4.x),
clients store the password in the ledger's metadata by default
(``ClientConfig.store_password_in_metadata``), and that stored password is used when
it matches the record's ``password_hash``. For ledgers without one (created with the
option off, or before it existed) ``passwords`` lists passwords to try against the
hash (the empty password is always tried). A ledger whose password is not known is
left marked, with the reason in its record.
"""

from __future__ import annotations

from dataclasses import dataclass

from scriba.config import require
from scriba.entry import password_hash

LOST_BOOKIE_RECOVERY_DELAY_S = 60.0


@dataclass(frozen=True, slots=True)
class AutorecoveryConfig:
    lost_bookie_recovery_delay_s: float = LOST_BOOKIE_RECOVERY_DELAY_S  # 0: at once
    audit_tick_s: float = 1.0  # how often the auditor looks at bookie membership
    check_interval_s: float = 600.0  # periodic check of every ledger (readability, placement)
    check_sample_entries: int = 2  # entries read per fragment by the periodic check
    check_placement: bool = True
    open_ledger_grace_s: float = 30.0  # an open ledger whose LAC has not moved this long: recover it
    worker_poll_s: float = 1.0  # a worker looks for records at least this often
    worker_retry_s: float = 2.0  # a record with work left waits this long before the next pass
    claim_ttl_s: float = 10.0  # metadata session of a worker: its claims go this long after a crash
    start_timeout_s: float = 30.0  # the process's start-up metadata steps retry this long (meta/startup.py)
    entries_per_s: float = 0.0  # per worker; 0: unlimited
    bytes_per_s: float = 0.0  # per worker; 0: unlimited
    batch_entries: int = 256  # entries read per range read and kept in flight at most
    batch_bytes: int = 4 * 1024 * 1024
    passwords: tuple[bytes, ...] = ()
    update_attempts_max: int = 32

    def validate(self) -> AutorecoveryConfig:
        require(self.lost_bookie_recovery_delay_s >= 0, "lost_bookie_recovery_delay_s", "must be >= 0")
        require(self.audit_tick_s > 0, "audit_tick_s", "must be > 0")
        require(self.check_interval_s > 0, "check_interval_s", "must be > 0")
        require(self.check_sample_entries >= 0, "check_sample_entries", "must be >= 0")
        require(self.open_ledger_grace_s >= 0, "open_ledger_grace_s", "must be >= 0")
        require(self.worker_poll_s > 0, "worker_poll_s", "must be > 0")
        require(self.worker_retry_s >= 0, "worker_retry_s", "must be >= 0")
        require(self.claim_ttl_s > 0, "claim_ttl_s", "must be > 0")
        require(self.start_timeout_s > 0, "start_timeout_s", "must be > 0")
        require(self.entries_per_s >= 0, "entries_per_s", "must be >= 0 (0: unlimited)")
        require(self.bytes_per_s >= 0, "bytes_per_s", "must be >= 0 (0: unlimited)")
        require(self.batch_entries >= 1, "batch_entries", "must be >= 1")
        require(self.batch_bytes >= 1, "batch_bytes", "must be >= 1")
        require(all(isinstance(p, bytes) for p in self.passwords), "passwords", "must be bytes")
        require(self.update_attempts_max >= 1, "update_attempts_max", "must be >= 1")
        return self

    def password_for(self, hashed: bytes, stored: bytes | None = None) -> bytes | None:
        """The password whose hash is ``hashed``: the one the ledger's metadata stores,
        else one of ``passwords`` (None if none matches; a stored one that does not
        match its hash is never used)."""
        candidates = (b"", *self.passwords) if stored is None else (stored, b"", *self.passwords)
        for password in candidates:
            if password_hash(password) == hashed:
                return password
        return None
