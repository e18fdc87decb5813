"""R18 and haadmin: the namenode's HA under fail-overs, on real processes (three namenode
replicas, real etcd, real bookies, unmodified HdfsCLI clients).

R18: 20 fail-overs of the active — SIGKILL and graceful (``haadmin -failover``)
alternating — while writer threads run a mixed namespace + data workload (files of 0 B
to several blocks, mkdirs, renames, deletes, and appends of unique records to a log
file). Snapshots are off, so a killed namenode restarted after its round **replays the
whole confirmed edit log from scratch**; after every round the new active's digest
(linearizable) must equal every replica's, the replayed one's included. At the end the
checker holds the workload's history against the namespace: every acknowledged file
is there and byte-identical, nothing unacknowledged appears except what was in flight
at a fail-over (and then only in a state that write could leave), and every log file
holds each acknowledged record exactly once — an append applied twice is caught there.
The clients are given every URL and must find the new active on their own.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests
from hdfs import HdfsError, InsecureClient
from namenode_procs import NamenodeProc, active_of, haadmin, namenode_cluster, payload

from scriba.testing.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROUNDS = 50 if os.environ.get("SCRIBA_SOAK") == "1" else 20
BLOCK = 128 * 1024
SIZES = (0, 1, 1000, 70_000, 3 * BLOCK + 77)
NO_SNAPSHOTS = {"snapshot_every_commands": None, "snapshot_every_bytes": None}


@pytest.fixture(scope="module")
def cluster(etcd_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NamenodeProc]]:
    with namenode_cluster(etcd_cluster, tmp_path_factory.mktemp("namenode-ha"), 3, "ha", NO_SNAPSHOTS) as nodes:
        yield nodes


@dataclass
class History:
    """What the workload was told. ``files``: acknowledged path -> bytes (None: a directory).
    ``maybe``: path -> the states an unacknowledged operation may have left (bytes: the
    file holds a prefix of them; None: a directory; the path may also be absent).
    ``logs``: log path -> (acknowledged records, in flight records), in order."""

    files: dict[str, bytes | None] = field(default_factory=dict)
    maybe: dict[str, list[bytes | None]] = field(default_factory=dict)
    logs: dict[str, tuple[list[bytes], list[bytes]]] = field(default_factory=dict)
    acks: int = 0
    unknown: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # what the in-doubt calls were told
    lock: threading.Lock = field(default_factory=threading.Lock)

    def unsure(self, path: str, *states: bytes | None) -> None:
        with self.lock:
            self.unknown += 1
            self.maybe.setdefault(path, []).extend(states)


class Writer(threading.Thread):
    """One client thread: its own directory, a seeded mix of operations, every outcome recorded."""

    def __init__(self, name: str, urls: list[str], history: History, seed: int, stop: threading.Event) -> None:
        super().__init__(name=name)
        self.root, self.history, self.stop = f"/r18/{name}", history, stop
        self.random = random.Random(seed)
        self.client = InsecureClient(";".join(self.random.sample(urls, len(urls))), user="r18", timeout=120)
        self.n = 0
        self.log = ""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.n += 1
                self.step()
        except BaseException as exc:  # reported by the test: a checker bug, not a fail-over
            self.error = exc

    def step(self) -> None:
        h = self.history
        with h.lock:
            mine = [p for p, d in h.files.items() if p.startswith(self.root + "/f") and d is not None]
        choice = self.random.random()
        if choice < 0.35 or len(mine) < 2:
            path = f"{self.root}/f{self.n}"
            data = payload(path, self.random.choice(SIZES))
            self.call(lambda: self.client.write(path, data=data, blocksize=BLOCK, replication=3),
                      lambda _: h.files.__setitem__(path, data), (path, data))
        elif choice < 0.45:
            path = f"{self.root}/d{self.n}/sub"
            self.call(lambda: self.client.makedirs(path), lambda _: h.files.__setitem__(path, None), (path, None))
        elif choice < 0.60:
            src = self.random.choice(mine)
            dst = f"{self.root}/f{self.n}-renamed"
            data = h.files[src]
            self.call(lambda: self.client.rename(src, dst), lambda _: h.files.__setitem__(dst, data),
                      (src, data), (dst, data), forget=src)
        elif choice < 0.70:
            src = self.random.choice(mine)
            self.call(lambda: self.client.delete(src), lambda _: None, (src, h.files[src]), forget=src,
                      check=lambda ok: ok is True)
        else:
            self.append()

    def append(self) -> None:
        h = self.history
        if not self.log:
            log = f"{self.root}/log{self.n}"
            if self.call(lambda: self.client.write(log, data=b""), lambda _: h.logs.__setitem__(log, ([], [])),
                         (log, b"")):
                self.log = log
            return
        log, record = self.log, f"<{self.name}:{self.n}>".encode()
        acked, in_flight = h.logs[log]

        def appended(_: Any) -> None:
            acked.append(record)

        if not self.call(lambda: self.client.write(log, data=record, append=True), appended):
            in_flight.append(record)
            self.log = ""  # the file may be left under construction: the next appends go to a new log

    def call(self, op: Any, on_ack: Any, *unsure: tuple[str, bytes | None], forget: str | None = None,
             check: Any = None) -> bool:
        """Run one client call; on success ``on_ack(result)``, else every ``unsure`` (path, state)
        is recorded as possible. ``forget``: an acknowledged path this call moves or removes."""
        try:
            result = op()
        except (HdfsError, requests.RequestException) as exc:
            result = None
            failed = True
            with self.history.lock:
                self.history.errors[f"{type(exc).__name__}: {str(exc)[:60]}"] += 1
            time.sleep(0.05)  # a client's pause before its next call (no StandbyException storm)
        else:
            failed = check is not None and not check(result)
        if failed:
            for state in unsure:
                self.history.unsure(*state)
        with self.history.lock:
            if forget is not None:
                self.history.files.pop(forget, None)  # an acknowledged path, now in doubt or moved
            if not failed:
                on_ack(result)
                self.history.acks += 1
        return not failed


class Workload:
    def __init__(self, nodes: list[NamenodeProc], history: History, seed: int, threads: int = 2) -> None:
        self.stop = threading.Event()
        urls = [n.url for n in nodes]
        self.writers = [Writer(f"w{seed}-{i}", urls, history, seed * 100 + i, self.stop) for i in range(threads)]
        self.history = history

    def __enter__(self) -> Workload:
        for writer in self.writers:
            writer.start()
        return self

    def wait_acks(self, more: int, timeout_s: float = 90.0) -> None:
        target = self.history.acks + more
        wait_until(lambda: self.history.acks >= target, timeout_s, what=f"{more} more acknowledged operations", interval_s=0.05)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for writer in self.writers:
            writer.join(180)
            assert not writer.is_alive(), f"{writer.name} hangs"
            if writer.error is not None:
                raise writer.error


def tree(client: InsecureClient, root: str) -> dict[str, bytes | None]:
    found: dict[str, bytes | None] = {}
    for path, dirs, files in client.walk(root):
        for d in dirs:
            found[f"{path}/{d}"] = None
        for f in files:
            with client.read(f"{path}/{f}") as reader:
                found[f"{path}/{f}"] = reader.read()
    return found


def check(history: History, found: dict[str, bytes | None]) -> list[str]:
    """The problems in ``found`` against the history (empty: none)."""
    problems = []
    parents = {p.rsplit("/", i)[0] for p in [*history.files, *history.maybe] for i in range(1, 3)}
    for path, want in history.files.items():
        if path in history.logs:
            continue
        if path not in found:
            problems.append(f"lost: {path}")
        elif found[path] != want:
            problems.append(f"changed: {path} ({len(found[path] or b'')} bytes, acknowledged {len(want or b'')})")
    for path, got in found.items():
        if path in history.files or path in history.logs or path in parents or (got is None and path.count("/") == 2):
            continue  # the last: a writer's own directory
        allowed = history.maybe.get(path)
        if allowed is None:
            problems.append(f"unexpected: {path}")
        elif not any((a is None and got is None) or (a is not None and got is not None and a.startswith(got))
                     for a in allowed):
            problems.append(f"impossible state of {path} after an unacknowledged operation")
    for log, (acked, in_flight) in history.logs.items():
        if log not in found:
            if acked:
                problems.append(f"lost: log {log} with {len(acked)} acknowledged records")
            continue
        records = [r + b">" for r in (found[log] or b"").split(b">") if r]
        if len(records) != len(set(records)):
            problems.append(f"applied twice in {log}: {[r for r in records if records.count(r) > 1][:3]}")
        if not set(acked) <= set(records):
            problems.append(f"lost appends in {log}: {sorted(set(acked) - set(records))[:3]}")
        if not set(records) <= set(acked) | set(in_flight):
            problems.append(f"unexpected appends in {log}: {sorted(set(records) - set(acked) - set(in_flight))[:3]}")
        if [r for r in records if r in set(acked)] != acked:
            problems.append(f"appends out of order in {log}")
    return problems


def test_checker_finds_lost_unexpected_and_twice_applied() -> None:
    """Negative controls: each broken namespace is reported."""
    history = History(files={"/r18/a/f1": b"abc", "/r18/a/d2/sub": None, "/r18/a/log3": b""},
                      maybe={"/r18/a/f4": [b"0123"]}, logs={"/r18/a/log3": ([b"<a:5>", b"<a:6>"], [b"<a:7>"])})
    good = {"/r18/a/f1": b"abc", "/r18/a/d2/sub": None, "/r18/a/log3": b"<a:5><a:6><a:7>", "/r18/a/f4": b"01"}
    assert check(history, good) == []
    assert check(history, {**good, "/r18/a/log3": b"<a:5><a:7>"})  # a lost append
    assert check(history, {**good, "/r18/a/log3": b"<a:5><a:6><a:6>"})  # applied twice
    assert check(history, {**good, "/r18/a/log3": b"<a:6><a:5>"})  # reordered
    assert check(history, {k: v for k, v in good.items() if k != "/r18/a/f1"})  # a lost file
    assert check(history, {**good, "/r18/a/f1": b"abd"})  # changed bytes
    assert check(history, {**good, "/r18/a/zz": b""})  # from nowhere
    assert check(history, {**good, "/r18/a/f4": b"9"})  # not what the in-flight write could leave


def test_r18_failovers_under_a_writer_workload(cluster: list[NamenodeProc]) -> None:
    seed = random.randrange(1 << 16)
    print(f"R18 seed {seed}")
    history = History()
    for round_ in range(ROUNDS):
        graceful = round_ % 2 == 1
        with Workload(cluster, history, seed + round_) as load:
            load.wait_acks(2)
            old = active_of(cluster)
            before = history.acks
            if graceful:
                target = next(n for n in cluster if n is not old)
                done = haadmin(old, "-failover", old.replica_id, target.replica_id)
                assert done.returncode == 0, done.stderr
                assert done.stdout.strip() == f"Failover to {target.replica_id} successful"
            else:
                old.kill()
            new = active_of([n for n in cluster if n is not old], timeout_s=90)
            # the clients found the new active on their own
            wait_until(lambda b=before: history.acks >= b + 3, 120, what=f"round {round_}: writes after the fail-over", interval_s=0.05)
        if not graceful:
            old.start()  # no snapshots: it replays the whole edit log from scratch
            assert old.status()["rsm"]["snapshot_position"] is None  # type: ignore[index]
        want = new.digest("linearizable")
        for node in cluster:
            wait_until(lambda n=node, w=want: n.digest() == w, 90, what=f"round {round_}: {node.replica_id}'s digest", interval_s=0.05)
    assert history.acks > 4 * ROUNDS and history.logs
    problems = check(history, tree(InsecureClient(";".join(n.url for n in cluster), user="r18"), "/r18"))
    assert problems == [], problems[:20]
    print(f"R18: {ROUNDS} fail-overs, {history.acks} acknowledged operations, {history.unknown} in doubt: "
          f"{history.errors.most_common(8)}")


def test_haadmin_on_processes(cluster: list[NamenodeProc]) -> None:
    active = active_of(cluster)
    standbys = [n for n in cluster if n is not active]
    state = haadmin(active, "-getServiceState", active.replica_id)
    assert (state.returncode, state.stdout.strip()) == (0, "active"), state.stderr
    assert haadmin(active, "-getServiceState", standbys[0].replica_id).stdout.strip() == "standby"
    listing = haadmin(active, "-getAllServiceState").stdout.splitlines()
    assert sorted(line.split("\t")[0] for line in listing) == sorted(n.replica_id for n in cluster)
    assert {line.split("\t")[1] for line in listing} == {n.url for n in cluster}
    assert sum(line.endswith("\tactive") for line in listing) == 1
    assert haadmin(active, "-checkHealth", standbys[1].replica_id).returncode == 0
    # -failover from a standby is refused, naming the active; nothing changes
    refused = haadmin(active, "-failover", standbys[0].replica_id, standbys[1].replica_id)
    assert refused.returncode == 1 and f"the active is {active.replica_id}" in refused.stderr
    assert active_of(cluster) is active
    intruder = haadmin(active, "--user", "mallory", "-failover", active.replica_id, standbys[0].replica_id)
    assert intruder.returncode == 1 and "Access denied for user mallory" in intruder.stderr
    assert active_of(cluster) is active
    unknown = haadmin(active, "-getServiceState", "nn-missing")
    assert unknown.returncode == 1 and "no live namenode 'nn-missing'" in unknown.stderr
    # -transitionToActive: the active hands over to the named standby
    moved = haadmin(active, "-transitionToActive", standbys[1].replica_id)
    assert moved.returncode == 0, moved.stderr
    assert active_of(cluster) is standbys[1]
    # -transitionToStandby: the active hands over to a standby of its choosing
    down = haadmin(active, "-transitionToStandby", standbys[1].replica_id)
    assert down.returncode == 0, down.stderr
    now = active_of(cluster)
    assert now is not standbys[1]
    assert haadmin(active, "-getServiceState", standbys[1].replica_id).stdout.strip() == "standby"
    # writes still work through any namenode afterwards, and the digests agree
    InsecureClient(standbys[1].url, user="ha").write("/haadmin/after", data=b"ok")
    want = now.digest("linearizable")
    for node in cluster:
        wait_until(lambda n=node: n.digest() == want, 60, what=f"{node.replica_id}'s digest", interval_s=0.05)
