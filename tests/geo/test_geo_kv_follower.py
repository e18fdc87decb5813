"""The KV store's read-only replica set in a second cluster, fed by geo-replication (real processes).

Cluster ``a``: its own etcd and three bookies, and two replicas of the store
(``scriba-kv serve``). Cluster ``b``: its own etcd and three bookies, the replicator
(``scriba geo replicate --stream kv/store``, a process) copying the store's command
stream into it, and two followers (``scriba-kv follow``): ``f1`` plain, ``f2`` with
``--max-staleness-s``. Clients are unmodified: ``etcdctl`` (a subprocess) and ``aetcd``.

- Consistent prefix: while ``a`` takes puts, deletes and transactions, every
  serializable read from a follower (its ``header.revision`` ``R`` and keys) equals what
  ``a`` answers for revision ``R`` (``get --rev R``); once caught up both followers equal
  ``a`` whole and report the same applied-command count. The checker's negative control:
  the same comparison one revision off fails.
- Read-only as an etcd learner: writes, linearizable reads, watches, leases and member
  list get UNAVAILABLE ``etcdserver: rpc not supported for learner``; ``endpoint status``
  says ``isLearner``.
- Lag: the replicator SIGKILLed while ``a`` keeps writing, the followers serve their
  older prefix (a read at ``a``'s newer revision gets etcd's "future revision"), ``Status``
  reports how far behind in ``errors``, and ``f2`` refuses reads past its bound; the
  replicator restarted, both catch up and ``f2`` serves again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aetcd
import grpc
import pytest
from aetcd.rpc import rpc_pb2 as pb
from aetcd.rpc import rpc_pb2_grpc as stubs

from scriba.embedded.kvstore import KvCluster
from scriba.embedded.process import ServerProcess, free_port, python_module_argv
from scriba.errors import DeadlineExceededError
from scriba.testing.cluster import LocalCluster
from scriba.testing.waiting import eventually

_KV_TESTS = str(Path(__file__).resolve().parents[1] / "examples" / "kvstore")
if _KV_TESTS not in sys.path:
    sys.path.append(_KV_TESTS)

from kv_harness import Ctl  # noqa: E402  (etcdctl as a subprocess, shared with the store's tests)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RSM_CONFIG = {"campaign_backoff_s": 0.1, "suspended_grace_s": 0.5, "propose_timeout_s": 20.0,
              "writer_lock_timeout_s": 60.0}  # no snapshot (so no truncation) in a run this short
MAX_STALENESS_S = 5.0
STALE_AFTER_S = 1.0
CATCH_UP_S = 90.0  # generous: a loaded 2-core machine runs 2 etcds, 6 bookies and 5 Python servers here
LEARNER = "rpc not supported for learner"


@dataclass
class GeoKv:
    a: LocalCluster
    b: LocalCluster
    kv: KvCluster
    base: Path
    replicator: ServerProcess | None = None
    followers: dict[str, tuple[str, ServerProcess]] = field(default_factory=dict)
    metrics: dict[str, str] = field(default_factory=dict)  # follower -> its /metrics host:port
    starts: int = 0

    def start_replicator(self) -> None:
        self.starts += 1
        argv = python_module_argv(
            "scriba.cli", "geo", "replicate", "--source", self.a.uri, "--target", self.b.uri,
            "--stream", "kv/store", "--source-name", "a", "--target-name", "b", "--session-timeout-s", "3")
        proc = ServerProcess("geo replicate", argv, self.base / f"replicator-{self.starts}.log")
        proc.start()
        self.replicator = proc

    def start_follower(self, name: str, *extra: str) -> None:
        endpoint = f"127.0.0.1:{free_port()}"
        self.metrics[name] = f"127.0.0.1:{free_port()}"
        argv = python_module_argv(
            "scriba.examples.kvstore", "follow", "--metadata", self.b.uri, "--replica-id", name,
            "--listen", endpoint, "--origin", "a", "--source-metadata", self.a.uri,
            "--stale-after-s", str(STALE_AFTER_S), "--metrics-listen", self.metrics[name],
            "--rsm-config", json.dumps(RSM_CONFIG), *extra)
        self.followers[name] = (endpoint, ServerProcess(f"kv follower {name}", argv, self.base / f"{name}.log"))
        self.restart_follower(name)

    def restart_follower(self, name: str) -> None:
        proc = self.followers[name][1]
        served = proc.log_path.read_text(errors="replace").count("READY") if proc.log_path.exists() else 0
        proc.start()
        proc.wait_ready(lambda: proc.log_path.read_text(errors="replace").count("READY") > served, 60.0)

    def endpoint(self, name: str) -> str:
        return self.followers[name][0]

    def stop(self) -> None:
        for _endpoint, proc in self.followers.values():
            proc.stop()
        if self.replicator is not None:
            self.replicator.stop()


@pytest.fixture(scope="module")
def geo_kv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GeoKv]:
    base = tmp_path_factory.mktemp("geo-kv")
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(LocalCluster(base / "a"))
        b = stack.enter_context(LocalCluster(base / "b"))
        a.bookies.start_bookies(3)
        b.bookies.start_bookies(3)
        kv = KvCluster(a.uri, base / "kv", replicas=2, rsm_config=RSM_CONFIG)
        stack.callback(kv.stop_all)
        kv.start_all(attempts=3)
        geo = GeoKv(a, b, kv, base)
        stack.callback(geo.stop)
        _RUNNING.append(geo)
        stack.callback(_RUNNING.remove, geo)
        geo.start_replicator()
        geo.start_follower("f1")
        geo.start_follower("f2", "--max-staleness-s", str(MAX_STALENESS_S))
        yield geo


@pytest.fixture
async def collect_on_the_loop() -> AsyncIterator[None]:
    """aetcd's gRPC objects finalised while their loop runs (else unraisable warnings later)."""
    yield
    import gc

    gc.collect()
    await asyncio.sleep(0)


def source_ctl(geo: GeoKv) -> Ctl:
    return Ctl(geo.kv.endpoints)


def view(doc: dict[str, Any]) -> tuple[int, list[tuple[str, str, int, int, int]]]:
    """``(header revision, keys)`` of an ``etcdctl get -w json`` answer."""
    kvs = [(base64.b64decode(k["key"]).decode(), base64.b64decode(k.get("value", "")).decode(),
            int(k.get("create_revision", 0)), int(k.get("mod_revision", 0)), int(k.get("version", 0)))
           for k in doc.get("kvs", [])]
    return int(doc["header"]["revision"]), kvs


def follower_read(geo: GeoKv, name: str, prefix: str = "") -> tuple[int, list[tuple[str, str, int, int, int]]]:
    return view(Ctl(geo.endpoint(name)).json("get", "--consistency=s", "--prefix", prefix))


def served_read(geo: GeoKv, name: str, timeout_s: float = CATCH_UP_S) -> tuple[int, list[Any]]:
    """A follower read, waiting out refusals for staleness (f2's bound on a busy machine)."""
    deadline = time.monotonic() + timeout_s
    while True:
        p = Ctl(geo.endpoint(name)).run("get", "--consistency=s", "--prefix", "", "-w", "json")
        if p.returncode == 0:
            return view(json.loads(p.stdout))
        assert "too far behind" in p.stderr and time.monotonic() < deadline, p.stderr
        time.sleep(0.2)  # a retry's pacing, not synchronisation


def source_at(geo: GeoKv, revision: int, prefix: str = "") -> list[tuple[str, str, int, int, int]]:
    return view(source_ctl(geo).json("get", "--prefix", prefix, "--rev", str(revision)))[1]


def source_revision(geo: GeoKv) -> int:
    return view(source_ctl(geo).json("get", "--prefix", "nothing-here/"))[0]


def check_prefix(geo: GeoKv, sample: tuple[int, list[tuple[str, str, int, int, int]]], prefix: str = "",
                 offset: int = 0) -> str:
    """The consistent-prefix checker: "" when the follower's answer is ``a``'s at its revision
    (``offset``: compare against another revision instead; the negative control)."""
    revision, kvs = sample
    expected = source_at(geo, revision + offset, prefix)
    return "" if kvs == expected else f"follower at revision {revision}: {kvs[:3]}... != source's {expected[:3]}..."


async def wait_until(cond: Callable[[], bool], what: str, timeout_s: float = CATCH_UP_S) -> None:
    """``cond`` runs etcdctl (blocking): off the loop, every 0.2 s, until a deadline (then the
    failure carries the tails of the replicator's and the followers' logs)."""
    try:
        await eventually(lambda: asyncio.to_thread(cond), timeout_s, what=what, interval_s=0.2)
    except DeadlineExceededError as e:
        raise DeadlineExceededError(f"{e}\n{_log_tails()}") from e


_RUNNING: list[GeoKv] = []  # the module's deployment, for log tails in a failure


def _log_tails(lines: int = 25) -> str:
    procs = [(name, proc) for geo in _RUNNING for name, (_, proc) in geo.followers.items()]
    procs += [("replicator", geo.replicator) for geo in _RUNNING if geo.replicator is not None]
    return "\n".join(f"--- {name}: {proc.log_path} ---\n{proc.log_tail(lines)}" for name, proc in procs)


def caught_up(geo: GeoKv, name: str, revision: int) -> bool:
    try:
        return follower_read(geo, name, "nothing-here/")[0] >= revision
    except AssertionError:  # a refused read (f2 while stale) or a follower still starting
        return False


def scrape(geo: GeoKv, name: str) -> dict[str, float]:
    """A follower's Prometheus gauges (unlabelled ones, and the role it has)."""
    with urllib.request.urlopen(f"http://{geo.metrics[name]}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("scriba_rsm_") and " " in line:
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def status(geo: GeoKv, name: str) -> dict[str, Any]:
    (entry,) = Ctl(geo.endpoint(name)).json("endpoint", "status")
    resp: dict[str, Any] = entry["Status"]
    return resp


async def write_workload(client: aetcd.Client, n: int, tag: str) -> None:
    for i in range(n):
        await client.put(f"k/{i % 23:02d}".encode(), f"{tag}-{i}".encode())
        if i % 9 == 4:
            await client.delete(f"k/{(i * 7) % 23:02d}".encode())
        if i % 11 == 6:
            tx = client.transactions
            await client.transaction(compare=[tx.version(b"k/00") > 0], success=[tx.put(b"t/ok", f"{i}".encode())],
                                     failure=[tx.put(b"t/no", f"{i}".encode())])


def source_client(geo: GeoKv) -> aetcd.Client:
    host, port = geo.kv.replicas[0].endpoint.rsplit(":", 1)
    return aetcd.Client(host, int(port), timeout=30)


@pytest.mark.usefixtures("collect_on_the_loop")
async def test_followers_serve_a_consistent_prefix_of_the_source(geo_kv: GeoKv) -> None:
    geo = geo_kv
    samples: list[tuple[str, tuple[int, list[Any]]]] = []
    async with source_client(geo) as client:
        await client.put(b"k/start", b"0")
        first = source_revision(geo)
        await wait_until(lambda: all(caught_up(geo, f, first) for f in ("f1", "f2")), "followers at the start")
        samples += [(f, await asyncio.to_thread(served_read, geo, f)) for f in ("f1", "f2")]
        writing = asyncio.create_task(write_workload(client, 120, "a"))
        while not writing.done():  # read the followers while the source changes
            for name in ("f1", "f2"):
                samples.append((name, await asyncio.to_thread(served_read, geo, name)))
        await writing
        final = source_revision(geo)
        await wait_until(lambda: all(caught_up(geo, f, final) for f in ("f1", "f2")), "followers caught up")
        for name in ("f1", "f2"):
            samples.append((name, await asyncio.to_thread(served_read, geo, name)))
            # aetcd against the follower: a serializable get, the value the source holds
            host, port = geo.endpoint(name).rsplit(":", 1)
            async with aetcd.Client(host, int(port), timeout=30) as reader:
                got = await reader.get(b"k/05", serializable=True)
                want = await client.get(b"k/05")
                assert (got.value if got else None) == (want.value if want else None)
                assert got is None or (got.mod_revision, got.version) == (want.mod_revision, want.version)
    problems = [f"{name}: {why}" for name, sample in samples if (why := check_prefix(geo, sample))]
    assert problems == [], problems[:3]
    revisions = {sample[0] for _name, sample in samples}
    assert first in revisions and final in revisions and final > first + 100
    # the checker's negative control: a follower one revision behind what it claims is caught
    last = samples[-1][1]
    assert check_prefix(geo, last, offset=-1) != ""
    # caught up, both followers and the source's replicas count the same commands applied
    def same_commands() -> bool:
        counts = {int(status(geo, f).get("raftAppliedIndex", 0)) for f in ("f1", "f2")}
        counts |= {int(Ctl(r.endpoint).json("endpoint", "status")[0]["Status"].get("raftAppliedIndex", 0))
                   for r in geo.kv.replicas}
        return len(counts) == 1 and counts != {0}
    await wait_until(same_commands, "followers and source replicas at the same applied-command count")
    gauges = await asyncio.to_thread(scrape, geo, "f1")
    assert gauges['scriba_rsm_role{role="follower"}'] == 1.0
    assert gauges["scriba_rsm_commands_applied"] == int(status(geo, "f1")["raftAppliedIndex"])
    print(f"\n[geo-kv] {len(samples)} follower reads over revisions {first}..{final}: all a consistent prefix")


@pytest.mark.usefixtures("collect_on_the_loop")
async def test_a_follower_refuses_what_an_etcd_learner_refuses(geo_kv: GeoKv) -> None:
    ctl = Ctl(geo_kv.endpoint("f1"))
    for args in (("put", "k/x", "1"), ("del", "k/00"), ("get", "k/00"), ("lease", "grant", "10"),
                 ("member", "list"), ("txn",)):
        err = ctl.fails(*args, stdin="\n\n\n" if args == ("txn",) else None)
        assert LEARNER in err, (args, err)
    # streams (etcdctl's watch retries an UNAVAILABLE stream for ever, as against an etcd
    # learner): the code and message straight from the stubs. The follower refuses a stream
    # before reading from it, so the streams are opened without a request: grpc's Python
    # client reports a request it was still sending when the refusal came as INTERNAL
    # ("Failed execute_batch"), not as the server's status
    async with grpc.aio.insecure_channel(geo_kv.endpoint("f1")) as channel:
        streams = [stubs.WatchStub(channel).Watch(), stubs.LeaseStub(channel).LeaseKeepAlive()]
        for call in streams:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for _ in call:
                    pass
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and LEARNER in str(refused.value.details())
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stubs.KVStub(channel).Put(pb.PutRequest(key=b"k/x", value=b"1"))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    st = status(geo_kv, "f1")
    assert st.get("isLearner") is True, st
    host, port = geo_kv.endpoint("f2").rsplit(":", 1)
    async with aetcd.Client(host, int(port), timeout=30) as client:
        with pytest.raises(aetcd.ClientError, match=LEARNER):
            await client.put(b"k/x", b"1")
        with pytest.raises(aetcd.ClientError, match=LEARNER):
            await client.get(b"k/00")  # linearizable
    assert source_ctl(geo_kv).json("get", "k/x").get("kvs") is None  # nothing written anywhere


@pytest.mark.usefixtures("collect_on_the_loop")
async def test_lag_is_reported_and_bounded_while_the_copy_stops(geo_kv: GeoKv) -> None:
    geo = geo_kv
    assert geo.replicator is not None
    await asyncio.to_thread(geo.replicator.kill)  # SIGKILL: the copy stops, the source goes on
    async with source_client(geo) as client:
        await write_workload(client, 30, "cut")
    cut_revision = source_revision(geo)
    # f1 keeps serving its older prefix, says how far behind it is, and is not at the new revision
    await wait_until(lambda: any("learner behind" in e for e in status(geo, "f1").get("errors", [])),
                     "f1 reports that it is behind")
    await wait_until(lambda: scrape(geo, "f1")["scriba_rsm_lag_seconds"] > STALE_AFTER_S,
                     "f1's lag gauge shows the staleness")
    behind_revision = follower_read(geo, "f1")[0]
    assert behind_revision < cut_revision and check_prefix(geo, follower_read(geo, "f1")) == ""
    err = Ctl(geo.endpoint("f1")).fails("get", "--consistency=s", "k/00", "--rev", str(cut_revision))
    assert "required revision is a future revision" in err, err
    # f2's bound: past it, reads are refused
    await wait_until(lambda: "too far behind" in Ctl(geo.endpoint("f2")).run("get", "--consistency=s", "k/00").stderr,
                     "f2 refuses reads past its staleness bound")
    geo.start_replicator()
    await wait_until(lambda: all(caught_up(geo, f, cut_revision) for f in ("f1", "f2")), "caught up after restart")
    await wait_until(lambda: not status(geo, "f1").get("errors"), "f1 no longer reports lag")
    assert check_prefix(geo, await asyncio.to_thread(served_read, geo, "f2")) == ""
    # a follower SIGKILLed and restarted replays its copy and serves the same prefix again
    await asyncio.to_thread(geo.followers["f1"][1].kill)
    await asyncio.to_thread(geo.restart_follower, "f1")
    await wait_until(lambda: caught_up(geo, "f1", cut_revision), "f1 caught up after its restart")
    assert check_prefix(geo, follower_read(geo, "f1")) == ""
