"""R20 on reads: a bookie serves a password-protected ledger's entries only to a caller
that sends the ledger's master key, or whose certificate is on the admin allow-list.

One real bookie process serving mutual TLS (gRPC and the binary data path, allow-lists
client ``scriba-client``, admin ``scriba-admin``) holds two ledgers written through the
client: one with a password, one without. On each wire, every read kind (entry, range,
LAC, long poll) of the protected ledger is refused UNAUTHORIZED (not retriable, within
its deadline) to an admitted client that sends no key or a wrong one, and served to one
that sends the right key (the positive control) and to the admin without any key. The
ledger without a password reads without a key, as before, and the client's own reader
(open, read, tail) works unchanged.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from scriba.client import Client
from scriba.client.binary_transport import BinaryTransport
from scriba.client.grpc_transport import GrpcBookieTransport
from scriba.client.transport import TransportConfig
from scriba.entry import master_key
from scriba.errors import UnauthorizedError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.testing.cluster import BookieCluster
from scriba.testing.pki import TestPki, tls_client_config
from scriba.tls import TlsConfig

DEADLINE_S = 5.0
PASSWORD = b"read-guard-pw"
ENTRIES = 5


@dataclass(frozen=True)
class Ledgers:
    protected: LedgerId
    open: LedgerId
    bookie: BookieId



@pytest.fixture(scope="module")
def guarded_cluster(etcd_cluster: Any, pki: TestPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieCluster]:
    uri = str(etcd_cluster.uri(f"readauth{uuid.uuid4().hex[:10]}"))
    cluster = BookieCluster(tmp_path_factory.mktemp("read-guard"), uri, tls=pki.server_tls())
    try:
        cluster.start_bookies(1)
        yield cluster
    finally:
        cluster.stop_all()


@pytest.fixture
async def ledgers(guarded_cluster: BookieCluster, pki: TestPki) -> AsyncIterator[Ledgers]:
    async with Client.connect(guarded_cluster.metadata_uri, config=tls_client_config(pki.client_tls(pki.client), DEADLINE_S)) as c:
        await c.registry.wait_for_bookies(1, 20.0)
        ids = []
        for password in (PASSWORD, b""):
            w = await c.create_ledger(1, 1, 1, password=password)
            await asyncio.gather(*(w.append(b"e-%d" % i) for i in range(ENTRIES)))
            ids.append(w.ledger_id)  # left open: its LAC on the bookie is ENTRIES - 2 or more (a push)
        yield Ledgers(LedgerId(ids[0]), LedgerId(ids[1]), BookieId(guarded_cluster[0].bookie_id))


def _transport(cluster: BookieCluster, tls: TlsConfig, wire: str) -> GrpcBookieTransport:
    grpc_addresses = cluster.addresses()
    config = TransportConfig(add_timeout_s=DEADLINE_S, read_timeout_s=DEADLINE_S, tls=tls)
    if wire == "grpc":
        return GrpcBookieTransport(lambda b: grpc_addresses[b], config)
    binary = cluster.binary_addresses()
    return BinaryTransport(lambda b: grpc_addresses[b], config, resolve_binary=lambda b: binary[b])


def _reads(t: GrpcBookieTransport, b: BookieId, lid: LedgerId, key: bytes) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Every read kind of ``lid`` on ``b`` with ``key`` (b"": none sent)."""
    return {
        "entry": lambda: t.read_entry(b, lid, EntryId(0), master_key=key),
        "range": lambda: t.read_range(b, lid, EntryId(0), EntryId(ENTRIES - 2), master_key=key),
        "lac": lambda: t.read_lac(b, lid, master_key=key),
        "long_poll": lambda: t.long_poll_lac(b, lid, EntryId(-1), wait_s=1.0, master_key=key),
    }


async def _all_served(t: GrpcBookieTransport, b: BookieId, lid: LedgerId, key: bytes) -> None:
    reads = _reads(t, b, lid, key)
    assert len(await asyncio.wait_for(reads["entry"](), DEADLINE_S * 2)) > 0
    assert len(await asyncio.wait_for(reads["range"](), DEADLINE_S * 2)) == ENTRIES - 1
    assert (await asyncio.wait_for(reads["lac"](), DEADLINE_S * 2)).lac >= ENTRIES - 2
    polled = await asyncio.wait_for(reads["long_poll"](), DEADLINE_S * 2)
    assert polled.lac >= ENTRIES - 2 and polled.piggybacked_entries


async def _all_refused(t: GrpcBookieTransport, b: BookieId, lid: LedgerId, key: bytes, why: str) -> None:
    for kind, read in _reads(t, b, lid, key).items():
        with pytest.raises(UnauthorizedError) as caught:
            await asyncio.wait_for(read(), DEADLINE_S * 2)  # refused at once: no hang
        err = caught.value
        assert not err.retriable, kind
        assert f"ledger {lid} has a password" in str(err) and why in str(err), (kind, str(err))
        assert PASSWORD.decode() not in str(err)


@pytest.mark.parametrize("wire", ["grpc", "binary"])
async def test_protected_ledger_reads_need_the_key_or_an_admin(
    wire: str, guarded_cluster: BookieCluster, pki: TestPki, ledgers: Ledgers
) -> None:
    b = ledgers.bookie
    client = _transport(guarded_cluster, pki.client_tls(pki.client), wire)
    admin = _transport(guarded_cluster, pki.client_tls(pki.admin), wire)
    try:
        await _all_refused(client, b, ledgers.protected, b"", "no master key was sent")
        await _all_refused(client, b, ledgers.protected, master_key(b"not-the-password"), "does not match")
        await _all_served(client, b, ledgers.protected, master_key(PASSWORD))  # the positive control
        await _all_served(admin, b, ledgers.protected, b"")  # the admin identity, no key
        await _all_served(client, b, ledgers.open, b"")  # no password: open to every admitted client
        for t in (client, admin):
            if isinstance(t, BinaryTransport):
                assert t.wire_of(b) == "binary", "the reads went over the binary link"
    finally:
        await client.close()
        await admin.close()


async def test_the_client_reader_sends_the_key(guarded_cluster: BookieCluster, pki: TestPki, ledgers: Ledgers) -> None:
    """Open, read and tail a protected ledger through the client (binary links): every
    read it makes carries the ledger's master key."""
    async with Client.connect(guarded_cluster.metadata_uri, config=tls_client_config(pki.client_tls(pki.client), DEADLINE_S)) as c:
        await c.registry.wait_for_bookies(1, 20.0)
        reader = await c.open_ledger(ledgers.protected, password=PASSWORD, recovery=False)
        got = [e.payload async for e in reader.read(0, ENTRIES - 2)]
        assert got == [b"e-%d" % i for i in range(ENTRIES - 1)]
        assert await asyncio.wait_for(reader.read_last_add_confirmed(), DEADLINE_S * 2) >= ENTRIES - 2
        writer = await c.create_ledger(1, 1, 1, password=PASSWORD)
        tail = await c.open_ledger(writer.ledger_id, password=PASSWORD, recovery=False)
        await writer.append(b"first")
        await writer.append(b"second")  # confirms the first: the tail (long polls) sees it
        entries = tail.tail()
        try:
            first = await asyncio.wait_for(anext(entries), DEADLINE_S * 4)
        finally:
            await entries.aclose()
        assert first.payload == b"first"
        await writer.close()
        recovered = await c.open_ledger(ledgers.protected, password=PASSWORD)  # fence + recovery reads
        assert recovered.metadata.last_entry_id == ENTRIES - 1
