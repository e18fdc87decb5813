"""``ConnectionSessions``: one RSM session per client connection, bounded, opened once."""

from __future__ import annotations

import asyncio

import pytest

from scriba.examples.kvstore.sessions import ConnectionSessions
from scriba.rsm import ClientSession


class Opener:
    def __init__(self, fail_first: int = 0) -> None:
        self.opened = 0
        self.fail_first = fail_first
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self) -> ClientSession:
        await self.gate.wait()
        if self.fail_first:
            self.fail_first -= 1
            raise ConnectionError("no leader")
        self.opened += 1
        return ClientSession(self.opened)


async def test_each_connection_has_its_own_session_opened_once() -> None:
    opener = Opener()
    sessions = ConnectionSessions(opener)
    a1 = await sessions.get("ipv4:127.0.0.1:5001")
    b = await sessions.get("ipv4:127.0.0.1:5002")
    a2 = await sessions.get("ipv4:127.0.0.1:5001")
    assert a1 is a2 and a1.session_id != b.session_id and opener.opened == 2


async def test_racing_first_writes_of_one_connection_open_one_session() -> None:
    opener = Opener()
    opener.gate.clear()
    sessions = ConnectionSessions(opener)
    waiting = [asyncio.create_task(sessions.get("peer")) for _ in range(5)]
    await asyncio.sleep(0)
    opener.gate.set()
    got = await asyncio.gather(*waiting)
    assert opener.opened == 1 and all(s is got[0] for s in got)


async def test_bounded_least_recently_used_and_idle_sessions_are_dropped() -> None:
    now = [0.0]
    opener = Opener()
    sessions = ConnectionSessions(opener, sessions_max=2, idle_s=10.0, clock=lambda: now[0])
    a = await sessions.get("a")
    await sessions.get("b")
    assert await sessions.get("a") is a  # a is now the most recent
    await sessions.get("c")  # evicts b, the least recently used
    assert len(sessions) == 2 and await sessions.get("a") is a
    assert (await sessions.get("b")).session_id == 4  # b comes back with a new session
    now[0] = 20.0
    await sessions.get("d")  # every other session idled out
    assert len(sessions) == 1


async def test_a_failed_open_is_raised_and_tried_again_next_time() -> None:
    opener = Opener(fail_first=1)
    sessions = ConnectionSessions(opener)
    with pytest.raises(ConnectionError):
        await sessions.get("peer")
    assert (await sessions.get("peer")).session_id == 1 and len(sessions) == 1


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError):
        ConnectionSessions(Opener(), sessions_max=0)
