"""Log checker: a ledger or stream read back by several readers is one log.

Inputs:
- ``reads``: what each reader saw, as (position, value) pairs, and — if it saw
  the ledger closed — the closed ledger's last position (``closed_last``);
- ``confirmed``: position -> value for appends the writer was told were confirmed;
- optionally ``attempted`` values (anything read must have been attempted).

Checks (each violation is listed by :meth:`LogResult.explain`):
1. one value per position, across every reader and every confirmation;
2. each reader's positions form a contiguous run from its first position;
3. readers that saw the ledger closed agree on its last position, read exactly
   up to it, and nobody read beyond it;
4. nothing confirmed beyond the closed last position, and every confirmed
   position at or below it was read by every reader that read to the end;
5. nothing read that was never attempted.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scriba.testing.checkers.acked_set import freeze

VIOLATIONS_SHOWN_MAX = 30


@dataclass(frozen=True, slots=True)
class LogRead:
    """One reader's view: (position, value) pairs in read order."""

    reader: str
    entries: tuple[tuple[int, Any], ...]
    closed_last: int | None = None  # the closed ledger's last position, if the reader saw it closed

    @staticmethod
    def from_values(reader: str, values: Sequence[Any], *, first: int = 0, closed_last: int | None = None) -> LogRead:
        return LogRead(reader, tuple((first + i, v) for i, v in enumerate(values)), closed_last)


@dataclass(frozen=True, slots=True)
class LogResult:
    readers: int
    positions: int
    closed_last: int | None
    violations: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.violations

    def explain(self) -> str:
        closed = f", closed at {self.closed_last}" if self.closed_last is not None else ""
        head = f"log: {'OK' if self.ok else 'VIOLATED'} — {self.readers} readers, {self.positions} positions{closed}"
        lines = [head]
        lines += [f"  - {v}" for v in self.violations[:VIOLATIONS_SHOWN_MAX]]
        if len(self.violations) > VIOLATIONS_SHOWN_MAX:
            lines.append(f"  ... {len(self.violations) - VIOLATIONS_SHOWN_MAX} more")
        return "\n".join(lines)


def check_log(
    reads: Iterable[LogRead],
    confirmed: Mapping[int, Any] | None = None,
    *,
    attempted: Collection[Any] | None = None,
    closed_last: int | None = None,
) -> LogResult:
    """Check one log (see the module docstring). ``closed_last`` is the metadata's last entry, if known."""
    reads = list(reads)
    confirmed = {p: freeze(v) for p, v in (confirmed or {}).items()}
    violations: list[str] = []
    values = _one_value_per_position(reads, confirmed, violations)
    for read in reads:
        _contiguous(read, violations)
    last = _closed_last_agreed(reads, closed_last, violations)
    if last is not None:
        _within_closed(reads, confirmed, last, violations)
    if attempted is not None:
        allowed = {freeze(v) for v in attempted} | set(confirmed.values())
        for read in reads:
            for pos, raw in read.entries:
                if freeze(raw) not in allowed:
                    violations.append(f"{read.reader} position {pos}: value {raw!r} was never attempted")
    return LogResult(len(reads), len(values), last, tuple(violations))


def _one_value_per_position(
    reads: list[LogRead], confirmed: dict[int, Any], violations: list[str]
) -> dict[int, Any]:
    seen: dict[int, tuple[Any, str]] = {p: (v, "writer (confirmed)") for p, v in confirmed.items()}
    for read in reads:
        for pos, raw in read.entries:
            value = freeze(raw)
            if pos in seen and seen[pos][0] != value:
                violations.append(
                    f"position {pos}: {read.reader} read {value!r} but {seen[pos][1]} has {seen[pos][0]!r}"
                )
            seen.setdefault(pos, (value, read.reader))
    return {p: v for p, (v, _) in seen.items()}


def _contiguous(read: LogRead, violations: list[str]) -> None:
    if not read.entries:
        return
    expected = read.entries[0][0]
    for pos, _ in read.entries:
        if pos != expected:
            violations.append(f"{read.reader}: expected position {expected}, got {pos} (gap or reorder)")
            return
        expected += 1


def _closed_last_agreed(reads: list[LogRead], closed_last: int | None, violations: list[str]) -> int | None:
    claims = {r.reader: r.closed_last for r in reads if r.closed_last is not None}
    if closed_last is not None:
        claims = {"metadata": closed_last, **claims}
    if len(set(claims.values())) > 1:
        violations.append(f"readers disagree on the closed ledger's last position: {claims}")
    return max(claims.values()) if claims else None


def _within_closed(reads: list[LogRead], confirmed: dict[int, Any], last: int, violations: list[str]) -> None:
    for pos in sorted(p for p in confirmed if p > last):
        violations.append(f"position {pos} was confirmed but the ledger closed at {last} (confirmed entry lost)")
    for read in reads:
        beyond = [p for p, _ in read.entries if p > last]
        if beyond:
            violations.append(f"{read.reader} read position {beyond[0]} beyond the closed last position {last}")
        if read.closed_last is None:
            continue
        read_positions = {p for p, _ in read.entries}
        end = read.entries[-1][0] if read.entries else None
        if end is not None and end < last:
            violations.append(f"{read.reader} saw the ledger closed at {last} but read only up to {end}")
        missing = sorted(p for p in confirmed if p <= last and p not in read_positions and
                         (not read.entries or p >= read.entries[0][0]))
        if missing:
            violations.append(f"{read.reader} is missing confirmed positions {missing[:10]}")
