"""Where a link resumes: found in the target stream, never in a separate checkpoint.

A link ``S`` → ``T`` appends to T's stream in S's order, each record marked with its
position in S (see ``marks``). After the link's replicator has opened T's stream writer
(which fences any earlier writer and closes every segment it left, so the stream's end
is final), the newest record of T marked ``source == S`` holds the last position of S
that T has: the link resumes right after it. A record is therefore in T exactly when the
scan says so — there is no second store that could disagree (a checkpoint written after
the append and lost in a crash would make it ship the record again).

:func:`resume_point` is the pure rule over T's records, newest first; the replicator
feeds it T's segments from the last one back until every link has its answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from scriba.geo.marks import Mark
from scriba.stream import Position


def resume_point(newest_first: Iterable[Mapping[str, bytes]], source: str) -> Position | None:
    """The last position of ``source`` found in the target (headers given newest first), or None."""
    return resume_points(newest_first, (source,)).get(source)


def resume_points(newest_first: Iterable[Mapping[str, bytes]], sources: Iterable[str]) -> dict[str, Position]:
    """:func:`resume_point` for several sources in one pass (stops once all are found)."""
    wanted = set(sources)
    found: dict[str, Position] = {}
    for headers in newest_first:
        mark = Mark.from_headers(headers)
        if mark is not None and mark.source in wanted and mark.source not in found:
            found[mark.source] = mark.source_position
            if len(found) == len(wanted):
                break
    return found
