"""When to reclaim entry-log space, which logs, and how fast (no I/O; as BookKeeper).

Every GC cycle removes the entry logs with nothing live in them (the current log too:
it is rolled first when it holds bytes and none is live). Compaction copies the live
entries of a sparse log to the current log, points the index at the copies, then
removes the log. Two kinds, each with a live-ratio threshold and an interval:

- *minor*: logs whose live ratio is under ``minor_threshold`` (default 0.2), every
  ``minor_interval_s`` (1 h): cheap, mostly-dead logs only;
- *major*: under ``major_threshold`` (0.8), every ``major_interval_s`` (1 day): more
  copying, more space back. A major pass also counts as a minor one.

A threshold of 0 disables that kind; an interval of 0 runs it only when forced (``POST
/api/gc?major=1``). The current log takes part as any other: when a pass would pick it,
it is rolled first (so a log being written that is mostly dead is compacted too).

Candidates are compacted least live first (the most space back per byte copied). The
copy is throttled (:class:`Throttle`: bytes scanned per second and entries copied per
second) so writers keep their throughput.

Inputs: the clock, log usages (``entry_log_meta.LogUsage``), force flags. Outputs: a
:class:`PassPlan`. Invariant: the plan never names a log with live bytes for removal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from scriba.bookie.entry_log_meta import LogUsage
from scriba.config import require


class PassKind(StrEnum):
    NONE = "none"  # dead logs only
    MINOR = "minor"
    MAJOR = "major"


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    minor_threshold: float = 0.2
    minor_interval_s: float = 3600.0
    major_threshold: float = 0.8
    major_interval_s: float = 86400.0
    rate_bytes_per_s: float = 64 * 1024 * 1024  # entry-log bytes scanned; 0: unlimited
    rate_entries_per_s: float = 0.0  # entries copied; 0: unlimited

    def validate(self, gc_interval_s: float) -> CompactionPolicy:
        """Checked as the BookieConfig fields they come from (``minor_compaction_threshold``...)."""
        for kind in ("minor", "major"):
            threshold = getattr(self, f"{kind}_threshold")
            interval = getattr(self, f"{kind}_interval_s")
            require(0 <= threshold <= 1, f"{kind}_compaction_threshold", "must be in [0, 1] (0: off)")
            require(interval >= 0, f"{kind}_compaction_interval_s", "must be >= 0 (0: forced only)")
            require(
                interval == 0 or interval >= gc_interval_s,
                f"{kind}_compaction_interval_s",
                f"must be 0 or >= gc_interval_s ({gc_interval_s})",
            )
        require(
            not (self.minor_threshold and self.major_threshold)
            or self.minor_threshold <= self.major_threshold,
            "minor_compaction_threshold",
            "must not exceed major_compaction_threshold",
        )
        require(self.rate_bytes_per_s >= 0, "compaction_rate_bytes_per_s", "must be >= 0 (0: unlimited)")
        require(self.rate_entries_per_s >= 0, "compaction_rate_entries_per_s", "must be >= 0 (0: unlimited)")
        return self


@dataclass(frozen=True, slots=True)
class CompactionPass:
    kind: PassKind
    threshold: float  # compact logs whose live ratio is below this (0: none)


class CompactionSchedule:
    """Which pass a GC cycle runs (BookKeeper's rule: major if due, else minor if due)."""

    def __init__(self, policy: CompactionPolicy, now: float) -> None:
        self._policy = policy
        self.last_minor = now
        self.last_major = now

    def due(self, now: float, *, force_major: bool = False, force_minor: bool = False) -> CompactionPass:
        p = self._policy
        if p.major_threshold > 0 and (
            force_major or (p.major_interval_s > 0 and now - self.last_major >= p.major_interval_s)
        ):
            return CompactionPass(PassKind.MAJOR, p.major_threshold)
        if p.minor_threshold > 0 and (
            force_minor or force_major
            or (p.minor_interval_s > 0 and now - self.last_minor >= p.minor_interval_s)
        ):
            return CompactionPass(PassKind.MINOR, p.minor_threshold)
        return CompactionPass(PassKind.NONE, 0.0)

    def ran(self, kind: PassKind, now: float) -> None:
        if kind is PassKind.MAJOR:
            self.last_major = self.last_minor = now
        elif kind is PassKind.MINOR:
            self.last_minor = now


@dataclass(frozen=True, slots=True)
class PassPlan:
    roll_current: bool
    remove: tuple[int, ...]  # logs with nothing live
    compact: tuple[int, ...]  # least live first


def plan_pass(usages: Sequence[LogUsage], current_id: int, threshold: float) -> PassPlan:
    """What one pass does: remove dead logs; compact those under ``threshold``; roll the
    current log first when it is one of them (an empty current log is left alone)."""
    remove: list[int] = []
    compact: list[LogUsage] = []
    roll = False
    for u in usages:
        if u.log_id == current_id and u.total_bytes == 0:
            continue
        if u.live_bytes == 0:
            remove.append(u.log_id)
        elif u.live_ratio < threshold:
            compact.append(u)
        else:
            continue
        roll = roll or u.log_id == current_id
    compact.sort(key=lambda u: (u.live_ratio, u.log_id))
    return PassPlan(roll, tuple(remove), tuple(u.log_id for u in compact))


class Throttle:
    """Paces work to ``bytes_per_s`` and ``entries_per_s`` (0: no limit on that figure).

    After each step call :meth:`delay_s` with what it did: the seconds to wait before the
    next, so that the average since the first step stays within both rates. Idle time is
    not saved up for a burst later (at most one step's worth).
    """

    def __init__(self, bytes_per_s: float, entries_per_s: float, clock: Callable[[], float]) -> None:
        self.bytes_per_s = bytes_per_s
        self.entries_per_s = entries_per_s
        self._clock = clock
        self._ready = float("-inf")

    def step_bytes(self, default: int) -> int:
        """A step's size: at most ``default``, and about a quarter second at the rate."""
        if self.bytes_per_s <= 0:
            return default
        return max(64 * 1024, min(default, int(self.bytes_per_s / 4)))

    def delay_s(self, nbytes: int, nentries: int) -> float:
        now = self._clock()
        cost = 0.0
        if self.bytes_per_s > 0:
            cost = nbytes / self.bytes_per_s
        if self.entries_per_s > 0:
            cost = max(cost, nentries / self.entries_per_s)
        self._ready = max(self._ready, now - cost) + cost
        return max(0.0, self._ready - now)


@dataclass(slots=True)
class CompactionResult:
    """What one pass did (bytes are entry-log record bytes)."""

    kind: PassKind = PassKind.NONE
    logs_removed: int = 0  # dead logs removed without copying
    logs_compacted: int = 0  # logs whose live entries were copied, then removed
    logs_skipped: int = 0  # unreadable to their end: kept
    entries_copied: int = 0
    bytes_copied: int = 0
    bytes_reclaimed: int = 0  # removed logs' bytes less the bytes copied out of them
    rolled: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind.value, "logs_removed": self.logs_removed,
            "logs_compacted": self.logs_compacted, "logs_skipped": self.logs_skipped,
            "entries_copied": self.entries_copied, "bytes_copied": self.bytes_copied,
            "bytes_reclaimed": self.bytes_reclaimed, "rolled": self.rolled,
        }


@runtime_checkable
class CompactingStorage(Protocol):
    """A storage with entry logs to reclaim (the in-memory twin has none)."""

    async def compact(
        self, live_ratio_max: float, *, throttle: Throttle | None = None, kind: PassKind = PassKind.NONE
    ) -> CompactionResult: ...
