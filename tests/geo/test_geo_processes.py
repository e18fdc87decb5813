"""``scriba geo replicate`` as a real process between two real clusters (R19).

Two clusters, each its own etcd and its own three bookie processes ("us", the source,
and "eu", the target). The target's bookies advertise ``127.0.0.2:PORT``, where the
fault proxy (``scriba faults-proxy``, driven by ``toxiproxy-python``) listens and
forwards to the bookie on ``127.0.0.1:PORT`` (one proxy per listener: gRPC and the
binary data path); the replicator reaches the target's etcd
through the proxy too. So every byte between the replicator and the target crosses the
proxy: cutting it is cutting the inter-cluster link (the test's own clients reach the
source directly and the target's bookies through the same proxies, read only after
healing).

A writer in the test appends to the source all along. The checkers (``check_replica``:
acked set + log) hold the target to exactly the source's records in source order: 0
lost, 0 reordered, 0 duplicated.

- SIGKILL the replicator 5 times (``SCRIBA_SOAK=1``: 20) while it ships, restart it.
- Cut the link (a silent blackhole, then a reset: the proxies disabled), heal it: the
  target holds everything the source had within 10 s of healing (the figure is printed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from geo_env import STREAM, check_replica, payloads, read_all

from scriba.client import Client
from scriba.embedded.process import ServerProcess, python_module_argv
from scriba.errors import StreamNotFoundError
from scriba.geo import Mark
from scriba.stream import Namespace, WriterOptions, open_namespace
from scriba.testing.checkers import check_acked_set
from scriba.testing.cluster import LocalCluster
from scriba.testing.faults import ToxiproxyProcess, toxiproxy_client
from scriba.testing.waiting import eventually

NAMESPACE = "geo/test"
SOAK = os.environ.get("SCRIBA_SOAK") == "1"
KILLS = 20 if SOAK else 5
SESSION_TIMEOUT_S = 3.0  # the replicator's target session: a SIGKILLed one frees the writer lock this soon
CATCH_UP_S = 10.0  # R19: caught up within 10 s of healing
PROXY_HOST = "127.0.0.2"  # loopback; the target's bookies advertise it, the proxy listens there

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600 if SOAK else 300)]


@dataclass
class Geo:
    us: LocalCluster
    eu: LocalCluster
    proxy_api: Any
    proxies: list[Any]
    target_uri: str  # the target's etcd, through the proxy
    log_dir: Path
    replicator: ServerProcess | None = None
    starts: int = 0

    def start_replicator(self) -> ServerProcess:
        self.starts += 1
        argv = python_module_argv(
            "scriba.cli", "geo", "replicate", "--source", self.us.uri, "--target", self.target_uri,
            "--stream", f"{NAMESPACE}/{STREAM}", "--source-name", "us", "--target-name", "eu",
            "--session-timeout-s", str(SESSION_TIMEOUT_S))
        proc = ServerProcess("geo replicate", argv, self.log_dir / f"replicator-{self.starts}.log")
        proc.start()
        self.replicator = proc
        return proc

    def cut(self, how: str) -> None:
        for p in self.proxies:
            if how == "blackhole":  # silent: bytes vanish both ways, connections stay open
                p.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0}, name="cut_up")
                p.add_toxic(type="timeout", stream="downstream", attributes={"timeout": 0}, name="cut_down")
            else:  # reset: the listener and every connection closed
                p.disable()

    def heal(self) -> None:
        for p in self.proxies:
            for name in list(p.toxics()):
                p.destroy_toxic(name)
            p.enable()


@pytest.fixture
def geo(tmp_path: Path) -> Iterator[Geo]:
    with contextlib.ExitStack() as stack:
        us = stack.enter_context(LocalCluster(tmp_path / "us"))
        eu = stack.enter_context(LocalCluster(tmp_path / "eu"))
        proxy = stack.enter_context(ToxiproxyProcess(tmp_path / "faults-proxy.log"))
        us.bookies.start_bookies(3)
        eu_bookies = eu.bookies.start_bookies(3, extra_args=["--advertise", PROXY_HOST])
        api = toxiproxy_client(proxy.url)
        proxies = [api.create(upstream=b.address, name=f"eu-{b.bookie_id}", listen=f"{PROXY_HOST}:{b.port}")
                   for b in eu_bookies]
        proxies += [api.create(upstream=b.binary_address, name=f"eu-{b.bookie_id}-bin",  # the binary data path
                               listen=f"{PROXY_HOST}:{b.binary_port}") for b in eu_bookies]
        host, port = eu.server.endpoints[0]
        etcd = api.create(upstream=f"{host}:{port}", name="eu-etcd")
        geo = Geo(us, eu, api, [*proxies, etcd], f"etcd://{etcd.listen}/{eu.prefix}", tmp_path)
        try:
            yield geo
        finally:
            if geo.replicator is not None:
                geo.replicator.stop()


@dataclass
class Writer:
    """Appends to the source until stopped; keeps what was attempted and acknowledged."""

    ns: Namespace
    attempted: list[bytes] = field(default_factory=list)
    acked: list[bytes] = field(default_factory=list)
    stopping: bool = False

    async def run(self) -> None:
        async with await self.ns.open_writer(STREAM, create=True, options=WriterOptions(lock_timeout_s=5)) as w:
            while not self.stopping:
                batch = [f"us-{len(self.attempted) + i}".encode() for i in range(10)]
                self.attempted += batch
                await w.append_many(batch)
                self.acked += batch
                await asyncio.sleep(0.02)  # pacing (~500 records/s at most), not synchronisation


@contextlib.asynccontextmanager
async def namespaces(geo: Geo) -> AsyncIterator[tuple[Namespace, Namespace]]:
    async with Client.connect(geo.us.uri) as us, Client.connect(geo.eu.uri) as eu:
        source = await open_namespace(us, NAMESPACE, create=True, ensemble_size=3, write_quorum_size=2,
                                      ack_quorum_size=2, segment_records_max=50)
        await source.create_stream(STREAM)
        yield source, await open_namespace(eu, NAMESPACE, create=True)


async def count(ns: Namespace) -> int:
    try:
        return len(await read_all(ns, settle_s=0.05))
    except StreamNotFoundError:  # the target's stream appears with the replicator's first session
        return 0


async def check_exactly_once(source: Namespace, target: Namespace, writer: Writer) -> None:
    src = payloads(await read_all(source))
    records = await read_all(target)
    got = payloads(records)
    acked = check_acked_set(writer.acked, writer.attempted, src)
    assert acked.ok, f"source: {acked.explain()}"
    assert check_replica(src, got) == [], check_replica(src, got)[:5]
    marks = [Mark.from_headers(r.headers) for r in records]
    assert all(m is not None and (m.origin, m.source) == ("us", "us") for m in marks)


async def test_replicator_process_sigkilled_and_restarted_exactly_once(geo: Geo) -> None:
    async with namespaces(geo) as (source, target):
        writer = Writer(source)
        writing = asyncio.create_task(writer.run())
        await asyncio.to_thread(geo.start_replicator)
        seen = 0
        for kill in range(KILLS):
            await eventually(lambda s=seen: _more(target, s + 20), 60, what=f"kill {kill}: 20 more records replicated", interval_s=0.02)
            seen = await count(target)
            assert geo.replicator is not None
            await asyncio.to_thread(geo.replicator.kill)  # SIGKILL mid-shipping
            await asyncio.to_thread(geo.start_replicator)
        writer.stopping = True
        await writing
        total = len(writer.acked)
        await eventually(lambda: _more(target, total), 60, what=f"all {total} records replicated", interval_s=0.02)
        await check_exactly_once(source, target, writer)
        print(f"\n[geo] {KILLS} SIGKILLs of the replicator process, {total} records: 0 lost/reordered/duplicated")


async def _more(ns: Namespace, n: int) -> bool:
    return await count(ns) >= n


@pytest.mark.parametrize("how", ["blackhole", "reset"])
async def test_r19_link_cut_and_healed_catches_up_exactly_once(geo: Geo, how: str) -> None:
    async with namespaces(geo) as (source, target):
        writer = Writer(source)
        writing = asyncio.create_task(writer.run())
        await asyncio.to_thread(geo.start_replicator)
        await eventually(lambda: _more(target, 50), 60, what="50 records replicated before the cut", interval_s=0.02)
        await asyncio.to_thread(geo.cut, how)
        cut_at = len(writer.acked)
        await eventually(lambda: len(writer.acked) >= cut_at + 300, 30, what="300 records written during the cut", interval_s=0.02)
        await asyncio.sleep(SESSION_TIMEOUT_S + 1)  # a cut longer than the session: the lock is lost too
        writer.stopping = True
        await writing
        total = len(writer.acked)
        await asyncio.to_thread(geo.heal)
        healed = time.monotonic()
        await eventually(lambda: _more(target, total), CATCH_UP_S, what=f"{how}: caught up within {CATCH_UP_S}s of healing", interval_s=0.02)
        caught_up_s = time.monotonic() - healed
        await check_exactly_once(source, target, writer)
        assert geo.replicator is not None and geo.replicator.running, "the replicator survived the cut"
        assert "geo_session_failed" in geo.replicator.log_path.read_text(), "the cut ended the session"
        print(f"\n[geo] R19 {how}: {total} records, {total - cut_at} written during the cut; "
              f"caught up {caught_up_s:.2f}s after healing; 0 lost/reordered/duplicated")



def _geo_cli(*args: str) -> dict[str, Any]:
    import json
    import subprocess

    done = subprocess.run(python_module_argv("scriba.cli", "geo", *args), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


async def test_failover_drill_and_translation_after_the_link_is_cut(geo: Geo) -> None:
    """The link is cut while the source keeps writing, the replicator dies with it: the
    drill (``scriba geo failover-drill``) reports exactly the records the target lacks,
    and the source's cursor moves to the target (``scriba geo translate --cursors``) at the
    first record after the last one the target holds."""
    async with namespaces(geo) as (source, target):
        writer = Writer(source)
        writing = asyncio.create_task(writer.run())
        await asyncio.to_thread(geo.start_replicator)
        await eventually(lambda: _more(target, 100), 60, what="100 records replicated", interval_s=0.02)
        # reset, not blackhole: our proxy holds a blackholed link's bytes and delivers them on
        # heal, so adds the replicator sent into the cut could still land and be recovered by
        # the promotion -- the target would then lack nothing and the drill have no loss to show
        geo.cut("reset")
        sent = len(writer.acked)
        await eventually(lambda: len(writer.acked) >= sent + 50, 60, what="50 more source records", interval_s=0.02)
        writer.stopping = True
        await writing
        assert geo.replicator is not None
        await asyncio.to_thread(geo.replicator.kill)  # the replicator goes down with the link
        geo.heal()  # the drill reaches the target directly; the replicator stays dead
        report = _geo_cli("failover-drill", "--source", geo.us.uri, "--target", geo.eu.uri, "--source-name", "us",
                          "--stream", f"{NAMESPACE}/{STREAM}", "--lock-timeout-s", str(SESSION_TIMEOUT_S * 5))
        # Adds the dead replicator left in flight may be recovered into the target by the
        # promotion (its writer closes the open segment): count what the target holds now.
        held = [r for r in await read_all(target) if Mark.from_headers(r.headers) is not None]
        src = await read_all(source)
        lost = len(src) - len(held)
        assert lost >= 1 and report["lost_records"] == lost, (report, len(src), len(held))
        assert payloads(held) == payloads(src[:len(held)])
        assert report["replicated_through"] == str(Mark.from_headers(held[-1].headers).source_position)  # type: ignore[union-attr]
        assert report["time_to_writable_s"] > 0 and report["loss_window_s"] >= 0
        await source.commit_cursor(STREAM, "reports", src[len(held)].position)  # the next one it would read
        moved = _geo_cli("translate", "--source", geo.us.uri, "--target", geo.eu.uri, "--source-name", "us",
                         "--stream", f"{NAMESPACE}/{STREAM}", "--cursors", str(src[0].position))
        assert moved["positions"][0]["replicated"] is True
        assert moved["cursors"]["reports"]["replicated"] is False  # the target never got it
        resume = await target.cursor(STREAM, "reports")
        assert resume is not None and str(resume) == moved["cursors"]["reports"]["resume_position"]
        after = [r for r in await read_all(target) if r.position >= resume]
        assert after and after[0].headers.get("geo.promoted_from") == b"us"  # nothing of the source skipped
        print(f"\n[geo] fail-over drill: {report}")
