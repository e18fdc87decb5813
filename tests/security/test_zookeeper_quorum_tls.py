"""The embedded ZooKeeper ensemble's quorum and election ports over mutual TLS (``sslQuorum``).

Three members with the test CA's server certificate: they elect a leader and serve a
``zk+tls://`` store (the quorum works over TLS: the positive control), and every quorum
and election port that listens (the quorum port only on the leader) completes a
handshake with a member's certificate and refuses plaintext, no certificate and another
CA's certificate. ZooKeeper also checks the peer's name there (the member certificate
carries 127.0.0.1; a client certificate without it is refused). The client ports are
mutual TLS only: no plaintext client port listens (the launcher's ``srvr`` readiness
probe uses the secure port). (The probe's negative controls are in
``test_secure_defaults.py``.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from tls_probe import refusals

from scriba.embedded.process import port_open
from scriba.meta import connect
from scriba.testing.pki import TestPki

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def ensemble(pki: TestPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from scriba.embedded.zookeeper import ZooKeeperEnsemble

    zk = ZooKeeperEnsemble(tmp_path_factory.mktemp("zk-quorum-tls"), 3, tls=pki.server_tls())
    zk.start(timeout_s=120.0)
    try:
        yield zk
    finally:
        zk.stop()


async def _round_trip(uri: str) -> bytes:
    store = await connect(uri, connect_timeout_s=20)
    try:
        await store.create("k", b"through a TLS quorum")
        return (await store.get("k")).value
    finally:
        await store.close()


def test_quorum_and_election_ports_speak_only_mutual_tls(ensemble: Any, pki: TestPki) -> None:
    uri = ensemble.uri("quorumtls", cert=str(pki.client.cert), key=str(pki.client.key))
    assert asyncio.run(_round_trip(uri)) == b"through a TLS quorum"
    listening = [p for p in [*ensemble.quorum_ports, *ensemble.election_ports] if port_open("127.0.0.1", p)]
    assert len(listening) >= 4, listening  # three election ports and the leader's quorum port
    for port in listening:
        assert refusals(port, pki, good=pki.server) == [], port
    for port in ensemble.secure_ports:  # the client ports: mutual TLS, and no plaintext one beside them
        assert refusals(port, pki) == [], port
    assert not any(port_open("127.0.0.1", p) for _, p in ensemble.endpoints)
