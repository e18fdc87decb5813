"""``RsmConfig``: every knob of one replica, checked by ``validate()`` before any I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from scriba.config import require
from scriba.tls import TlsConfig

MiB: Final = 1024 * 1024
CONSISTENCY_LEVELS: Final = ("linearizable", "sequential", "after")
LEADER_READ_CHECKS: Final = ("fence_probe", "barrier")


@dataclass(frozen=True, slots=True)
class RsmConfig:
    # exactly-once sessions (replicated clock: the leader's stamps)
    session_ttl_ms: int = 10 * 60 * 1000
    session_results_max: int = 1024  # unacknowledged results kept per session
    # group commit
    batch_records_max: int = 4096
    batch_bytes_max: int = 4 * MiB
    batches_inflight_max: int = 1  # 1: proposals arriving during an append go into the next record set
    proposals_waiting_max: int = 100_000
    # the leader pushes its ledger's LAC to the bookies (for the followers' long polls) only
    # after this long with no later record set sent: a proposer's next command carries it
    # instead, and the push (a message to each bookie and back) stays off the commit path
    lac_push_delay_s: float = 0.002
    # replicas each of a follower's tail long polls waits at (``ReaderOptions``): 1, as a
    # follower's tail is off the commit path; 2 halves a follower's visibility p99 under
    # load (reads "after" a token, follower reads) at twice the poll answers per record
    # set at the bookies and followers, CPU the leader's commit path shares
    tail_poll_replicas: int = 1
    # a follower's tail pauses this long after each poll answer (``ReaderOptions``), so
    # record sets confirmed meanwhile come in one answer: fewer polls and answers at the
    # bookies and followers, whose CPU the leader's commit path shares, for up to this
    # much later follower visibility. A read waiting on a follower (linearizable, "after")
    # ends the pause (``StreamReader.hurry``): it does not wait it out. 5 ms: one
    # proposer's p50 0.73-0.89x, p99 ~0.88x, CPU per proposal 0.75x of no pause; 20 ms
    # against 5 ms: p50 0.81-0.96x, p99 median ~0.92x, CPU 0.87x, followers' CPU ~0.47x
    # (probe_rsm --ab, 2026-11-26)
    tail_poll_pause_s: float = 0.02
    command_bytes_max: int = 512 * 1024  # with the envelope; at most the stream's record_bytes_max
    # snapshots
    snapshot_every_commands: int | None = 100_000
    snapshot_every_bytes: int | None = 256 * MiB
    snapshots_kept: int = 2
    snapshot_chunk_bytes: int = 512 * 1024
    # timeouts (seconds)
    propose_timeout_s: float = 30.0
    read_timeout_s: float = 30.0
    writer_lock_timeout_s: float = 30.0
    transfer_timeout_s: float = 10.0
    start_timeout_s: float = 30.0  # start()'s metadata steps retry a lost connection or session this long
    campaign_backoff_s: float = 0.2
    suspended_grace_s: float = 1.0  # a SUSPENDED metadata session deposes the leader after this
    # serving
    forward_proposals: bool = True  # False: a follower answers RsmNotLeaderError with the leader's address
    zone: str = ""
    connections_max: int = 1024
    tls: TlsConfig | None = None  # the replica service and calls to peers over TLS (None: plaintext)
    # how a leader proves, for linearizable reads, that it still leads (``rsm.term``):
    # "fence_probe" asks its ledger's bookies whether it is fenced (no fsync; falls back to
    # a barrier when they cannot prove it within fence_probe_timeout_s); "barrier" appends one
    leader_read_check: str = "fence_probe"
    fence_probe_timeout_s: float = 2.0
    # test-only negative control: answer "linearizable" reads locally, without a barrier
    unsafe_local_linearizable_reads: bool = False

    def validate(self) -> RsmConfig:
        require(self.session_ttl_ms >= 1, "session_ttl_ms", "must be >= 1")
        require(self.session_results_max >= 1, "session_results_max", "must be >= 1")
        require(self.batch_records_max >= 1, "batch_records_max", "must be >= 1")
        require(self.batch_bytes_max >= 1024, "batch_bytes_max", "must be >= 1024")
        require(self.batches_inflight_max >= 1, "batches_inflight_max", "must be >= 1")
        require(self.proposals_waiting_max >= 1, "proposals_waiting_max", "must be >= 1")
        require(64 <= self.command_bytes_max <= 4 * MiB, "command_bytes_max", "must be in [64, 4 MiB]")
        for name in ("snapshot_every_commands", "snapshot_every_bytes"):
            value = getattr(self, name)
            require(value is None or (type(value) is int and value >= 1), name, "an int >= 1, or None")
        require(self.snapshots_kept >= 1, "snapshots_kept", "must be >= 1")
        require(1024 <= self.snapshot_chunk_bytes <= 4 * MiB, "snapshot_chunk_bytes", "must be in [1 KiB, 4 MiB]")
        for name in ("propose_timeout_s", "read_timeout_s", "writer_lock_timeout_s", "transfer_timeout_s",
                     "start_timeout_s", "campaign_backoff_s", "suspended_grace_s", "fence_probe_timeout_s"):
            require(getattr(self, name) > 0, name, "must be > 0")
        require(0 <= self.lac_push_delay_s <= 1.0, "lac_push_delay_s", "must be in [0, 1] s")
        require(self.tail_poll_replicas in (1, 2), "tail_poll_replicas", "must be 1 or 2")
        require(0 <= self.tail_poll_pause_s <= 1.0, "tail_poll_pause_s", "must be in [0, 1] s")
        require(self.leader_read_check in LEADER_READ_CHECKS, "leader_read_check",
                f"one of {', '.join(LEADER_READ_CHECKS)}")
        require(self.connections_max >= 1, "connections_max", "must be >= 1")
        if self.tls is not None:
            self.tls.validate()
        return self
