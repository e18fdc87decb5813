"""The pipeline over mutual TLS: the data source's ``tls.*`` options and the jobs' ``tls``.

One bookie serving mutual TLS with the test CA's allow-lists; a namespace that fits it.
``export`` with the client certificate exports every record (the driver and the Spark
tasks each dial with it); the same export without it fails in its Spark task
(no bookie answers a plaintext client) and writes nothing; the options round-trip and a half-given certificate is a clear ConfigError.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scriba.client import Client, ClientConfig
from scriba.errors import ConfigError
from scriba.pipeline.jobs.export import export, read_export
from scriba.pipeline.plan import parse_options, tls_options
from scriba.stream import open_namespace
from scriba.testing.cluster import BookieCluster
from scriba.testing.pki import TestPki
from scriba.tls import TlsConfig

pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]'")
pytestmark = [pytest.mark.timeout(300)]
NAMESPACE = "tls-pipeline"
RECORDS = [b"tls-record-%d" % i for i in range(50)]


@pytest.fixture(scope="module")
def tls_uri(etcd_cluster: Any, pki: TestPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cluster = BookieCluster(tmp_path_factory.mktemp("tls-pipeline"), str(etcd_cluster.uri(f"tp{uuid.uuid4().hex[:8]}")),
                            tls=pki.server_tls())
    try:
        cluster.start_bookies(1)
        asyncio.run(_write(cluster.metadata_uri, pki.client_tls(pki.client)))
        yield cluster.metadata_uri
    finally:
        cluster.stop_all()


async def _write(uri: str, tls: TlsConfig) -> None:
    async with Client.connect(uri, config=ClientConfig(tls=tls)) as client:
        ns = await open_namespace(client, NAMESPACE, create=True, ensemble_size=1, write_quorum_size=1,
                                  ack_quorum_size=1)
        writer = await ns.open_writer("s", create=True)
        try:
            for payload in RECORDS:
                await writer.append(payload)
        finally:
            await writer.close()


def test_tls_options_round_trip_and_refuse_half_a_certificate(pki: TestPki) -> None:
    tls = TlsConfig(cert=pki.client.cert, key=pki.client.key, ca=pki.ca.cert, server_name="localhost")
    opts = parse_options({"metadata": "memory://x", "stream": "a/b", **tls_options(tls)})
    assert opts.tls == tls
    assert parse_options({"metadata": "memory://x", "stream": "a/b"}).tls is None  # no option: plaintext
    with pytest.raises(ConfigError, match=r"tls\.key"):
        parse_options({"metadata": "memory://x", "stream": "a/b", "tls.cert": str(pki.client.cert)})


def test_export_over_tls_and_refused_without(spark: Any, tls_uri: str, pki: TestPki, tmp_path: Path) -> None:
    refused_dir = tmp_path / "refused"
    # plaintext to TLS bookies: the task's reads find no bookie that answers (a PythonException
    # from Spark carrying the task's DeadlineExceededError: "bookie-0: UNAVAILABLE")
    with pytest.raises(Exception, match="bookie-0: UNAVAILABLE"):
        export(spark, tls_uri, refused_dir, streams=(f"{NAMESPACE}/s",))
    assert not (refused_dir / f"namespace={NAMESPACE}").exists()  # nothing written
    out = tmp_path / "export"
    report = export(spark, tls_uri, out, streams=(f"{NAMESPACE}/s",), tls=pki.client_tls(pki.client))
    assert report.records == len(RECORDS)
    assert sorted(bytes(r.payload) for r in read_export(spark, out).select("payload").collect()) == sorted(RECORDS)
