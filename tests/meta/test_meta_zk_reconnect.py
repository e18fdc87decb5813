"""A zk:// store keeps its session across a restart of its ZooKeeper server, even when
the restarted server accepts connections and does not answer them (``meta/zk_connect.py``).

A restarted server loads its sessions and starts their clocks again, so a client that
connects within the session timeout of that moment keeps its session. kazoo gives one
connect attempt the whole session timeout when there is one server: a server that held
the first attempt silent would then cost the session. The store bounds each attempt to
a third of the session timeout; the front here holds the first two attempts after the
restart, so the session survives only if the third comes in time.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from scriba.embedded.zookeeper import ZooKeeperEnsemble
from scriba.errors import MetadataUnavailableError
from scriba.meta.store import SessionState
from scriba.meta.zk_connect import connect_attempt_s
from scriba.meta.zookeeper import ZooKeeperStore
from scriba.testing.waiting import eventually

SESSION_TIMEOUT_S = 30.0
HELD_ATTEMPTS = 2
WAIT_S = 120.0


class SilentFront:
    """A TCP front for one ZooKeeper server on 127.0.0.1.

    Every connection is forwarded, except that after :meth:`hold_next` the next ``n``
    connections made while the server is up are accepted and never answered (their
    bytes are read and dropped until the client gives up). While the server is down a
    connection is closed at once, as a refused one would be.
    """

    def __init__(self, server_port: int) -> None:
        self.server_port = server_port
        self.held = 0
        self._to_hold = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def hold_next(self, n: int) -> None:
        self._to_hold = n

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.server_port)
            except OSError:
                return
            if self._to_hold > 0:
                self._to_hold -= 1
                self.held += 1
                up_writer.close()
                while await reader.read(65536):
                    pass
                return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.close()


async def _state_is(store: ZooKeeperStore, state: SessionState, what: str) -> None:
    async def reached() -> bool:
        return store.session.state is state

    await eventually(reached, WAIT_S, what=what, interval_s=0.05)


def test_connect_attempts_fit_three_times_in_a_session() -> None:
    assert connect_attempt_s(SESSION_TIMEOUT_S, 1) == SESSION_TIMEOUT_S / 3
    assert connect_attempt_s(SESSION_TIMEOUT_S, 5) == SESSION_TIMEOUT_S / 5
    # the front holds two attempts; the third must start well inside the session
    assert HELD_ATTEMPTS * connect_attempt_s(SESSION_TIMEOUT_S, 1) < 0.7 * SESSION_TIMEOUT_S


async def test_zk_restart_with_silent_connects_keeps_the_session(tmp_path: Path) -> None:
    ensemble = ZooKeeperEnsemble(tmp_path, members=1)
    with ensemble:
        front = SilentFront(ensemble.endpoints[0][1])
        port = await front.start()
        try:
            store = await ZooKeeperStore.open(
                f"zk://127.0.0.1:{port}/r", connect_timeout_s=10.0, session_timeout_s=SESSION_TIMEOUT_S
            )
            async with store:
                await store.create("e", b"x", ephemeral=True)
                session_id = store.session.session_id
                states: list[SessionState] = []
                store.session.add_listener(states.append)
                await asyncio.to_thread(ensemble.kill_member, 0)
                await _state_is(store, SessionState.SUSPENDED, "SUSPENDED after the server died")
                front.hold_next(HELD_ATTEMPTS)
                await asyncio.to_thread(ensemble.start_member, 0, 30.0)
                await _state_is(store, SessionState.CONNECTED, "CONNECTED after the restart")
                assert front.held == HELD_ATTEMPTS, "the restarted server was never held silent"
                # reconnected within the session timeout of the restart: the same session, its ephemeral kept
                assert store.session.session_id == session_id
                assert states == [SessionState.SUSPENDED, SessionState.CONNECTED]
                try:
                    assert (await store.get("e")).value == b"x"
                except MetadataUnavailableError:  # pragma: no cover - a drop right after CONNECTED
                    raise AssertionError("the store was CONNECTED but could not read") from None
        finally:
            await front.close()
