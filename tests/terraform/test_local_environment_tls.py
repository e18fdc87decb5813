"""``environments/local`` with ``tls``: the cluster terraform provisions runs mutual TLS.

One apply (1 etcd member, 3 bookies over 3 zones) with the test CA's certificates and
allow-lists: the output URI is ``etcd+tls://`` with the CA and the client certificate,
``scriba shell simple-test`` with the ``client_tls_flags`` output passes (the positive
control; the URI's etcd+tls handshake proves etcd serves TLS); a read of its ledger
with the flags succeeds and without them (plaintext to the bookies) is refused; a
simple-test with a certificate the CA signed but no allow-list names is refused.
Destroy leaves no process and frees every port. A ``tls`` naming a missing file is refused
at plan.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from terraform_kit import TerraformTree, free_port_range, port_free, requires_terraform

from scriba.local_cluster import ProcessRecord
from scriba.testing.pki import ADMIN_IDENTITY, BOOKIE_IDENTITY, CLIENT_IDENTITY, TestPki

pytestmark = [requires_terraform, pytest.mark.timeout(400)]

ENV = "environments/local"
REGIONS = {"r1": {"za": {"k1": 1}, "zb": {"k1": 1}, "zc": {"k1": 1}}}
BOOKIES = 3
SCRIBA = [sys.executable, "-m", "scriba.cli"]


def _shell(uri: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SCRIBA, "shell", "--metadata", uri, *args], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def _tls_vars(pki: TestPki) -> dict[str, object]:
    return {"ca_cert": str(pki.ca.cert), "cert": str(pki.server.cert), "key": str(pki.server.key),
            "client_cert": str(pki.client.cert), "client_key": str(pki.client.key),
            "allow": {"client": [CLIENT_IDENTITY], "bookie": [BOOKIE_IDENTITY], "admin": [ADMIN_IDENTITY]}}


def test_local_environment_runs_mutual_tls(tmp_path: Path, pki: TestPki) -> None:
    tree = TerraformTree(tmp_path)
    tree.init(ENV, backend=True)
    taken: set[int] = set()
    ports = {"metadata_port_base": free_port_range(2, taken), "bookie_port_base": free_port_range(BOOKIES, taken),
             "http_port_base": free_port_range(BOOKIES, taken)}
    data_dir = tmp_path / "cluster-data"
    tree.path(f"{ENV}/test.auto.tfvars.json").write_text(json.dumps({
        "regions": REGIONS, "data_dir": str(data_dir), "scriba_command": SCRIBA, "tls": _tls_vars(pki), **ports}))
    records: list[ProcessRecord] = []
    destroyed = False
    try:
        tree.run(ENV, "apply", "-auto-approve", "-no-color")
        outputs = {k: v["value"] for k, v in json.loads(tree.run(ENV, "output", "-json").stdout).items()}
        uri, flags = outputs["metadata_uri"], shlex.split(outputs["client_tls_flags"])
        assert uri.startswith(f"etcd+tls://127.0.0.1:{ports['metadata_port_base']}/scriba?ca="), uri
        assert flags == ["--tls-cert", str(pki.client.cert), "--tls-key", str(pki.client.key),
                         "--tls-ca", str(pki.ca.cert)], flags
        status = json.loads(subprocess.run([*SCRIBA, "local-cluster", "status", "--json", str(data_dir)],
                                           capture_output=True, text=True, timeout=60).stdout)
        records = [ProcessRecord(r["name"], r["pid"], r["start_ticks"], r["log"])
                   for r in status["metadata"] + [r for b in status["bookies"] for r in b["processes"]]]
        assert len(records) == 1 + BOOKIES and all(r.alive for r in records)

        passed = _shell(uri, *flags, "--json", "simple-test", "--entries", "100", "--keep")
        assert passed.returncode == 0, passed.stdout + passed.stderr
        report = json.loads(passed.stdout)
        assert report["ok"] and report["read"] == 100, report
        read = ["read-ledger", str(report["ledger_id"]), "--password", "scriba-simple-test", "--to", "0"]
        admitted = _shell(uri, *flags, *read)  # the positive control of the refusal below
        assert admitted.returncode == 0 and admitted.stdout.startswith("0\t"), admitted.stdout + admitted.stderr
        plaintext = _shell(uri, *read)  # etcd over TLS, the bookies without: every bookie refuses
        assert plaintext.returncode != 0 and "UNAVAILABLE" in plaintext.stderr, plaintext.stderr[-2000:]
        intruder = ["--tls-cert", str(pki.intruder.cert), "--tls-key", str(pki.intruder.key), "--tls-ca",
                    str(pki.ca.cert)]
        refused = _shell(uri, *intruder, "simple-test", "--entries", "10")  # signed by the CA, on no allow-list
        assert refused.returncode != 0 and "[intruder] are not on the client/bookie/admin allow-list" in refused.stderr, \
            refused.stderr[-2000:]

        tree.run(ENV, "destroy", "-auto-approve", "-no-color")
        destroyed = True
    finally:
        if not destroyed and tree.run(ENV, "destroy", "-auto-approve", "-no-color", check=False).returncode != 0:
            for r in records:
                r.stop()
    assert [r.pid for r in records if r.alive] == []
    assert [p for p in sorted(taken) if not port_free(p)] == []


def test_local_environment_refuses_missing_tls_files(tmp_path: Path, pki: TestPki) -> None:
    tree = TerraformTree(tmp_path)
    tree.init(ENV)
    bad = {**_tls_vars(pki), "key": str(tmp_path / "no-such.key")}
    tree.path(f"{ENV}/test.auto.tfvars.json").write_text(json.dumps({"data_dir": str(tmp_path / "d"), "tls": bad}))
    plan = tree.run(ENV, "plan", "-no-color", check=False)
    assert plan.returncode != 0 and "tls: ca_cert, cert and key must be paths of existing files" in plan.output
    good = {**_tls_vars(pki)}  # positive control: the same with the files there plans
    tree.path(f"{ENV}/test.auto.tfvars.json").write_text(json.dumps({"data_dir": str(tmp_path / "d"), "tls": good}))
    assert tree.run(ENV, "plan", "-no-color", check=False).returncode == 0
