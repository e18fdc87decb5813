"""R21 on the TLS ports: seeded garbage, truncated and mangled handshakes, oversized
records and oversized frames inside TLS, against every port of the mutual-TLS deployment
(``tls_deployment.PORTS``). Every server must stay up and keep serving a good client.

Cases (``CASES`` in CI, 100,000 with ``SCRIBA_SOAK=1``; ``SCRIBA_FUZZ_SEED`` replays a run),
spread round-robin over the ports, each on its own connection, sent and closed without
waiting for an answer (a server that waits for the rest of a record must not hold the
fuzzer up; the held-connection case below covers waiting):

- random bytes (1..4096);
- a real ClientHello cut at a random point;
- a real ClientHello with random bytes flipped;
- a TLS record header claiming the largest length, then a little garbage;
- after a completed mutual-TLS handshake (the good client certificate): random bytes,
  a 4-byte length prefix near 2^32, the HTTP/2 preface with a frame claiming 16 MiB - 1, an
  HTTP request with a 1 MiB header line.

Then, while ``HELD`` connections per port sit on half a ClientHello, every port still
completes a good handshake and refuses bad ones (``tls_probe.refusals``); afterwards every
process is alive, a ledger written and read over TLS comes back whole, and the console
and autorecovery answer ``/metrics``/``/`` to the admin certificate.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import ssl
import struct
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from tls_deployment import PORTS, Deployment, start_deployment
from tls_probe import refusals

from scriba.client import Client, ClientConfig
from scriba.testing.pki import TestPki, https_get

pytestmark = [pytest.mark.timeout(600)]
SOAK = os.environ.get("SCRIBA_SOAK") == "1"
CASES = 100_000 if SOAK else 2_000
SEED = int(os.environ.get("SCRIBA_FUZZ_SEED", "2126"))
HELD = 8  # half-open handshakes held per port while the good client is served
CONNECT_TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def deployment(pki: TestPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with start_deployment(pki, tmp_path_factory.mktemp("fuzz")) as d:
        yield d


def client_hello() -> bytes:
    """The first flight of a real TLS client (a ClientHello record)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def good_context(pki: TestPki) -> ssl.SSLContext:
    ctx = pki.client_tls(pki.client).load().client_ssl_context()
    ctx.check_hostname = False
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    return ctx


def send_raw(port: int, data: bytes) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT_S) as s:
        try:
            s.sendall(data)
        except OSError:
            return False  # the server closed first: fine
    return True


def send_inside_tls(port: int, ctx: ssl.SSLContext, data: bytes) -> bool:
    """Whether the handshake completed and ``data`` went out inside TLS."""
    with socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT_S) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(data)
        except (OSError, ssl.SSLError):
            return False  # refused or closed by the server: fine
    return True


Case = Callable[[int], bool]  # True: the bytes were sent (inside TLS for the tls- cases)


def cases(rng: random.Random, hello: bytes, ctx: ssl.SSLContext) -> list[tuple[str, Case]]:
    def garbage(port: int) -> bool:
        return send_raw(port, rng.randbytes(rng.randint(1, 4096)))

    def truncated_hello(port: int) -> bool:
        return send_raw(port, hello[: rng.randint(1, len(hello) - 1)])

    def mangled_hello(port: int) -> bool:
        data = bytearray(hello)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return send_raw(port, bytes(data))

    def oversized_record(port: int) -> bool:
        return send_raw(port, b"\x16\x03\x03\xff\xff" + rng.randbytes(rng.randint(0, 512)))

    def tls_garbage(port: int) -> bool:
        return send_inside_tls(port, ctx, rng.randbytes(rng.randint(1, 4096)))

    def tls_oversized_frame(port: int) -> bool:
        return send_inside_tls(port, ctx, struct.pack(">I", rng.randint(2**31, 2**32 - 1)) + rng.randbytes(64))

    def tls_h2_huge_frame(port: int) -> bool:
        frame = (2**24 - 1).to_bytes(3, "big") + b"\x00\x00\x00\x00\x00\x01"  # DATA, stream 1, 16 MiB
        return send_inside_tls(port, ctx, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame + rng.randbytes(256))

    def tls_huge_header(port: int) -> bool:
        return send_inside_tls(port, ctx, b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * (1024 * 1024) + b"\r\n\r\n")

    raw: list[tuple[str, Case]] = [("garbage", garbage), ("truncated-hello", truncated_hello),
                                   ("mangled-hello", mangled_hello), ("oversized-record", oversized_record)]
    inside: list[tuple[str, Case]] = [("tls-garbage", tls_garbage), ("tls-oversized-frame", tls_oversized_frame),
                                      ("tls-h2-huge-frame", tls_h2_huge_frame), ("tls-huge-header", tls_huge_header)]
    return raw * 3 + inside  # handshakes cost more: a quarter of the cases complete one


def run_cases(ports: list[tuple[str, int]], count: int, rng: random.Random,
              kinds: list[tuple[str, Case]]) -> tuple[list[str], Counter[str]]:
    """``count`` cases round-robin over ``ports``: (the failures, the cases per kind whose
    bytes were delivered)."""
    failures: list[str] = []
    ran: Counter[str] = Counter()
    for i in range(count):
        name, port = ports[i % len(ports)]
        kind, case = rng.choice(kinds)
        try:
            ran[kind] += case(port)
        except OSError as exc:  # connecting failed: the server is gone or stopped accepting
            failures.append(f"case {i} ({kind}) on {name} port {port}: {exc!r} (seed {SEED})")
    return failures, ran


def test_tls_ports_survive_fuzzing_and_keep_serving(deployment: Deployment, pki: TestPki) -> None:
    rng = random.Random(SEED)
    kinds = cases(rng, client_hello(), good_context(pki))
    ports = [(row.name, port) for row in PORTS for port in row.find(deployment)]
    pids = deployment.pids()
    failures, ran = run_cases(ports, CASES, rng, kinds)
    assert failures == [], failures[:5]
    # every kind was delivered (the tls- ones past a completed mutual-TLS handshake), not refused early
    assert all(ran[k] > 0 for k, _ in kinds), ran
    dead = [pid for pid in pids if not os.path.exists(f"/proc/{pid}")]
    assert not dead, f"processes gone after {CASES} cases (seed {SEED}): {dead}"
    held = [_half_handshake(port) for _, port in ports for _ in range(HELD)]
    try:
        for name, port in ports:  # serving while half-open handshakes are held
            assert refusals(port, pki) == [], f"{name} on {port} after fuzzing (seed {SEED})"
    finally:
        for s in held:
            s.close()
    asyncio.run(_still_serving(deployment, pki))


def test_fuzzer_reports_a_port_that_is_gone(pki: TestPki) -> None:
    """Negative control: a port nobody listens on fails every case."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        rng = random.Random(SEED)
        failures, _ = run_cases([("nothing", port)], 20, rng, cases(rng, client_hello(), good_context(pki)))
    assert len(failures) == 20 and "ConnectionRefusedError" in failures[0], failures[:2]


def _half_handshake(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT_S)
    hello = client_hello()
    s.sendall(hello[: len(hello) // 2])
    return s


async def _still_serving(d: Deployment, pki: TestPki) -> None:
    async with Client.connect(d.bookies.metadata_uri, config=ClientConfig(tls=pki.client_tls(pki.client))) as c:
        writer = await c.create_ledger(3, 3, 2, password=b"fuzz")
        payloads = [b"after-fuzz-%d" % i for i in range(50)]
        assert await asyncio.gather(*(writer.append_async(p) for p in payloads)) == list(range(50))
        await writer.close()
        reader = await c.open_ledger(writer.ledger_id, password=b"fuzz")
        assert [bytes(e.payload) async for e in reader.read()] == payloads
    admin = pki.client_tls(pki.admin)
    status, body = await https_get(f"https://127.0.0.1:{d.ports['autorecovery']}/metrics", admin)
    assert status == 200 and "scriba_autorecovery" in body
    status, _ = await https_get(f"https://127.0.0.1:{d.ports['console']}/", admin)
    assert status == 200
