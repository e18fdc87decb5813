"""R20 on the bookie's ports: real bookie processes serving mutual TLS on 127.0.0.1.

Three bookies serve gRPC and HTTP with certificates from one test CA and allow-lists
(client: ``scriba-client``, bookie: ``scriba-bookie``, admin: ``scriba-admin``). The
admitted client writes and reads (the positive control of every refusal below); a
plaintext client, a client trusting another CA, a client without a certificate, a
client whose certificate is on no allow-list, and servers with an expired or
wrong-name certificate are all refused, each within its deadline, with a clear error,
and nothing they sent is written.
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from scriba.client import Client
from scriba.client.grpc_transport import GrpcBookieTransport
from scriba.client.transport import TransportConfig
from scriba.embedded.bookie import BookieProcess
from scriba.errors import ConfigError, UnauthorizedError, UnavailableError
from scriba.ids import BookieId
from scriba.testing.cluster import BookieCluster
from scriba.testing.pki import TestPki, tls_client_config
from scriba.tls import TlsConfig

DEADLINE_S = 5.0



@pytest.fixture(scope="module")
def tls_cluster(etcd_cluster: Any, pki: TestPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieCluster]:
    uri = str(etcd_cluster.uri(f"tls{uuid.uuid4().hex[:10]}"))
    cluster = BookieCluster(tmp_path_factory.mktemp("tls-bookies"), uri, tls=pki.server_tls())
    try:
        cluster.start_bookies(3, zones=["z1", "z2", "z3"])
        yield cluster
    finally:
        cluster.stop_all()


@pytest.fixture
async def good_client(tls_cluster: BookieCluster, pki: TestPki) -> AsyncIterator[Client]:
    async with Client.connect(tls_cluster.metadata_uri, config=tls_client_config(pki.client_tls(pki.client), DEADLINE_S)) as c:
        await c.registry.wait_for_bookies(3, 20.0)
        yield c


def transport(cluster: BookieCluster, tls: TlsConfig | None) -> GrpcBookieTransport:
    addresses = cluster.addresses()
    return GrpcBookieTransport(lambda b: addresses[b],
                               TransportConfig(add_timeout_s=DEADLINE_S, read_timeout_s=DEADLINE_S, tls=tls))


async def info_error(cluster: BookieCluster, tls: TlsConfig | None) -> Exception:
    t = transport(cluster, tls)
    try:
        with pytest.raises((UnavailableError, UnauthorizedError)) as caught:
            await asyncio.wait_for(t.bookie_info(BookieId(cluster[0].bookie_id)), DEADLINE_S * 2)
        return caught.value
    finally:
        await t.close()


async def test_tls_admitted_client_writes_and_reads(good_client: Client) -> None:
    w = await good_client.create_ledger(3, 3, 2, password=b"pw")
    assert await asyncio.gather(*(w.append_async(b"tls-%d" % i) for i in range(200))) == list(range(200))
    await w.close()
    r = await good_client.open_ledger(w.ledger_id, password=b"pw")
    assert [e.payload async for e in r.read()] == [b"tls-%d" % i for i in range(200)]


async def test_tls_plaintext_client_is_refused(tls_cluster: BookieCluster) -> None:
    err = await info_error(tls_cluster, None)
    assert isinstance(err, UnavailableError) and "without TLS" in str(err), err


async def test_tls_client_trusting_another_ca_is_refused(tls_cluster: BookieCluster, pki: TestPki) -> None:
    err = await info_error(tls_cluster, pki.client_tls(pki.client, ca=pki.stranger.ca))
    assert isinstance(err, UnavailableError) and "CERTIFICATE_VERIFY_FAILED" in str(err), err


async def test_tls_client_without_certificate_is_refused(tls_cluster: BookieCluster, pki: TestPki) -> None:
    err = await info_error(tls_cluster, pki.client_tls(None))
    assert isinstance(err, UnavailableError), err


async def test_tls_client_off_the_allow_list_is_refused_and_writes_nothing(
    tls_cluster: BookieCluster, pki: TestPki, good_client: Client
) -> None:
    err = await info_error(tls_cluster, pki.client_tls(pki.intruder))
    assert isinstance(err, UnauthorizedError)
    assert "intruder" in str(err) and "allow-list" in str(err), err
    async with Client.connect(tls_cluster.metadata_uri, config=tls_client_config(pki.client_tls(pki.intruder), DEADLINE_S)) as bad:
        await bad.registry.wait_for_bookies(3, 20.0)
        w = await bad.create_ledger(3, 3, 2, password=b"pw")  # metadata only: no bookie contacted
        with pytest.raises(UnauthorizedError):
            await asyncio.wait_for(w.append(b"must not land"), DEADLINE_S * 3)
    r = await good_client.open_ledger(w.ledger_id, password=b"pw")  # recovery: asks every bookie
    assert r.metadata.last_entry_id == -1


@pytest.mark.parametrize(("which", "reason"), [
    ("expired", "certificate has expired"),
    ("wrong_name", "Hostname Verification Check failed"),
    ("stranger", "CERTIFICATE_VERIFY_FAILED"),
])
async def test_tls_client_refuses_a_bad_server_certificate(
    which: str, reason: str, pki: TestPki, metadata_uri: str, tmp_path: Path
) -> None:
    bad = getattr(pki, which)
    bookie = BookieProcess(tmp_path / which, metadata_uri, tls=pki.server_tls(cert=bad))
    try:  # a verifying probe would refuse these too: wait for the port instead
        bookie.base_dir.mkdir(parents=True)
        bookie.process.argv = bookie.argv()
        bookie.process.start()
        bookie.process.wait_ready(lambda: _port_open(bookie.port), 30.0)
        cluster = BookieCluster(tmp_path, metadata_uri)
        cluster.bookies.append(bookie)
        err = await info_error(cluster, pki.client_tls(pki.client))
        assert isinstance(err, UnavailableError) and reason in str(err), err
    finally:
        bookie.stop()


def _port_open(port: int) -> bool:
    from scriba.embedded.process import port_open

    return port_open("127.0.0.1", port)


def test_tls_bad_cert_path_refuses_to_start(pki: TestPki, metadata_uri: str, tmp_path: Path) -> None:
    missing = TlsConfig(cert=tmp_path / "nope.crt", key=pki.server.key, ca=pki.ca.cert)
    bookie = BookieProcess(tmp_path / "b", metadata_uri, tls=missing)
    assert bookie.start_expect_exit() != 0
    assert f"tls.cert {tmp_path / 'nope.crt'}: no such file" in bookie.log_tail(), bookie.log_tail()
    mismatched = TlsConfig(cert=pki.server.cert, key=pki.client.key, ca=pki.ca.cert)
    bookie = BookieProcess(tmp_path / "c", metadata_uri, tls=mismatched)
    assert bookie.start_expect_exit() != 0
    assert "the key does not match the certificate" in bookie.log_tail(), bookie.log_tail()


def _https_get(url: str, pki: TestPki, who: Any) -> int:
    ctx = pki.client_tls(who).load().client_ssl_context()
    try:
        with urllib.request.urlopen(url, timeout=DEADLINE_S, context=ctx) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_tls_http_admin_only(tls_cluster: BookieCluster, pki: TestPki) -> None:
    url = f"https://{tls_cluster[0].http_address}/health"
    assert _https_get(url, pki, pki.admin) == 200  # positive control
    assert _https_get(url, pki, pki.client) == 403  # a client certificate, not an admin one
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        _https_get(url, pki, None)  # no certificate: the handshake fails
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"http://{tls_cluster[0].http_address}/health", timeout=DEADLINE_S)


def test_tls_config_validation_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tls\.key: required with tls\.cert"):
        TlsConfig(cert=tmp_path / "a.crt").validate()
    with pytest.raises(ConfigError, match=r"tls\.ca: required with require_client_cert"):
        TlsConfig(cert=tmp_path / "a", key=tmp_path / "b", require_client_cert=True).validate()


async def test_tls_binary_data_path_is_tls_with_the_same_allow_lists(
    tls_cluster: BookieCluster, pki: TestPki, good_client: Client
) -> None:
    """The binary data path of a TLS bookie: admitted clients' adds travel on it over
    TLS; a plaintext client gets no answer, a certificate on no allow-list UNAUTHORIZED."""
    from scriba.client.binary_transport import BinaryTransport
    from scriba.ids import LedgerId
    from scriba.testing.waiting import eventually
    from scriba.tls_socket import TlsSocketTransport

    w = await good_client.create_ledger(3, 3, 2, password=b"pw")
    assert await w.append(b"over binary tls") == 0
    t = good_client.transport
    assert isinstance(t, BinaryTransport)
    await eventually(lambda: {t.wire_of(b) for b in w.metadata.current_ensemble} == {"binary"}, 20.0,
                     what="every bookie of the ensemble reached over its binary link")
    # TLS on a non-blocking SSLSocket (scriba.tls_socket), not asyncio's sslproto
    assert all(isinstance(t._links[b]._transport, TlsSocketTransport) for b in w.metadata.current_ensemble)
    addresses, binary = tls_cluster.addresses(), tls_cluster.binary_addresses()
    b0 = BookieId(tls_cluster[0].bookie_id)
    for tls, refused in ((None, UnavailableError), (pki.client_tls(pki.intruder), UnauthorizedError)):
        bt = BinaryTransport(lambda b: addresses[b], TransportConfig(read_timeout_s=DEADLINE_S, tls=tls),
                             resolve_binary=lambda b: binary[b])
        try:
            with pytest.raises(refused):
                await asyncio.wait_for(bt.read_lac(b0, LedgerId(w.ledger_id)), DEADLINE_S * 2)
            assert bt.wire_of(b0) == "grpc" and bt.links_opened == 0
        finally:
            await bt.close()
    await w.close()
