"""``scriba sandbox --tls``: the whole sandbox over mutual TLS with a throwaway CA.

etcd, the bookies and the console all require client certificates. ``scriba shell
simple-test`` next to the sandbox finds the client certificate in sandbox.json and
passes (the positive control); a read without a certificate fails (every bookie
UNAVAILABLE) and the same read with it succeeds; the console, reached with the admin certificate, probes every
bookie's HTTPS admin endpoint successfully (two probes in a row give a history sample).
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from scriba.tls import TlsConfig

SCRIBA = [sys.executable, "-m", "scriba.cli"]
pytestmark = [pytest.mark.timeout(300)]


def _https_json(url: str, tls: dict[str, str]) -> Any:
    ctx = TlsConfig(cert=Path(tls["cert"]), key=Path(tls["key"]), ca=Path(tls["ca"])).load().client_ssl_context()
    with urllib.request.urlopen(url, timeout=10, context=ctx) as reply:
        return json.loads(reply.read())


def _probed_over_tls(console: str, admin: dict[str, str], ids: list[str]) -> bool:
    rows = _https_json(console + "api/bookies", admin)
    ok = [r for r in rows if r["state"] == "writable" and not r["probe_error"]]
    return len(ok) == len(ids) and all(_https_json(f"{console}api/bookies/{b}/history", admin) for b in ids)


def test_sandbox_tls_simple_test_console_and_refusal(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SCRIBA_METADATA"}
    started = subprocess.run([*SCRIBA, "sandbox", "--tls", "--bookies", "3", "--detach"],
                             capture_output=True, text=True, timeout=150, cwd=tmp_path, env=env)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        doc = json.loads((tmp_path / "sandbox-data" / "sandbox.json").read_text())
        uri = doc["metadata_uri"]
        assert uri.startswith("etcd+tls://") and doc["console"]["url"].startswith("https://")
        passed = subprocess.run([*SCRIBA, "shell", "--json", "simple-test", "--entries", "200", "--keep"],
                                capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
        assert passed.returncode == 0, passed.stdout + passed.stderr
        report = json.loads(passed.stdout)
        assert report["ok"] and report["read"] == 200
        elsewhere = tmp_path / "elsewhere"  # no sandbox.json here: no client certificate either
        elsewhere.mkdir()
        read = ["read-ledger", str(report["ledger_id"]), "--password", "scriba-simple-test", "--to", "0"]
        refused = subprocess.run([*SCRIBA, "shell", "--metadata", uri, *read],
                                 capture_output=True, text=True, timeout=120, cwd=elsewhere, env=env)
        # the transport's message says "this client dials without TLS"; the read core sums it up per bookie
        assert refused.returncode != 0
        assert "bookie-1: UNAVAILABLE" in refused.stderr, refused.stdout + refused.stderr
        c = doc["client_tls"]  # positive control of the refusal: the same read with the certificate
        admitted = subprocess.run([*SCRIBA, "shell", "--metadata", uri, "--tls-cert", c["cert"], "--tls-key",
                                   c["key"], "--tls-ca", c["ca"], *read],
                                  capture_output=True, text=True, timeout=120, cwd=elsewhere, env=env)
        assert admitted.returncode == 0 and admitted.stdout.startswith("0\t"), admitted.stdout + admitted.stderr
        ids = [b["bookie_id"] for b in doc["bookies"]]
        deadline = time.monotonic() + 60
        while not _probed_over_tls(doc["console"]["url"], doc["admin_tls"], ids):
            assert time.monotonic() < deadline, "the console never probed every bookie over TLS"
            time.sleep(0.5)
        with pytest.raises((ssl.SSLError, OSError)):  # no certificate, nor the CA: refused either way
            urllib.request.urlopen(doc["console"]["url"], timeout=10)
    finally:
        stopped = subprocess.run([*SCRIBA, "sandbox", "--stop"], capture_output=True, text=True, timeout=90,
                                 cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
