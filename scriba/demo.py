"""``scriba demo``: start an embedded etcd and walk through the metadata API.

    scriba demo                       # embedded single-node etcd in a temp dir
    scriba demo --data ./demo-data    # keep the embedded etcd's data there
    scriba demo --metadata etcd://127.0.0.1:2379/scriba    # or any memory:// etcd:// zk:// URI

Shows: create / get with versions, a compare-and-set conflict (BadVersionError),
watch events, an ephemeral record vanishing when its session closes, leader
election handing over with a larger fencing token, and the id allocator. Stops
whatever it started; exit code 0 when every step behaved as promised.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, TextIO

from scriba.errors import BadVersionError, NoSuchKeyError
from scriba.meta import connect
from scriba.meta.election import Election
from scriba.meta.store import EventKind, MetadataStore, WatchEvent

STEP_TIMEOUT_S = 20.0
SESSION_TIMEOUT_S = 3.0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="start an embedded etcd and run a short demo of the metadata API",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--metadata", metavar="URI", help="use this metadata store instead of an embedded etcd")
    parser.add_argument("--data", metavar="DIR", type=Path, help="directory for the embedded etcd's data (kept)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    if args.metadata:
        asyncio.run(demo(args.metadata, out))
        return 0
    with _embedded_etcd(args.data, out) as uri:
        asyncio.run(demo(uri, out))
    return 0


@contextlib.contextmanager
def _embedded_etcd(data: Path | None, out: TextIO) -> Iterator[str]:
    from scriba.embedded.etcd import EtcdCluster

    with contextlib.ExitStack() as stack:
        if data is None:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="scriba-demo-")))
        else:
            data.mkdir(parents=True, exist_ok=True)
            base = Path(tempfile.mkdtemp(prefix="etcd-", dir=data))
        cluster = EtcdCluster(base, 1)
        start = time.monotonic()
        cluster.start()
        stack.callback(cluster.stop)
        host, port = cluster.endpoints[0]
        _say(out, f"started an embedded etcd on {host}:{port} (pid {cluster.members[0].pid}, data {base}) "
                  f"in {time.monotonic() - start:.2f}s")
        yield cluster.uri(f"demo-{uuid.uuid4().hex[:8]}")
        _say(out, "stopping the embedded etcd")


def _say(out: TextIO, text: str) -> None:
    print(text, file=out, flush=True)


async def demo(uri: str, out: TextIO) -> None:
    """Every step of the demo against ``uri``; raises if a promise does not hold."""
    _say(out, f"metadata store: {uri}")
    async with contextlib.AsyncExitStack() as stack:
        store = await stack.enter_async_context(await _open(uri))
        await _records(store, out)
        await _watch(store, out)
        await _ephemeral(uri, store, out)
        await _election(uri, out)
        ids = [await store.allocate_id("demo") for _ in range(3)]
        _say(out, f"6. allocate_id('demo') three times -> {ids} (unique, increasing)")
        for key in ("demo/config", "ids/demo"):
            with contextlib.suppress(NoSuchKeyError):
                await store.delete(key)
    _say(out, "demo finished: every step behaved as promised")


async def _open(uri: str) -> MetadataStore:
    return await connect(uri, session_timeout_s=SESSION_TIMEOUT_S)


async def _records(store: MetadataStore, out: TextIO) -> None:
    v1 = await store.create("demo/config", b"replicas=3")
    got = await store.get("demo/config")
    _say(out, f"1. create demo/config = {got.value!r} -> version {v1}")
    v2 = await store.set("demo/config", b"replicas=5", expected_version=v1)
    _say(out, f"2. compare-and-set at version {v1} -> {b'replicas=5'!r}, new version {v2}")
    try:
        await store.set("demo/config", b"replicas=7", expected_version=v1)
    except BadVersionError as exc:
        _say(out, f"   a second writer still holding version {v1} is refused: BadVersionError ({exc})")
    else:
        raise AssertionError("a stale compare-and-set was accepted")


async def _collect(events: AsyncIterator[WatchEvent], count: int) -> list[WatchEvent]:
    got: list[WatchEvent] = []
    async with asyncio.timeout(STEP_TIMEOUT_S):
        while len(got) < count:
            got.append(await anext(events))
    return got


async def _watch(store: MetadataStore, out: TextIO) -> None:
    _say(out, "3. watching prefix demo/jobs/ (current state, SYNCED, then every change)")
    async with contextlib.aclosing(store.watch("demo/jobs/", prefix=True)) as events:
        synced = await _collect(events, 1)
        if synced[0].kind is not EventKind.SYNCED:
            raise AssertionError(f"expected SYNCED first on an empty prefix, got {synced[0]}")
        v = await store.create("demo/jobs/a", b"queued")
        await store.set("demo/jobs/a", b"running", expected_version=v)
        await store.create("demo/jobs/b", b"queued")
        await store.delete("demo/jobs/a")
        await store.delete("demo/jobs/b")
        for event in await _collect(events, 5):
            value = "" if event.value is None else f" = {event.value!r}"
            _say(out, f"   event {event.kind.name:<6} {event.key}{value} (version {event.version})")


async def _ephemeral(uri: str, store: MetadataStore, out: TextIO) -> None:
    bookie = await _open(uri)
    await bookie.create("demo/bookies/bookie-1", b"127.0.0.1:3181", ephemeral=True)
    _say(out, f"4. a second client (session {bookie.session.session_id}) registers ephemeral "
              "demo/bookies/bookie-1")
    async with contextlib.aclosing(store.watch("demo/bookies/bookie-1")) as events:
        initial = await _collect(events, 2)
        _say(out, f"   the first client sees it: {initial[0].value!r}")
        start = time.monotonic()
        await bookie.close()
        gone = await _collect(events, 1)
        if gone[0].kind is not EventKind.DELETE:
            raise AssertionError(f"expected the ephemeral to vanish, got {gone[0]}")
        _say(out, f"   the second client closed its session: the record vanished after "
                  f"{time.monotonic() - start:.2f}s")


async def _election(uri: str, out: TextIO) -> None:
    alpha, beta = await _open(uri), await _open(uri)
    try:
        first = await asyncio.wait_for(Election(alpha, "demo").campaign("alpha"), STEP_TIMEOUT_S)
        _say(out, f"5. election 'demo': alpha leads with fencing token {first.token}")
        beta_election = Election(beta, "demo")
        second_task = asyncio.create_task(beta_election.campaign("beta"))
        await alpha.close()  # alpha's session ends: its leader record goes with it
        second = await asyncio.wait_for(second_task, STEP_TIMEOUT_S)
        if second.token <= first.token:
            raise AssertionError(f"new leader's token {second.token} is not above {first.token}")
        _say(out, f"   alpha's session ended; beta took over with token {second.token} (> {first.token})")
        await beta_election.resign()
    finally:
        await alpha.close()
        await beta.close()
