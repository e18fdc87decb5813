"""Position translation: where a source stream's position is in a replicated target stream.

A link appends the records of source ``S`` to the target in ``S``'s order and marks each
with its position in ``S`` (``marks``), so the target's records marked ``source == S``
carry strictly increasing source positions. A source position ``P`` then translates by
a search over those marks (Kafka MirrorMaker 2's offset translation, without its
separate offset-sync topic: the marks are in the data itself):

- ``target_position``: the target record replicated from ``P`` exactly (None when the
  target has none: not replicated yet, or never shipped, e.g. a record that originated
  in the target);
- ``resume_position``: where a consumer whose *next* read in ``S`` is ``P`` (a cursor)
  continues in the target without skipping anything: right after the last record
  marked from ``S`` below ``P`` (records of other origins between are read too), the
  first record of the scan when there is none, or the target's end;
- ``replicated``: whether the target already holds a record of ``S`` at or after ``P``
  (False: the target is behind ``P``; what ``S`` held from there on may still arrive, or
  be lost when ``S`` is gone — the fail-over drill measures that window).

:func:`translate_marked` is the pure rule over records read oldest first;
:func:`translate` reads the target newest segment first and stops once it has passed
the smallest position asked (from the truncation point on: a position whose record was
truncated away translates to the first record kept); :func:`translate_cursors` translates a source stream's
named cursors in bulk and commits them on the target.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scriba.errors import ConfigError
from scriba.geo.marks import Mark
from scriba.geo.scan import Marked, read_live_marked, read_marked
from scriba.invariant import invariant
from scriba.stream import Namespace, Position

LIVE_IDLE_S = 0.5
HOLD_CURSOR_PREFIX = "geo-replicator."  # ``replicator.hold_cursor_name``


@dataclass(frozen=True, slots=True)
class Translation:
    source_position: Position
    target_position: Position | None
    resume_position: Position
    replicated: bool

    def to_json(self) -> dict[str, object]:
        return {
            "source_position": str(self.source_position),
            "target_position": None if self.target_position is None else str(self.target_position),
            "resume_position": str(self.resume_position),
            "replicated": self.replicated,
        }


def _from_source(records: Sequence[Marked], source: str) -> list[tuple[Position, int]]:
    """``(source position, index in records)`` of the records marked from ``source``."""
    out: list[tuple[Position, int]] = []
    for index, (_, headers) in enumerate(records):
        mark = Mark.from_headers(headers)
        if mark is not None and mark.source == source:
            invariant(not out or out[-1][0] < mark.source_position,
                      f"target records from {source} are not in source order at {mark.source_position}")
            out.append((mark.source_position, index))
    return out


def translate_marked(records: Sequence[Marked], end: Position, source: str,
                     positions: Iterable[Position]) -> dict[Position, Translation]:
    """Translate ``positions`` of ``source`` over the target's ``records`` (oldest first;
    ``end``: the position the target's next record will take). See the module docstring."""
    marked = _from_source(records, source)
    keys = [p for p, _ in marked]
    out: dict[Position, Translation] = {}
    for position in positions:
        i = bisect_left(keys, position)
        exact = records[marked[i][1]][0] if i < len(keys) and keys[i] == position else None
        if i > 0:
            after = marked[i - 1][1] + 1  # the record right after the last one below ``position``
            resume = records[after][0] if after < len(records) else end
        else:
            resume = records[0][0] if records else end
        out[position] = Translation(position, exact, resume, i < len(keys))
    return out


async def translate(target: Namespace, stream: str, source: str, positions: Iterable[Position | str], *,
                    timeout_s: float = 30.0, live_idle_s: float = LIVE_IDLE_S) -> dict[Position, Translation]:
    """Translate ``positions`` of the ``source`` cluster's stream into ``target``/``stream``."""
    wanted = sorted({Position.parse(p) for p in positions})
    if not wanted:
        raise ConfigError("translate: no position given")
    info = await target.info(stream)
    segments = info.record.segments
    kept = info.record.truncated_before  # records before it are gone, even inside a kept segment
    records: list[Marked] = []
    end: Position | None = None
    if segments and segments[-1].is_open:
        records, end = await read_live_marked(target, stream, max(segments[-1].start, kept), live_idle_s)
    if end is None:
        latest = await target.open_reader(stream, "latest")
        end = latest.position
        await latest.close()
    for segment in reversed(segments):
        if _passed(records, source, wanted[0]):
            break
        first, last = segment.first_position, segment.last_position
        if first is None or last is None or last < kept:
            continue
        first = max(first, kept)
        records = [*await read_marked(target, stream, first, last, timeout_s), *records]
    return translate_marked(records, end, source, wanted)


def _passed(records: Sequence[Marked], source: str, smallest: Position) -> bool:
    """Whether ``records`` already hold a record from ``source`` below ``smallest`` (then
    every answer lies in them, and older segments need not be read)."""
    for _, headers in records:
        mark = Mark.from_headers(headers)
        if mark is not None and mark.source == source:
            return mark.source_position < smallest
    return False


async def translate_cursors(source_ns: Namespace, target: Namespace, stream: str, source: str, *,
                            timeout_s: float = 30.0) -> dict[str, Translation]:
    """Every named cursor of the source stream, translated to its resume position and
    committed on the target stream (a consumer group that fails over resumes there)."""
    cursors = {name: position for name, position in (await source_ns.cursors(stream)).items()
               if not name.startswith(HOLD_CURSOR_PREFIX)}  # the replicators' own: not a consumer's
    if not cursors:
        return {}
    found = await translate(target, stream, source, cursors.values(), timeout_s=timeout_s)
    out = {name: found[position] for name, position in cursors.items()}
    for name, translation in out.items():
        await target.commit_cursor(stream, name, translation.resume_position, force=True)
    return out
