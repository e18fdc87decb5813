"""Clocks passed into cores, so simulation can drive time.

Cores never read time themselves; the asyncio shells pass a :class:`Clock`.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a monotonic clock."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch (only for records people read, never for ordering)."""
        ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told: for simulation and unit tests."""

    def __init__(self, start: float = 0.0, wall_offset: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_offset

    def monotonic(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not go back")
        self._now += seconds
