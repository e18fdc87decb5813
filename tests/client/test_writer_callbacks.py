"""``LedgerWriter.append_callback``: appends without a future (BookKeeper's ``asyncAddEntry``).

The callback gets ``(entry_id, None)`` once the entry is confirmed, in entry order and
mixed in order with ``append_async`` futures; it may append again from inside the call;
``(entry_id, error)`` for every unconfirmed entry when the writer fails (``-1`` for an
append still waiting for room in flight); an exception it raises is logged and the
writer goes on. In-process bookies behind a minimal transport (``test_writer_input``'s).
"""

from __future__ import annotations

import asyncio

import pytest
from test_writer_input import Env, bounded_client, closes_with, open_env
from test_writer_input import env as env  # the fixture: in-process bookies and a client

from scriba.entry import master_key
from scriba.errors import LedgerFencedError
from scriba.testing.hygiene import captured_logs
from scriba.testing.waiting import eventually


async def test_callbacks_confirm_in_entry_order_and_may_append_again(env: Env) -> None:
    w = await env.writer()
    seen: list[tuple[int, BaseException | None]] = []
    payloads = [b"p%03d" % i for i in range(60)]

    chained = [20]  # the next entry the chain appends

    def on_done(entry_id: int, error: BaseException | None) -> None:
        seen.append((entry_id, error))
        if chained[0] < 50:  # a chain: each confirmation appends the next entry, from inside the call
            w.append_callback(payloads[chained[0]], on_done)
            chained[0] += 1

    futures = []
    for i in range(20):  # callbacks and futures interleaved: one order for both
        if i % 2:
            futures.append((i, w.append_async(payloads[i])))
        else:
            w.append_callback(payloads[i], on_done)
    await eventually(lambda: len(seen) == 40 and w.pending == 0, timeout_s=20)
    for i, future in futures:
        assert future.result() == i
    by_callback = [i for i in range(20) if i % 2 == 0] + list(range(20, 50))
    assert seen == [(i, None) for i in by_callback]
    await closes_with(w, payloads[:50], env)


async def test_a_mutable_payload_is_copied_before_append_callback_returns(env: Env) -> None:
    w = await env.writer()
    done: list[int] = []
    buffer = bytearray(b"first")
    w.append_callback(buffer, lambda entry_id, error: done.append(entry_id))
    buffer[:] = b"other"
    w.append_callback(memoryview(buffer), lambda entry_id, error: done.append(entry_id))
    buffer[:] = b"third"
    await eventually(lambda: done == [0, 1], timeout_s=20)
    await closes_with(w, [b"first", b"other"], env)


async def test_a_raising_callback_is_logged_and_the_writer_goes_on(env: Env) -> None:
    w = await env.writer()
    calls: list[int] = []

    def broken(entry_id: int, error: BaseException | None) -> None:
        calls.append(entry_id)
        raise RuntimeError("a caller's bug")

    with captured_logs() as logs:
        w.append_callback(b"a", broken)
        w.append_callback(b"b", broken)
        await eventually(lambda: calls == [0, 1], timeout_s=20)
    failed = [(e["entry_id"], e["error"]) for e in logs if e["event"] == "append_callback_failed"]
    assert failed == [(0, "RuntimeError(\"a caller's bug\")"), (1, "RuntimeError(\"a caller's bug\")")], logs
    assert not w.is_closed and w.pending == 0
    assert await asyncio.wait_for(w.append(b"c"), 10) == 2
    await closes_with(w, [b"a", b"b", b"c"], env)


async def test_a_failed_writer_calls_back_every_pending_append_with_the_error() -> None:
    """Fenced (another client recovered the ledger): each append in flight gets its id
    and the error, in order; an append still waiting for room gets -1; futures fail alike."""
    the_env, store = await open_env()
    client = await bounded_client(the_env, store, 2)
    try:
        w = await client.create_ledger(3, 3, 2)
        assert await w.append(b"confirmed") == 0
        for storage in the_env.bookies.storages.values():
            await storage.fence(w.ledger_id, master_key(b""))
        seen: list[tuple[int, BaseException | None]] = []
        w.append_callback(b"one", lambda entry_id, error: seen.append((entry_id, error)))
        future = w.append_async(b"two")
        w.append_callback(b"three", lambda entry_id, error: seen.append((entry_id, error)))  # waits for room
        await eventually(lambda: len(seen) == 2, timeout_s=20)
        assert [entry_id for entry_id, _ in seen] == [1, -1]
        assert all(isinstance(error, LedgerFencedError) for _, error in seen)
        with pytest.raises(LedgerFencedError):
            await asyncio.wait_for(future, 10)
        assert w.last_add_confirmed == 0 and w.pending == 0
        with pytest.raises(LedgerFencedError):
            w.append_callback(b"after", lambda entry_id, error: None)  # refused at once
    finally:
        await client.close()
        await the_env.client.close()
        await store.close()
