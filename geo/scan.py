"""Reading a target stream for the links' resume points (the I/O half of ``progress``).

Segments are read newest first; in each, the last record alone is tried first (with one
source it is nearly always the answer), then the whole segment. Reading stops once every
source has its answer, so the cost is one record in the common case and at most the
segments back to each source's last record (bounded by ``segment_records_max`` per
segment) when local or other links' records came after it.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Collection, Mapping

from scriba.errors import DeadlineExceededError, StreamNotFoundError
from scriba.geo.progress import resume_points
from scriba.stream import Namespace, Position


async def find_resume_points(ns: Namespace, stream: str, sources: Collection[str],
                             timeout_s: float, *, live_idle_s: float | None = None) -> dict[str, Position]:
    """Each source's last position found in ``ns``/``stream`` (absent: nothing of it yet).

    A replicator calls this after its writer closed every segment. ``live_idle_s`` (an
    outside view, a writer may be live) reads the open segment too, up to the stream's
    end when called, ending early when no record arrives for that long.
    """
    wanted = set(sources)
    found: dict[str, Position] = {}
    try:
        info = await ns.info(stream)
    except StreamNotFoundError:
        return found
    last_segment = info.record.last_segment
    if live_idle_s is not None and last_segment is not None and last_segment.is_open:
        headers = await read_live_headers(ns, stream, last_segment.start, live_idle_s)
        found.update(resume_points(reversed(headers), wanted))
        if wanted <= set(found):
            return found
    for segment in reversed(info.record.segments):
        first, last = segment.first_position, segment.last_position
        if first is None or last is None:
            continue
        for start in dict.fromkeys((last, first)):  # the last record often answers; else the segment
            headers = await read_headers(ns, stream, start, last, timeout_s)
            found.update(resume_points(reversed(headers), wanted - set(found)))
            if wanted <= set(found):
                return found
    return found


Marked = tuple[Position, Mapping[str, bytes]]
"""A record's position and headers (what the scans read)."""


async def read_headers(ns: Namespace, stream: str, start: Position, last: Position,
                       timeout_s: float) -> list[Mapping[str, bytes]]:
    """The headers of the records from ``start`` to ``last`` (both confirmed), in order."""
    return [headers for _, headers in await read_marked(ns, stream, start, last, timeout_s)]


async def read_marked(ns: Namespace, stream: str, start: Position, last: Position,
                      timeout_s: float) -> list[Marked]:
    """The positions and headers of the records from ``start`` to ``last`` (both confirmed)."""
    out: list[Marked] = []
    reader = await ns.open_reader(stream, start)
    try:
        async with asyncio.timeout(timeout_s):
            async for record in reader:
                out.append((record.position, record.headers))
                if record.position >= last:
                    break
    except builtins.TimeoutError as exc:
        raise DeadlineExceededError(f"reading {ns.name}/{stream} from {start} to {last} took over {timeout_s}s") from exc
    finally:
        await reader.close()
    return out


async def read_live_headers(ns: Namespace, stream: str, start: Position, idle_s: float) -> list[Mapping[str, bytes]]:
    """The headers of the records from ``start`` to the stream's end as it is now."""
    return [headers for _, headers in (await read_live_marked(ns, stream, start, idle_s))[0]]


async def read_live_marked(ns: Namespace, stream: str, start: Position,
                           idle_s: float) -> tuple[list[Marked], Position]:
    """The positions and headers of the records from ``start`` to the stream's end as it
    is now, and that end (the position the next record will take)."""
    latest = await ns.open_reader(stream, "latest")
    end = latest.position
    await latest.close()
    out: list[Marked] = []
    if start >= end:
        return out, end
    reader = await ns.open_reader(stream, start)
    try:
        while (record := await reader.read_next(timeout_s=idle_s)) is not None and record.position < end:
            out.append((record.position, record.headers))
    finally:
        await reader.close()
    return out, end
