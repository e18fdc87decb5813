"""``scriba sandbox --tls``: the whole sandbox over mutual TLS with a throwaway CA.

etcd, the bookies and the console all require client certificates. ``scriba shell
simple-test`` next to the sandbox finds the client certificate in sandbox.json and
passes (the positive control); a read without a certificate fails (every bookie
UNAVAILABLE) and the same read with it succeeds; the console, reached with the admin certificate, probes every
bookie's HTTPS admin endpoint successfully (two probes in a row give a history sample).

With ``--with kv --with namenode`` the examples serve mutual TLS too: the etcdctl line the
sandbox prints (``--cacert --cert --key``), run as printed by Debian's unmodified
etcdctl, puts, and a get reads the value back; etcdctl in plaintext, and with the CA
but no certificate, is refused. HdfsCLI over HTTPS (a ``requests`` session carrying the
client certificate and trusting only the sandbox's CA) writes and reads a file; the same
client without a certificate, and plaintext HTTP, are refused.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import requests
from hdfs import InsecureClient

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


def _etcdctl(argv: list[str], timeout_s: int = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run([argv[0], "--dial-timeout=5s", f"--command-timeout={timeout_s}s", *argv[1:]],
                          capture_output=True, text=True, timeout=timeout_s + 60, env={**os.environ, "ETCDCTL_API": "3"})


def _kv_logs(data: Path, lines: int = 40) -> str:
    """The last lines of each KV replica's log: what a failed etcdctl call is read against."""
    return "".join(f"\n--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
                   for log in sorted((data / "kv").glob("*.log")))


def _webhdfs(urls: list[str], tls: dict[str, str], *, cert: bool) -> InsecureClient:
    session = requests.Session()
    session.trust_env = False  # REQUESTS_CA_BUNDLE would replace the sandbox's CA
    session.verify = tls["ca"]
    if cert:
        session.cert = (tls["cert"], tls["key"])
    return InsecureClient(";".join(urls), user="hdfs", session=session, timeout=30)


def test_sandbox_tls_with_kv_and_namenode(tmp_path: Path) -> None:
    data = tmp_path / "sb"
    started = subprocess.run([*SCRIBA, "sandbox", "--data", str(data), "--tls", "--bookies", "3", "--no-console",
                              "--no-autorecovery", "--with", "kv", "--with", "namenode", "--detach"],
                             capture_output=True, text=True, timeout=240)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        doc = json.loads((data / "sandbox.json").read_text())
        c = doc["client_tls"]
        assert f"--cert {c['cert']} --key {c['key']} --cacert {c['ca']}" in started.stdout, started.stdout
        printed = re.search(r"^kv: +(etcdctl .*)$", started.stdout, re.MULTILINE)
        assert printed is not None, started.stdout
        put = shlex.split(printed.group(1))
        assert put[-3:] == ["put", "hello", "world"] and "--cacert" in put, put
        done = _etcdctl(put)
        assert done.returncode == 0 and done.stdout.strip() == "OK", done.stdout + done.stderr + _kv_logs(data)
        got = _etcdctl([*put[:-3], "get", "hello", "--print-value-only"])
        assert got.returncode == 0 and got.stdout.strip() == "world", got.stdout + got.stderr + _kv_logs(data)
        endpoints = ["etcdctl", "--endpoints", ",".join(r["endpoint"] for r in doc["kv"])]
        for refused in ([], ["--cacert", c["ca"]]):  # plaintext; TLS without a client certificate
            done = _etcdctl([*endpoints, *refused, "put", "hello", "intruder"], timeout_s=3)
            assert done.returncode != 0 and "deadline exceeded" in done.stderr, done.stdout + done.stderr
        got = _etcdctl([*put[:-3], "get", "hello", "--print-value-only"])
        assert got.stdout.strip() == "world", got.stdout + got.stderr + _kv_logs(data)  # nothing written by the refused puts

        urls = [n["url"] for n in doc["namenodes"]]
        assert len(urls) == 3 and all(u.startswith("https://") for u in urls), urls
        hdfs = _webhdfs(urls[::-1], c, cert=True)
        hdfs.write("/tls/hello.txt", data=b"hello over mutual TLS")
        with hdfs.read("/tls/hello.txt") as reader:
            assert reader.read() == b"hello over mutual TLS"
        with pytest.raises(requests.exceptions.ConnectionError):  # the handshake ends without a certificate
            _webhdfs(urls, c, cert=False).status("/tls/hello.txt")
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(urls[0].replace("https://", "http://") + "/webhdfs/v1/tls?op=LISTSTATUS", timeout=10)
    finally:
        stopped = subprocess.run([*SCRIBA, "sandbox", "--stop", "--data", str(data)], capture_output=True,
                                 text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
