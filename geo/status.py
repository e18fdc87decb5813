"""The lag of one link, measured from both clusters' streams (``scriba shell geo-status``).

The replicator reports its own lag (``Replicator.lag``: records shipped and not yet
confirmed, age of the oldest); this measures it from outside and exactly: the target's
resume point for the source (``scan``), then the source records after it up to the
source's end as it is now, counting those the link would ship (``marks.shippable``).
``seconds_behind`` is the age of the oldest of them (0 when caught up).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from scriba.geo.marks import shippable
from scriba.geo.replicator import Cluster
from scriba.geo.scan import find_resume_points
from scriba.stream import Position


@dataclass(frozen=True, slots=True)
class LinkStatus:
    stream: str
    source: str
    target: str
    confirmed: Position | None  # the last source position the target holds
    source_end: Position  # the source's end when measured
    records_behind: int
    seconds_behind: float
    counted_all: bool  # False when records_max stopped the count (records_behind is then a floor)

    def to_json(self) -> dict[str, object]:
        return {
            "stream": self.stream, "source": self.source, "target": self.target,
            "confirmed": None if self.confirmed is None else str(self.confirmed),
            "source_end": str(self.source_end), "records_behind": self.records_behind,
            "seconds_behind": round(self.seconds_behind, 3), "counted_all": self.counted_all,
        }


async def link_status(source: Cluster, target: Cluster, stream: str, *, local_only: bool = False,
                      records_max: int = 1_000_000, idle_s: float = 0.5, timeout_s: float = 30.0) -> LinkStatus:
    """``idle_s``: the count ends when no record before the end arrives for this long (the
    end's last entry holds an unknown number of records, so the last wait is not avoidable)."""
    points = await find_resume_points(target.namespace, stream, [source.name], timeout_s, live_idle_s=idle_s)
    confirmed = points.get(source.name)
    latest = await source.namespace.open_reader(stream, "latest")
    end = latest.position
    await latest.close()
    start: Position | str = "earliest" if confirmed is None else confirmed.successor()
    behind, oldest_ms, counted_all = 0, None, True
    if isinstance(start, Position) and start >= end:
        return LinkStatus(stream, source.name, target.name, confirmed, end, 0, 0.0, True)
    reader = await source.namespace.open_reader(stream, start)
    try:
        while True:
            record = await reader.read_next(timeout_s=idle_s)
            if record is None or record.position >= end:
                break
            if shippable(record.headers, source.name, target.name, local_only=local_only):
                behind += 1
                oldest_ms = record.publish_time_ms if oldest_ms is None else oldest_ms
            if behind >= records_max:
                counted_all = False
                break
    finally:
        await reader.close()
    seconds = 0.0 if oldest_ms is None else max(time.time() * 1000 - oldest_ms, 0) / 1000
    return LinkStatus(stream, source.name, target.name, confirmed, end, behind, seconds, counted_all)
