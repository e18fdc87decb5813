"""etcd driver under repeated cuts between one client and etcd (fault proxy, ``toxiproxy-python``).

A watch that lived through a cut must deliver every later change: the leader record's
deletion after the heal is what lets a cut-off replica campaign again (the RSM partition
scenario saw a healed replica's watch deliver nothing, for good, on the third cut).
Each cut lasts past the session's TTL, so the lease expires and is re-granted meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from scriba.embedded.etcd import EtcdCluster
from scriba.meta import connect
from scriba.meta.etcd import EtcdStore
from scriba.meta.store import EventKind, SessionState, WatchEvent
from scriba.testing.faults import FaultProxyConfig, ToxiproxyServer, toxiproxy_client

pytestmark = [pytest.mark.timeout(300)]

CUTS = 4
CUT_S = 3.0  # longer than the 2 s session: the lease expires while cut off
WAIT_S = 30.0


@pytest.fixture(scope="module")
def etcd1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    with EtcdCluster(tmp_path_factory.mktemp("etcd1-cuts"), 1) as cluster:
        yield cluster


@pytest.fixture
def fault_proxy() -> Iterator[str]:
    with ToxiproxyServer(config=FaultProxyConfig(seed=7)) as server:
        yield server.url


@contextlib.asynccontextmanager
async def open_store(uri: str) -> AsyncIterator[EtcdStore]:
    store = await connect(uri, connect_timeout_s=5.0, session_timeout_s=2.0)
    assert isinstance(store, EtcdStore)
    try:
        yield store
    finally:
        await store.close()


async def next_event(events: AsyncIterator[WatchEvent], kind: EventKind) -> WatchEvent:
    async with asyncio.timeout(WAIT_S):
        while True:
            event = await anext(events)
            if event.kind is kind:
                return event


async def cut(proxy: Any, how: str) -> None:
    if how == "disable":
        await asyncio.to_thread(proxy.disable)
    else:
        for stream in ("upstream", "downstream"):
            await asyncio.to_thread(proxy.add_toxic, type="timeout", stream=stream, attributes={"timeout": 0},
                                    name=f"cut_{stream}")


async def heal(proxy: Any, how: str) -> None:
    if how == "disable":
        await asyncio.to_thread(proxy.enable)
    else:
        for stream in ("upstream", "downstream"):
            await asyncio.to_thread(proxy.destroy_toxic, f"cut_{stream}")


@pytest.mark.parametrize("how", ["disable", "blackhole"])
async def test_a_watch_delivers_every_change_after_each_of_several_cuts(
    etcd1: EtcdCluster, fault_proxy: str, how: str
) -> None:
    host, port = etcd1.endpoints[0]
    tp = toxiproxy_client(fault_proxy)
    proxy = tp.create(upstream=f"{host}:{port}", name=f"etcd-{how}")
    key = "elections/g/leader"
    async with open_store(f"etcd://{host}:{port}/cuts-{how}") as writer, \
            open_store(f"etcd://{proxy.listen}/cuts-{how}") as cut_off:
        await writer.create(key, b"leader-0")
        async with contextlib.aclosing(cut_off.watch(key)) as events:
            assert (await next_event(events, EventKind.PUT)).value == b"leader-0"
            await next_event(events, EventKind.SYNCED)
            for i in range(CUTS):
                await cut(proxy, how)
                await asyncio.sleep(CUT_S)  # the cut must outlast the session: a fault, not a sync
                await writer.delete(key)
                await writer.create(key, f"leader-{i + 1}".encode())
                await heal(proxy, how)
                # the change made while cut off arrives (resumed from the last revision delivered)
                while (await next_event(events, EventKind.PUT)).value != f"leader-{i + 1}".encode():
                    pass
                await writer.delete(key)  # the leader goes after the heal: the cut-off one must see it
                await next_event(events, EventKind.DELETE)
                await writer.create(key, f"leader-{i + 1}b".encode())
                while (await next_event(events, EventKind.PUT)).value != f"leader-{i + 1}b".encode():
                    pass
            async with asyncio.timeout(WAIT_S):  # and the session is back (a new lease after the expiry)
                while cut_off.session.state is not SessionState.CONNECTED:
                    await cut_off.session.wait_change(1.0)


class _DeadStream:
    """A watch stream the server no longer serves: writes go nowhere, nothing ever comes back
    (what a blackhole that drops bytes, real Toxiproxy's ``timeout`` toxic, leaves behind)."""

    def __init__(self) -> None:
        self.writes: list[Any] = []

    async def write(self, request: Any) -> None:
        self.writes.append(request)

    async def read(self) -> Any:
        await asyncio.Event().wait()  # never answers

    def cancel(self) -> bool:
        return True


class _FirstStreamDead:
    """The store's watch stub, whose first stream is dead; later streams are real."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.dead = _DeadStream()
        self.streams = 0

    def Watch(self, *args: Any, **kwargs: Any) -> Any:
        self.streams += 1
        return self.dead if self.streams == 1 else self.real.Watch(*args, **kwargs)


async def test_a_watch_whose_stream_went_silent_resumes_and_delivers_the_delete(
    etcd1: EtcdCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    import scriba.meta.etcd_watch as etcd_watch

    monkeypatch.setattr(etcd_watch, "WATCH_IDLE_S", 0.5)
    monkeypatch.setattr(etcd_watch, "WATCH_PROGRESS_TIMEOUT_S", 1.0)
    host, port = etcd1.endpoints[0]
    key = "elections/g/leader"
    async with open_store(f"etcd://{host}:{port}/silent") as writer, \
            open_store(f"etcd://{host}:{port}/silent") as watcher:
        await writer.create(key, b"leader")
        stub = _FirstStreamDead(watcher._watcher.stub)
        monkeypatch.setattr(watcher._watcher, "stub", stub)
        async with contextlib.aclosing(watcher.watch(key)) as events:
            assert (await next_event(events, EventKind.PUT)).value == b"leader"
            await next_event(events, EventKind.SYNCED)
            await writer.delete(key)  # the leader goes while the watch's stream is dead
            deleted = await next_event(events, EventKind.DELETE)
            assert deleted.key == key
        assert stub.streams >= 2  # resumed on a new stream
        assert any(w.HasField("progress_request") for w in stub.dead.writes)  # after asking the silent one
