"""A writer that dies at each step of a roll and of a truncation (``stream_site.py``): the
next writer and readers agree on what was confirmed, and a truncation left half done is
finished later.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from stream_checks import check_stream
from stream_site import Env, current_ledger, open_ns, pairs, read_all

from scriba.errors import NoSuchLedgerError, PositionTruncatedError
from scriba.stream import Position, WriterOptions
from scriba.stream import writer as writer_module
from scriba.stream import writer_steps as writer_steps_module
from scriba.stream.segments import SegmentState
from scriba.testing.waiting import eventually


# --- crash at each step of a roll and of a truncation ---------------------------------------
class Crash(Exception):
    """The process dies here (what follows in that process never happens)."""


ROLL_STEPS = ["after_create_ledger", "after_add_segment", "after_switch", "after_old_ledger_close"]


@pytest.mark.parametrize("step", ROLL_STEPS)
async def test_crash_at_each_roll_step_next_writer_and_readers_agree(
    env: Env, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    from scriba.stream.catalog import Catalog
    from scriba.stream.segments import open_segments

    ns_a = await open_ns(env)
    a = await ns_a.open_writer("crashy", create=True, segment_records_max=4)
    real_create = writer_steps_module.create_segment_ledger
    real_update = Catalog.update_stream
    real_close_segment = writer_module.StreamWriter._close_segment
    real_close = writer_module.close_segment

    async def create(*args: Any, **kwargs: Any) -> Any:
        ledger = await real_create(*args, **kwargs)
        if step == "after_create_ledger":
            raise Crash()
        return ledger

    async def update(self: Any, *args: Any) -> Any:
        record = await real_update(self, *args)
        if step == "after_add_segment" and len(open_segments(record)) == 2:
            raise Crash()  # the CAS landed; nothing after it happens
        return record

    async def close_segment_method(self: Any, segment: Any) -> None:
        if step == "after_switch":
            raise Crash()
        await real_close_segment(self, segment)

    def close_seg(*args: Any, **kwargs: Any) -> Any:
        if step == "after_old_ledger_close":
            raise Crash()
        return real_close(*args, **kwargs)

    monkeypatch.setattr(writer_steps_module, "create_segment_ledger", create)
    monkeypatch.setattr(Catalog, "update_stream", update)
    monkeypatch.setattr(writer_module.StreamWriter, "_close_segment", close_segment_method)
    monkeypatch.setattr(writer_module, "close_segment", close_seg)

    confirmed: dict[Position, bytes] = {}
    attempted = [b"c%d" % i for i in range(8)]
    results = await asyncio.gather(*[a.append_async(p) for p in attempted], return_exceptions=True)
    for p, r in zip(attempted, results, strict=True):
        if isinstance(r, Position):
            confirmed[r] = p
    # let the roll reach the crash point
    await eventually(lambda: a.error is not None, 5.0, what="the roll reached the crash point")
    assert "Crash" in str(a.error)
    await current_ledger(a).abort()
    for task in list(a._tasks):  # the process dies: its tasks (the failed writer's resign) end with it
        task.cancel()
    await env.crash(ns_a.client)
    monkeypatch.undo()
    ns_b = await open_ns(env)
    b = await ns_b.open_writer("crashy", options=WriterOptions(lock_timeout_s=2.0))
    after = await b.append(b"after")
    await b.close()
    assert len(confirmed) >= 4, results
    got = await read_all(ns_b, "crashy")
    again = await read_all(ns_b, "crashy")
    result = check_stream({"r1": pairs(got), "r2": pairs(again)}, {**confirmed, after: b"after"},
                          attempted=[*attempted, b"after"])
    assert result.ok, result.explain()
    assert got[-1].payload == b"after"
    info = await ns_b.info("crashy")
    assert all(s.state is SegmentState.CLOSED for s in info.record.segments)


@pytest.mark.parametrize("step", ["after_cas", "after_deletes"])
async def test_crash_in_truncation_is_finished_later(env: Env, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    from scriba.stream import retention as retention_module

    ns = await open_ns(env)
    w = await ns.open_writer("trunc", create=True, segment_records_max=2)
    positions = await w.append_many([b"t%d" % i for i in range(4)])
    for i in range(4, 10):
        positions.append(await w.append(b"t%d" % i))
    await w.close()
    before = (await ns.info("trunc")).record
    real_delete = retention_module.delete_ledgers
    real_finish = retention_module.finish_deletes

    async def delete(client: Any, ids: Any) -> Any:
        if step == "after_cas":
            raise Crash()
        return await real_delete(client, ids)

    def finish(*args: Any) -> Any:
        if step == "after_deletes":
            raise Crash()
        return real_finish(*args)

    monkeypatch.setattr(retention_module, "delete_ledgers", delete)
    monkeypatch.setattr(retention_module, "finish_deletes", finish)
    cut = positions[6]
    with pytest.raises(Crash):
        await ns.truncate("trunc", before=cut)
    monkeypatch.undo()
    mid = (await ns.info("trunc")).record
    assert mid.truncated_before == cut and mid.deleting
    with pytest.raises(PositionTruncatedError):
        await ns.open_reader("trunc", positions[0])
    assert next(r.payload for r in await read_all(ns, "trunc")) == b"t6"
    await ns.truncate("trunc", before=cut)  # the next truncation finishes the work
    done = (await ns.info("trunc")).record
    assert done.deleting == ()
    dropped = {s.ledger_id for s in before.segments} - {s.ledger_id for s in done.segments}
    assert dropped
    for ledger_id in dropped:
        with pytest.raises(NoSuchLedgerError):
            await ns.client.ledger_metadata(ledger_id)
