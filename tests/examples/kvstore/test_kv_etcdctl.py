"""Debian's etcdctl (unmodified) against three replicas of the store on real processes."""

from __future__ import annotations

import base64
import os
import subprocess
import uuid

import pytest
from kv_harness import Ctl

from scriba.embedded.kvstore import KvCluster
from scriba.testing.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_put_get_variants_and_delete(ctl: Ctl) -> None:
    p = f"p{uuid.uuid4().hex[:6]}/"
    for i in range(5):
        assert ctl.ok("put", f"{p}k{i}", f"v{i}").strip() == "OK"
    assert ctl.ok("get", "--prefix", p).split() == [x for i in range(5) for x in (f"{p}k{i}", f"v{i}")]
    assert ctl.ok("get", "--prefix", p, "--limit", "2").split() == [f"{p}k0", "v0", f"{p}k1", "v1"]
    assert ctl.ok("get", "--prefix", p, "--keys-only").split() == [f"{p}k{i}" for i in range(5)]
    assert ctl.json("get", "--prefix", p, "--limit", "1")["count"] == 5  # etcdctl 3.4 has no --count-only
    first = ctl.json("get", f"{p}k0")["kvs"][0]
    ctl.ok("put", f"{p}k0", "changed")
    old = ctl.json("get", f"{p}k0", "--rev", str(first["mod_revision"]))["kvs"][0]
    assert base64.b64decode(old["value"]) == b"v0"
    now = ctl.json("get", f"{p}k0")["kvs"][0]
    assert now["version"] == 2 and now["create_revision"] == first["create_revision"]
    assert now["mod_revision"] > first["mod_revision"]
    assert ctl.ok("get", "--prefix", p, "--order", "DESCEND", "--limit", "1", "--keys-only").split() == [f"{p}k4"]
    for endpoint in ctl.endpoints.split(","):  # every replica serves reads: linearizable and serializable
        assert ctl.ok("get", f"{p}k0", "--print-value-only", endpoints=endpoint).strip() == "changed"
        assert ctl.ok("get", f"{p}k0", "--consistency", "s", "--print-value-only", endpoints=endpoint).strip() \
            in {"changed", "v0"}
    assert ctl.ok("del", f"{p}k0").strip() == "1"
    assert ctl.ok("del", "--prefix", p, "--prev-kv").split()[0] == "4"
    assert ctl.json("get", "--prefix", p).get("count", 0) == 0


def test_txn_from_stdin(ctl: Ctl) -> None:
    k = f"t{uuid.uuid4().hex[:6]}"
    ctl.ok("put", k, "1")
    script = f'value("{k}") = "1"\n\nput {k} 2\nget {k}\n\nget {k}\n\n'
    assert ctl.ok("txn", stdin=script).split() == ["SUCCESS", "OK", k, "2"]
    assert ctl.ok("txn", stdin=script).split() == ["FAILURE", k, "2"]  # value is 2 now: failure branch
    mod = ctl.json("get", k)["kvs"][0]["mod_revision"]
    script = f'mod("{k}") = "{mod}"\nversion("{k}") > "1"\n\ndel {k}\n\n\n'
    assert ctl.ok("txn", stdin=script).split() == ["SUCCESS", "1"]


def test_leases(ctl: Ctl) -> None:
    k = f"l{uuid.uuid4().hex[:6]}"
    out = ctl.ok("lease", "grant", "60").split()
    lease = out[1]
    ctl.ok("put", k, "v", f"--lease={lease}")
    ttl = ctl.ok("lease", "timetolive", lease, "--keys")
    assert "granted with TTL(60s)" in ttl and k in ttl
    assert lease in ctl.ok("lease", "list")
    keep = ctl.ok("lease", "keep-alive", "--once", lease)
    assert "keepalived with TTL(60)" in keep
    assert "revoked" in ctl.ok("lease", "revoke", lease)
    assert ctl.json("get", k).get("count", 0) == 0  # revoking deleted the key
    assert "already expired" in ctl.ok("lease", "timetolive", lease)
    # expiry is decided by the leader and replicated: the key goes away on every replica
    short = ctl.ok("lease", "grant", "2").split()[1]
    ctl.ok("put", f"{k}-short", "v", f"--lease={short}")
    wait_until(lambda: ctl.json("get", f"{k}-short").get("count", 0) == 0, 20, what="the 2 s lease expired",
               interval_s=0.2)
    for endpoint in ctl.endpoints.split(","):
        assert ctl.json("get", f"{k}-short", endpoints=endpoint).get("count", 0) == 0


def test_endpoint_status_health_and_member_list(ctl: Ctl, kv_cluster: KvCluster) -> None:
    statuses = ctl.json("endpoint", "status")
    assert len(statuses) == 3
    leaders = {s["Status"]["leader"] for s in statuses}
    assert len(leaders) == 1 and leaders != {0}  # all agree on one leader
    assert sum(s["Status"]["leader"] == s["Status"]["header"]["member_id"] for s in statuses) == 1
    assert all(s["Status"]["version"] == "3.5.0" for s in statuses)
    health = ctl.run("endpoint", "health")
    assert health.returncode == 0 and health.stderr.count("is healthy") + health.stdout.count("is healthy") == 3
    members = ctl.ok("member", "list")
    for r in kv_cluster.replicas:
        assert f"http://{r.endpoint}" in members and r.replica_id in members


def test_bad_input_gets_etcds_errors(ctl: Ctl) -> None:
    k = f"e{uuid.uuid4().hex[:6]}"
    assert "etcdserver: key is not provided" in ctl.fails("put", "", "v")
    assert "required revision is a future revision" in ctl.fails("get", k, "--rev", "99999999")
    assert "requested lease not found" in ctl.fails("put", k, "v", "--lease=1234")
    assert "requested lease not found" in ctl.fails("lease", "revoke", "1234")
    assert "authentication is not enabled" in ctl.fails("auth", "disable")
    rev = ctl.json("put", k, "1")["header"]["revision"]
    ctl.ok("put", k, "2")
    ctl.ok("compact", str(rev + 1))
    assert "required revision has been compacted" in ctl.fails("get", k, "--rev", str(rev))
    assert "required revision has been compacted" in ctl.fails("compact", str(rev))
    assert ctl.ok("get", k, "--print-value-only").strip() == "2"  # nothing written by the failures
    assert ctl.json("get", k)["kvs"][0]["version"] == 2
    big = "x" * (600 * 1024)  # over the command size limit
    assert "request is too large" in ctl.fails("put", k, stdin=big)


def test_watch_from_history_and_live(ctl: Ctl) -> None:
    p = f"w{uuid.uuid4().hex[:6]}/"
    rev = ctl.json("put", f"{p}a", "1")["header"]["revision"]
    ctl.ok("put", f"{p}b", "2")
    watcher = subprocess.Popen(["etcdctl", "--endpoints", ctl.endpoints.split(",")[1], "watch", "--prefix", p,
                                "--rev", str(rev)], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "ETCDCTL_API": "3"})
    try:
        ctl.ok("del", f"{p}a")
        ctl.ok("put", f"{p}c", "3")
        assert watcher.stdout is not None
        lines = [watcher.stdout.readline().strip() for _ in range(11)]
    finally:
        watcher.kill()  # our own child
        watcher.wait()
        if watcher.stdout is not None:
            watcher.stdout.close()
    assert lines == ["PUT", f"{p}a", "1", "PUT", f"{p}b", "2", "DELETE", f"{p}a", "", "PUT", f"{p}c"]
