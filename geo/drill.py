"""The fail-over drill: stop the source, promote the target, measure what a real fail-over loses.

Steps (each timed from the start):

1. **Stop the source.** Take the source stream's writer lock: once the application's
   writer is gone (stopped or killed for the drill), this fences the stream and closes
   its open segment, so the source's end is final and nothing more is written there.
2. **Promote the target.** Take the target stream's writer lock (once the replicator is
   gone, as it would be with its source region) and append one promotion record marked
   ``geo.promoted_from``; the time it is confirmed is *time to writable*.
3. **Measure the loss.** With the target's writer open the target's end is final too: its
   newest record marked from the source (``progress``) is the last source position the
   target holds. Every source record after it is the *data-loss window*: its record
   count, bytes, and seconds (the publish time of the newest source record minus that of
   the last one replicated) — the RPO this fail-over would have had.

The writers are closed at the end. The drill changes both clusters (the source stream
is fenced, the target gains a promotion record): run it on a rehearsal pair, or plan to
restart the application's writers where the drill leaves them.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from scriba.geo.scan import find_resume_points
from scriba.stream import Namespace, Position, WriterOptions

PROMOTED_FROM = "geo.promoted_from"
READ_IDLE_S = 0.5


@dataclass(frozen=True, slots=True)
class DrillReport:
    source_end: str  # the position the source's next record would have taken
    replicated_through: str | None  # the last source position the target holds
    lost_records: int
    lost_bytes: int
    loss_window_s: float
    source_stopped_s: float
    time_to_writable_s: float
    promotion_position: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)


async def failover_drill(source: Namespace, target: Namespace, stream: str, source_name: str, *,
                         options: WriterOptions | None = None, timeout_s: float = 30.0) -> DrillReport:
    """Run the drill on ``stream`` (see the module docstring)."""
    options = options or WriterOptions()
    t0 = time.monotonic()
    source_writer = await source.open_writer(stream, options=options)
    try:
        stopped_s = time.monotonic() - t0
        target_writer = await target.open_writer(stream, options=options)
        try:
            promotion = await target_writer.append(b"", {PROMOTED_FROM: source_name.encode()})
            writable_s = time.monotonic() - t0
            found = await find_resume_points(target, stream, [source_name], timeout_s)
            through = found.get(source_name)
            lost, lost_bytes, window_s, end = await _after(source, stream, through)
        finally:
            await target_writer.close()
    finally:
        await source_writer.close()
    return DrillReport(
        source_end=str(end), replicated_through=None if through is None else str(through),
        lost_records=lost, lost_bytes=lost_bytes, loss_window_s=window_s,
        source_stopped_s=round(stopped_s, 6), time_to_writable_s=round(writable_s, 6),
        promotion_position=str(promotion),
    )


async def _after(source: Namespace, stream: str, through: Position | None) -> tuple[int, int, float, Position]:
    """Records, bytes and seconds of the source after ``through`` (all when None), and the end."""
    latest = await source.open_reader(stream, "latest")
    end = latest.position
    await latest.close()
    reader = await source.open_reader(stream, through if through is not None else "earliest")
    count = size = 0
    last_replicated_ms: int | None = None
    newest_ms: int | None = None
    try:
        while (record := await reader.read_next(timeout_s=READ_IDLE_S)) is not None:
            if through is not None and record.position <= through:
                last_replicated_ms = record.publish_time_ms
            else:
                count += 1
                size += len(record.payload)
                newest_ms = record.publish_time_ms
                if last_replicated_ms is None:
                    last_replicated_ms = record.publish_time_ms  # nothing replicated: from the first lost
            if record.position >= end:
                break
    finally:
        await reader.close()
    window_s = 0.0 if newest_ms is None or last_replicated_ms is None else (newest_ms - last_replicated_ms) / 1000
    return count, size, max(window_s, 0.0), end
