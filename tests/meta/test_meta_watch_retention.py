"""A long-lived watch holds nothing of the records it delivered once they are deleted.

A watch lives as long as its reader (the console's mirror keeps one per prefix for days).
If its generator kept what it first delivered — the etcd and memory drivers used to keep
their initial state in a local — every record present when the watch started stayed in
memory after its deletion: the console's memory grew by one record per ledger churned,
until every initial ledger had been replaced (found with tracemalloc snapshots over the
console benchmark's churn: the driver's initial-state records never freed).

The check walks what the suspended watch generator's frame references (its locals and
the containers and Scriba objects below them; not the store itself, which drops a
deleted record in its own way) and looks for any deleted record's value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import AsyncGenerator
from typing import Any

from scriba.meta.store import EventKind, MetadataStore, WatchEvent

MARK = "retired:"  # deleted records' values start with these bytes (a str here: not found itself)
RECORDS = 25
DEADLINE_S = 30.0


def retained(agen: AsyncGenerator[Any, None], store: object = None) -> list[bytes]:
    """Values starting with ``MARK`` reachable from the suspended generator's frame (not
    through ``store``, nor the frame's ``self``: the store holds live records by design)."""
    frame = agen.ag_frame  # type: ignore[attr-defined]
    if frame is None:
        return []
    found: list[bytes] = []
    seen: set[int] = set()
    mark = MARK.encode()

    def walk(obj: Any, depth: int) -> None:
        if depth > 8 or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, bytes | bytearray | memoryview):
            if bytes(obj[:len(mark)]) == mark:
                found.append(bytes(obj))
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(k, depth + 1)
                walk(v, depth + 1)
        elif isinstance(obj, list | tuple | set | frozenset | deque):
            for item in obj:
                walk(item, depth + 1)
        elif obj is store:
            return
        elif type(obj).__module__.startswith("scriba"):
            if dataclasses.is_dataclass(obj):
                for field in dataclasses.fields(obj):
                    walk(getattr(obj, field.name, None), depth + 1)
            for name in getattr(type(obj), "__slots__", ()):
                walk(getattr(obj, name, None), depth + 1)
            walk(getattr(obj, "__dict__", None), depth + 1)

    for name, value in frame.f_locals.items():
        if name != "self":
            walk(value, 0)
    return found


async def _next(events: AsyncGenerator[WatchEvent, None], until: float) -> WatchEvent:
    if time.monotonic() > until:
        raise AssertionError(f"the watch did not deliver in {DEADLINE_S} s")
    return await anext(events)


async def test_prefix_watch_keeps_no_deleted_record(store: MetadataStore) -> None:
    keys = [f"churn/{i:03d}" for i in range(RECORDS)]
    for k in keys:
        await store.create(k, (MARK + k).encode() * 8)
    events = store.watch("churn/", prefix=True)
    async with contextlib.aclosing(events):
        until = time.monotonic() + DEADLINE_S
        first: set[str] = set()
        while (event := await _next(events, until)).kind is not EventKind.SYNCED:
            first.add(event.key)
        assert first == set(keys)
        for k in keys:
            await store.delete(k)
        gone: set[str] = set()
        while gone != set(keys):
            event = await _next(events, until)
            if event.kind is EventKind.DELETE:
                gone.add(event.key)
        del event
        held = retained(events, store)
        assert not held, f"the watch still holds {len(held)} deleted records' values, e.g. {held[0][:40]!r}"


async def test_checker_finds_a_generator_that_keeps_its_first_state() -> None:
    """Negative control: a watch-like generator that keeps its initial dict is caught."""

    async def keeps_state() -> AsyncGenerator[int, None]:
        state = {"churn/0": (MARK + "churn/0").encode()}
        yield len(state)
        yield 0

    async def drops_state() -> AsyncGenerator[int, None]:
        state = {"churn/0": (MARK + "churn/0").encode()}
        size = len(state)
        del state
        yield size
        yield 0

    for make, expected in ((keeps_state, 1), (drops_state, 0)):
        agen = make()
        async with contextlib.aclosing(agen):
            await anext(agen)
            assert len(retained(agen)) == expected, make.__name__
