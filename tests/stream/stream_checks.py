"""The log checker (``scriba.testing.checkers.check_log``) applied to streams.

Stream positions are sparse triples; the checker wants dense integers. Every
position anyone read or was confirmed is placed on one sorted line and numbered,
so a record one reader skipped, or a confirmed record nobody read, shows as a gap.
A value read at two positions (a duplicate) is reported here too.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

from scriba.stream import Position
from scriba.testing.checkers import LogRead, LogResult, check_log

_INDEXES = re.compile(r"(?:positions? |expected position |got |up to |closed at |\[)[\d, ]*\d")


def check_stream(
    reads: Mapping[str, Sequence[tuple[Position, bytes]]],
    confirmed: Mapping[Position, bytes],
    *,
    attempted: Collection[bytes] | None = None,
    complete: bool = True,
    partial: Collection[str] = (),
) -> LogResult:
    """``complete``: every reader read from the start to the end of the (closed) stream,
    except the readers named in ``partial`` (they read a prefix of it)."""
    universe = sorted({p for entries in reads.values() for p, _ in entries} | set(confirmed))
    index = {p: i for i, p in enumerate(universe)}
    last = len(universe) - 1 if complete and universe else None
    log_reads = [
        LogRead(name, tuple((index[p], v) for p, v in entries), closed_last=None if name in partial else last)
        for name, entries in reads.items()
    ]
    result = check_log(log_reads, {index[p]: v for p, v in confirmed.items()}, attempted=attempted,
                       closed_last=last)
    # the checker speaks of dense indexes: name the stream positions instead
    def named(match: re.Match[str]) -> str:
        return re.sub(r"\d+", lambda m: str(universe[int(m.group())]), match.group())

    renamed = tuple(_INDEXES.sub(named, v) for v in result.violations)
    result = LogResult(result.readers, result.positions, result.closed_last, renamed)
    extra = []
    for name, entries in reads.items():
        seen: dict[bytes, Position] = {}
        for p, v in entries:
            if v in seen:
                extra.append(f"{name}: value {v[:40]!r} read twice, at {seen[v]} and {p} (duplicate)")
            seen[v] = p
    if not extra:
        return result
    return LogResult(result.readers, result.positions, result.closed_last, (*result.violations, *extra))
