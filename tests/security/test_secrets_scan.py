"""R20's secrets scan: a real TLS deployment used with a ledger password leaves neither
the password nor any private key in its logs, metrics, ``--json`` output or bookie data.

The deployment: three bookies serving mutual TLS (their logs, data directories and
HTTPS ``/metrics``), ``scriba autorecovery run`` (its log and HTTPS ``/metrics``), a
client process writing, reading and recovering a password-protected HMAC ledger at
debug level, and the shell's ``--json`` verbs over that ledger (``read-ledger`` given
the password). Every form :mod:`scriba.testing.secrets_scan` knows (raw, hex, base64 at
each alignment) of the password and of every private key's PEM body is searched for.
The negative control writes a leak of each kind into files the scan reads and the
scan must name exactly those.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from scriba.embedded.bookie import tls_argv
from scriba.embedded.process import python_module_argv
from scriba.embedded.sandbox_children import start_child, stop_child
from scriba.testing.cluster import BookieCluster
from scriba.testing.pki import TestPki
from scriba.testing.secrets_scan import Leak, pem_secrets, read_sources, scan, secret_forms

pytestmark = [pytest.mark.timeout(300)]

CLIENT_SCRIPT = """
import asyncio, sys
from pathlib import Path
from scriba.client import Client, ClientConfig
from scriba.log import configure
from scriba.tls import TlsConfig

async def main():
    configure(level="debug")
    uri, password, cert, key, ca = sys.argv[1], sys.argv[2].encode(), *map(Path, sys.argv[3:6])
    config = ClientConfig(tls=TlsConfig(cert=cert, key=key, ca=ca))
    async with Client.connect(uri, config=config) as c:
        w = await c.create_ledger(3, 3, 2, password=password, digest="hmac-sha256")
        for i in range(20):
            await w.append(b"entry-%d" % i)
        r = await c.open_ledger(w.ledger_id, password=password)  # fences and recovers w
        print("read", len([e async for e in r.read()]))
        print("ledger", w.ledger_id)

asyncio.run(main())
"""


def _run_together(cwd: Path, commands: dict[str, list[str]]) -> dict[str, tuple[str, str]]:
    """Run every command at once (each a process started in ``cwd``); each one's (stdout,
    stderr) once all have ended, each asserted to have succeeded."""
    children = {name: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                       cwd=cwd, text=True) for name, argv in commands.items()}
    outputs: dict[str, tuple[str, str]] = {}
    try:
        for name, child in children.items():
            out, err = child.communicate(timeout=120)
            assert child.returncode == 0, (name, out, err)
            outputs[name] = (out, err)
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.communicate()
    return outputs


def test_scan_finds_each_form_and_nothing_in_clean_text() -> None:
    """The scanner alone: every form it promises is found, at any offset inside other
    text and other base64; near misses are not."""
    secret = b"R20-unit-secret-\x00\xff-42"
    assert scan({"clean": b"nothing here " + secret[:-1].hex().encode()}, {"pw": secret}) == []
    for form, text in secret_forms(secret).items():
        assert scan({"src": b"x" * 7 + text + b"y"}, {"pw": secret}) == [Leak("src", "pw", form)], form
    for prefix in (b"", b"a", b"ab"):  # inside a longer base64 text, at each alignment
        blob = b"<" + base64.b64encode(prefix + secret + b"tail") + b">"
        assert [leak.secret for leak in scan({"b": blob}, {"pw": secret})] == ["pw"], prefix


def test_no_secret_in_logs_metrics_json_or_data(etcd_cluster: Any, pki: TestPki, tmp_path: Path) -> None:
    password = f"R20-ledger-password-{uuid.uuid4().hex}"
    uri = str(etcd_cluster.uri(f"r20scan{uuid.uuid4().hex[:8]}"))
    cluster = BookieCluster(tmp_path / "bookies", uri, tls=pki.server_tls())
    client_flags = tls_argv(pki.client_tls(pki.client))
    admin = pki.client_tls(pki.admin)
    texts: dict[str, bytes] = {}
    recovery: subprocess.Popen[bytes] | None = None
    try:
        cluster.start_bookies(3)
        client = subprocess.Popen([sys.executable, "-c", CLIENT_SCRIPT, uri, password, str(pki.client.cert),
                                   str(pki.client.key), str(pki.ca.cert)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=tmp_path, text=True)
        argv = python_module_argv("scriba.cli", "autorecovery", "--metadata", uri, "run", "--http", "127.0.0.1:0",
                                  *tls_argv(pki.server_tls()))
        try:  # autorecovery starts while the client writes
            recovery, line = start_child(argv, tmp_path, "autorecovery",
                                         lambda text: text if text.startswith("{") else None)
        finally:
            out, err = client.communicate(timeout=120)
        assert client.returncode == 0 and "read 20" in out, out + err
        texts["client stdout"], texts["client stderr"] = out.encode(), err.encode()
        ledger_id = out.split("ledger ")[1].split()[0]
        shell = python_module_argv("scriba.cli", "shell", "--metadata", uri, "--json", *client_flags)
        verbs = _run_together(tmp_path, {"read-ledger": [*shell, "read-ledger", ledger_id, "--password", password],
                                         "ledger-metadata": [*shell, "ledger-metadata", ledger_id]})
        for name, (out, err) in verbs.items():
            texts[f"{name} --json"], texts[f"{name} stderr"] = out.encode(), err.encode()
        assert [row["payload"] for row in json.loads(verbs["read-ledger"][0])] == [f"entry-{i}" for i in range(20)]
        assert json.loads(verbs["ledger-metadata"][0])["password_stored"] is True  # stored, never shown
        urls = [f"https://{b.http_address}/metrics" for b in cluster.bookies] + [json.loads(line)["metrics"]]
        context = admin.load().client_ssl_context()
        for url in urls:
            # blocking and closed on return (an event loop per GET closed its SSL sockets late)
            with urllib.request.urlopen(url, context=context, timeout=10) as reply:
                status, body = reply.status, reply.read().decode()
            assert status == 200 and "# TYPE" in body, (url, status, body[:200])
            texts[url] = body.encode()
    finally:
        if recovery is not None:
            stop_child(recovery)
        cluster.stop_all()  # logs complete and flushed before they are read

    secrets = {"password": password.encode()}
    pem_lines: set[str] = set()
    for who in ("ca", "server", "client", "admin"):
        parts = pem_secrets(f"{who} key", getattr(pki, who).key.read_bytes())
        secrets.update(parts)
        pem_lines.update(name for name in parts if " line " in name)

    def sources() -> dict[str, bytes]:
        """What the run left: the texts taken, every bookie file, every log file."""
        return {**texts, **read_sources([b.base_dir for b in cluster.bookies], ["*"]),
                **read_sources([tmp_path], ["*.log"])}

    found = sources()
    assert len([p for p in found if p.endswith("bookie.log")]) == 3 and any("autorecovery.log" in p for p in found)
    assert any("journal" in p for p in found)  # the bookies' data was read too
    assert b"ledger_created" in texts["client stderr"] + texts["client stdout"]  # the debug log was seen
    assert any(b"scriba_autorecovery" in body for url, body in texts.items() if url.startswith("https"))
    assert scan(found, secrets, raw_only=pem_lines) == []

    # negative control: a leak of each kind, written into sources the scan reads
    bookie_log = cluster.bookies[0].log_path
    with bookie_log.open("a") as f:
        f.write(json.dumps({"event": "oops", "password": password}) + "\n")
    key_line = sorted(pem_lines)[0]
    texts[urls[0]] += b"\n# " + secrets[key_line] + b"\n"
    texts["ledger-metadata --json"] += base64.b64encode(b"pw=" + password.encode())
    leaks = scan(sources(), secrets, raw_only=pem_lines)
    assert {(leak.source, leak.secret) for leak in leaks} == {
        (str(bookie_log), "password"), (urls[0], key_line), ("ledger-metadata --json", "password")
    }, leaks
