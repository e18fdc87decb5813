"""memory:// specifics: shared spaces, separate sessions, bounded watch queues that re-sync."""

from __future__ import annotations

import contextlib
import uuid

import pytest

from scriba.errors import NoSuchKeyError
from scriba.invariant import InvariantViolation
from scriba.meta import connect, memory
from scriba.meta.store import EventKind, SessionState


def fresh_uri() -> str:
    return f"memory://m{uuid.uuid4().hex[:10]}"


async def test_stores_with_one_name_share_records_but_not_sessions() -> None:
    uri = fresh_uri()
    a, b, other = await connect(uri), await connect(uri), await connect(fresh_uri())
    await a.create("x", b"1", ephemeral=True)
    assert (await b.get("x")).value == b"1"
    with pytest.raises(NoSuchKeyError):
        await other.get("x")
    assert a.session.session_id != b.session.session_id
    await b.expire_session_for_test()  # type: ignore[attr-defined]
    assert (await a.get("x")).value == b"1"  # a's ephemeral is not b's to lose
    await a.close()
    with pytest.raises(NoSuchKeyError):
        await b.get("x")
    with pytest.raises(InvariantViolation):
        await a.get("x")
    await b.close()
    await other.close()


async def test_an_overflowing_watcher_resyncs_to_the_current_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "WATCH_QUEUE_MAX", 4)
    store = await connect(fresh_uri())
    for name in ("a", "b", "c"):
        await store.create(f"d/{name}", b"0")
    async with contextlib.aclosing(store.watch("d/", prefix=True)) as events:
        initial = [await anext(events) for _ in range(4)]
        assert initial[-1].kind is EventKind.SYNCED
        for i in range(1, 10):  # far more changes than the queue holds, none consumed
            cur = await store.get("d/a")
            await store.set("d/a", str(i).encode(), expected_version=cur.version)
        await store.delete("d/b")
        await store.create("d/e", b"new")
        got = [await anext(events) for _ in range(3)]
        assert {(e.kind, e.key, e.value) for e in got} == {
            (EventKind.DELETE, "d/b", None),
            (EventKind.PUT, "d/a", b"9"),
            (EventKind.PUT, "d/e", b"new"),
        }
        v = await store.set("d/c", b"after", expected_version=(await store.get("d/c")).version)
        event = await anext(events)
        assert (event.kind, event.key, event.value, event.version) == (EventKind.PUT, "d/c", b"after", v)
    await store.close()


async def test_closing_a_store_ends_its_watches() -> None:
    store = await connect(fresh_uri())
    events = store.watch("k")
    assert (await anext(events)).kind is EventKind.SYNCED
    await store.close()
    with pytest.raises(StopAsyncIteration):
        await anext(events)


async def test_expiry_reports_lost_then_connected_in_order() -> None:
    store = await connect(fresh_uri())
    seen: list[tuple[SessionState, str]] = []
    store.session.add_listener(lambda s: seen.append((s, store.session.session_id)))
    old = store.session.session_id
    await store.expire_session_for_test()  # type: ignore[attr-defined]
    assert [s for s, _ in seen] == [SessionState.LOST, SessionState.CONNECTED]
    assert seen[1][1] != old
    await store.close()
