"""Rate limits for re-replication: token buckets for entries/s and bytes/s.

A bucket holds up to ``burst`` tokens and refills at ``rate_per_s``; taking ``n``
tokens returns how long to wait before the copy may go on (0: at once). A rate of 0
means unlimited. Pure: the caller passes the monotonic time, so tests and simulation
drive it; the worker sleeps what it is told.

Invariant: over any interval of ``t`` seconds at most ``burst + rate_per_s * t``
tokens are granted without waiting; a single request larger than the burst is
granted after the wait its size implies (a big entry is never refused).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scriba.invariant import invariant


@dataclass(slots=True)
class TokenBucket:
    rate_per_s: float
    burst: float
    _tokens: float = field(default=0.0, init=False)
    _at: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        invariant(self.rate_per_s >= 0 and self.burst >= 0, "rate and burst must be >= 0")
        self._tokens = self.burst

    @property
    def unlimited(self) -> bool:
        return self.rate_per_s == 0

    def take(self, n: float, now: float) -> float:
        """Take ``n`` tokens at ``now``; the seconds to wait before going on."""
        if self.unlimited or n <= 0:
            return 0.0
        if self._at is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate_per_s)
        self._at = now
        self._tokens -= n
        if self._tokens >= 0:
            return 0.0
        return -self._tokens / self.rate_per_s


@dataclass(slots=True)
class Throttle:
    """Entries/s and bytes/s together: the wait is the longer of the two."""

    entries: TokenBucket
    bytes: TokenBucket

    @classmethod
    def of(cls, entries_per_s: float, bytes_per_s: float) -> Throttle:
        # a burst of about a tenth of a second (at least one entry / one 64 KiB entry)
        return cls(TokenBucket(entries_per_s, max(1.0, entries_per_s / 10)),
                   TokenBucket(bytes_per_s, max(65536.0, bytes_per_s / 10)))

    def take(self, entries: int, size_bytes: int, now: float) -> float:
        return max(self.entries.take(entries, now), self.bytes.take(size_bytes, now))
