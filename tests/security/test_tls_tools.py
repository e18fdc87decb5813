"""TLS flags of the command-line tools: stream verbs, ``rsm-status``, ``scriba geo``,
``scriba autorecovery run``.

Two clusters on 127.0.0.1 ("us": three bookies, "eu": one), every bookie serving mutual
TLS with the test CA's allow-lists (client ``scriba-client``, bookie ``scriba-bookie``,
admin ``scriba-admin``). Each tool run with the client certificate works (the positive
control); the same run without it, or trusting another CA, is refused. The processes
that serve ``/metrics`` (geo replicate, autorecovery run) serve it over HTTPS with the
admin allow-list: the admin certificate scrapes it, a certificate on no list gets 403,
plaintext and a client trusting another CA are refused at the handshake, and a TLS file
that does not load stops the process before it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from scriba.client import Client, ClientConfig
from scriba.embedded.bookie import tls_argv
from scriba.embedded.kvstore import KvCluster
from scriba.embedded.process import python_module_argv
from scriba.embedded.sandbox_children import start_child, stop_child
from scriba.stream import open_namespace
from scriba.testing.cluster import BookieCluster
from scriba.testing.pki import TestPki, https_get
from scriba.tls import Role, TlsConfig
from scriba.tls_cli import add_tls_arguments, client_tls_from_args, tls_from_args

pytestmark = [pytest.mark.timeout(300)]
NAMESPACE = "tools"
STREAM = "orders"
RECORDS = [f"record-{i}" for i in range(20)]
RSM_CONFIG = {"campaign_backoff_s": 0.1, "suspended_grace_s": 0.5, "propose_timeout_s": 20.0}
ONE_BOOKIE = {"ensemble_size": 1, "write_quorum_size": 1, "ack_quorum_size": 1}


@dataclass(frozen=True)
class Clusters:
    us: BookieCluster
    eu: BookieCluster


@pytest.fixture(scope="module")
def clusters(etcd_cluster: Any, pki: TestPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    tag = uuid.uuid4().hex[:8]
    us = BookieCluster(tmp_path_factory.mktemp("us"), str(etcd_cluster.uri(f"us{tag}")), tls=pki.server_tls())
    eu = BookieCluster(tmp_path_factory.mktemp("eu"), str(etcd_cluster.uri(f"eu{tag}")), tls=pki.server_tls())
    try:
        us.start_bookies(3)
        eu.start_bookies(1)
        yield Clusters(us, eu)
    finally:
        us.stop_all()
        eu.stop_all()


def scriba(cwd: Path, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``scriba ...`` as a process in ``cwd`` (no sandbox.json there: no certificate found)."""
    return subprocess.run(python_module_argv("scriba.cli", *argv), input=stdin, capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def shell(cwd: Path, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return scriba(cwd, "shell", *argv, stdin=stdin)


async def read_stream(uri: str, tls: TlsConfig, count: int, timeout_s: float = 90.0) -> list[str]:
    """The first ``count`` records of the stream, waiting (up to ``timeout_s``) for the
    stream to appear and fill."""
    async with Client.connect(uri, config=ClientConfig(tls=tls)) as client, asyncio.timeout(timeout_s):
        ns = await open_namespace(client, NAMESPACE)
        while STREAM not in await ns.list_streams():
            await asyncio.sleep(0.2)
        reader = await ns.open_reader(STREAM, "earliest")
        try:
            return [(await reader.__anext__()).payload.decode() for _ in range(count)]
        finally:
            await reader.close()


# --- the flags ---------------------------------------------------------------------------------


def test_client_half_of_server_flags_drops_allow_lists(pki: TestPki) -> None:
    parser = argparse.ArgumentParser()
    add_tls_arguments(parser, server=True, client=True)
    args = parser.parse_args([*tls_argv(pki.server_tls()), "--tls-server-name", "localhost"])
    served = tls_from_args(args)
    dialed = client_tls_from_args(args)
    assert served is not None and served.require_client_cert and served.allow[Role.ADMIN] == {"scriba-admin"}
    assert dialed == TlsConfig(cert=pki.server.cert, key=pki.server.key, ca=pki.ca.cert, server_name="localhost")
    assert client_tls_from_args(parser.parse_args([])) is None  # negative control: no flag, no TLS


# --- stream verbs ------------------------------------------------------------------------------


def test_stream_verbs_over_tls_and_refused_without(clusters: Clusters, pki: TestPki, tmp_path: Path) -> None:
    uri = clusters.us.metadata_uri
    flags = tls_argv(pki.client_tls(pki.client))
    appended = shell(tmp_path, "--metadata", uri, *flags, "stream-append", f"{NAMESPACE}/{STREAM}", "--create",
                     stdin="\n".join(RECORDS) + "\n")
    assert appended.returncode == 0, appended.stdout + appended.stderr
    tail = ["stream-tail", f"{NAMESPACE}/{STREAM}", "--count", str(len(RECORDS))]
    admitted = shell(tmp_path, "--metadata", uri, "--json", *flags, *tail)
    assert admitted.returncode == 0, admitted.stdout + admitted.stderr
    assert [row["payload"] for row in json.loads(admitted.stdout)] == RECORDS
    plaintext = shell(tmp_path, "--metadata", uri, *tail)
    assert plaintext.returncode == 1 and "UNAVAILABLE" in plaintext.stderr, plaintext.stdout + plaintext.stderr
    other_ca = shell(tmp_path, "--metadata", uri, *tls_argv(pki.client_tls(pki.client, ca=pki.stranger.cert)),
                     *tail)
    assert other_ca.returncode == 1 and not other_ca.stdout.strip(), other_ca.stdout + other_ca.stderr


# --- rsm-status: the shell dials the replicas' service ------------------------------------------


def test_rsm_status_asks_tls_replicas_with_the_certificate(clusters: Clusters, pki: TestPki, tmp_path: Path) -> None:
    kv = KvCluster(clusters.us.metadata_uri, tmp_path / "kv", replicas=1, rsm_config=RSM_CONFIG,
                   extra_args=tls_argv(pki.server_tls()))
    kv.start_all()
    try:
        status = ["--json", "rsm-status", "kv/store"]
        admitted = shell(tmp_path, "--metadata", clusters.us.metadata_uri, *tls_argv(pki.client_tls(pki.client)),
                         *status)
        assert admitted.returncode == 0, admitted.stdout + admitted.stderr
        members = json.loads(admitted.stdout)["members"]
        assert [m["answered"] for m in members] == [True], members
        plaintext = shell(tmp_path, "--metadata", clusters.us.metadata_uri, *status)  # the replica refuses it
        assert [m["answered"] for m in json.loads(plaintext.stdout)["members"]] == [False], plaintext.stdout
    finally:
        kv.stop_all()


# --- scriba geo --------------------------------------------------------------------------------


def test_geo_replicate_over_tls_with_https_metrics(clusters: Clusters, pki: TestPki, tmp_path: Path) -> None:
    asyncio.run(_source_with_records(clusters, pki))
    us, eu = clusters.us.metadata_uri, clusters.eu.metadata_uri
    served = pki.server_tls()  # the replicator's certificate: a bookie identity, SANs 127.0.0.1/localhost
    argv = python_module_argv("scriba.cli", "geo", "replicate", "--source", us, "--target", eu,
                              "--stream", f"{NAMESPACE}/{STREAM}", "--http", "127.0.0.1:0", *tls_argv(served))
    child, line = start_child(argv, tmp_path, "geo", lambda text: text if text.startswith("{") else None)
    try:
        url = json.loads(line)["metrics"]
        assert url.startswith("https://127.0.0.1:")
        assert asyncio.run(read_stream(eu, pki.client_tls(pki.client), len(RECORDS))) == RECORDS
        asyncio.run(_metrics_refusals(url, pki, "scriba_geo"))
    finally:
        stop_child(child)
    # translate dials both clusters: with the certificate it finds the positions, without it is refused
    translate = ["geo", "translate", "--source", us, "--target", eu, "--stream", f"{NAMESPACE}/{STREAM}", "0:0:0"]
    found = scriba(tmp_path, *translate, *tls_argv(pki.client_tls(pki.client)))
    assert found.returncode == 0, found.stdout + found.stderr
    assert json.loads(found.stdout)["positions"][0] is not None
    refused = scriba(tmp_path, *translate)
    assert refused.returncode == 1 and "UNAVAILABLE" in refused.stderr, refused.stdout + refused.stderr


async def _source_with_records(clusters: Clusters, pki: TestPki) -> None:
    """The target namespace fits its one bookie; the source stream holds RECORDS (the stream test's)."""
    tls = pki.client_tls(pki.client)
    async with Client.connect(clusters.eu.metadata_uri, config=ClientConfig(tls=tls)) as eu:
        await open_namespace(eu, NAMESPACE, create=True, **ONE_BOOKIE)
    async with Client.connect(clusters.us.metadata_uri, config=ClientConfig(tls=tls)) as us:
        ns = await open_namespace(us, NAMESPACE, create=True)
        if STREAM not in await ns.list_streams():  # this test alone: write them here
            writer = await ns.open_writer(STREAM, create=True)
            try:
                for record in RECORDS:
                    await writer.append(record.encode())
            finally:
                await writer.close()


async def _metrics_refusals(url: str, pki: TestPki, metric_prefix: str) -> None:
    status, body = await https_get(url, pki.client_tls(pki.admin))
    assert status == 200 and metric_prefix in body, (status, body[:200])
    status, body = await https_get(url, pki.client_tls(pki.intruder))  # signed by the CA, on no list
    assert status == 403 and "allow-list" in body, (status, body)
    status, _ = await https_get(url, pki.client_tls(pki.client))  # a client, not an admin
    assert status == 403
    with pytest.raises(aiohttp.ClientError):  # trusting another CA: the server's chain fails
        await https_get(url, pki.client_tls(pki.admin, ca=pki.stranger.cert))
    with pytest.raises(aiohttp.ClientError):  # no client certificate: the handshake fails
        await https_get(url, pki.client_tls(None))
    plain = url.replace("https://", "http://")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        with pytest.raises(aiohttp.ClientError):  # plaintext to the TLS port: no answer
            async with http.get(plain) as reply:
                await reply.read()


# --- scriba autorecovery run -----------------------------------------------------------------------


def test_autorecovery_metrics_over_tls(clusters: Clusters, pki: TestPki, tmp_path: Path) -> None:
    argv = python_module_argv("scriba.cli", "autorecovery", "--metadata", clusters.us.metadata_uri, "run",
                              "--no-worker", "--http", "127.0.0.1:0", *tls_argv(pki.server_tls()))
    child, line = start_child(argv, tmp_path, "autorecovery", lambda text: text if text.startswith("{") else None)
    try:
        url = json.loads(line)["metrics"]
        assert url.startswith("https://127.0.0.1:")
        asyncio.run(_metrics_refusals(url, pki, "scriba_autorecovery"))
    finally:
        stop_child(child)


def test_autorecovery_with_a_bad_tls_file_does_not_start(clusters: Clusters, pki: TestPki, tmp_path: Path) -> None:
    missing = tmp_path / "missing.crt"
    argv = python_module_argv("scriba.cli", "autorecovery", "--metadata", clusters.us.metadata_uri, "run",
                              "--http", "127.0.0.1:0", "--tls-cert", str(missing), "--tls-key",
                              str(pki.server.key), "--tls-ca", str(pki.ca.cert))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1 and f"tls.cert {missing}: no such file" in done.stderr, done.stderr
    assert '"metrics"' not in done.stdout  # it never listened
