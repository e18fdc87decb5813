"""Bad input to ``scriba.meta.connect``: malformed URIs, unknown schemes, unreachable servers."""

from __future__ import annotations

import importlib.util
import re
import time

import pytest

from scriba.embedded.process import free_port
from scriba.errors import ConfigError, MetadataUnavailableError
from scriba.meta import connect
from scriba.meta.uri import parse_uri


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("", "expected SCHEME://"),
        ("etcd", "expected SCHEME://"),
        ("127.0.0.1:2379/x", "expected SCHEME://"),
        ("http://127.0.0.1:2379/x", "unknown metadata scheme 'http'"),
        ("mysql://db/x", "unknown metadata scheme 'mysql'"),
        ("memory://", "needs a name"),
        ("etcd://", "no host"),
        ("etcd:///prefix", "no host"),
        ("etcd://127.0.0.1:2379", "needs a prefix"),
        ("etcd://127.0.0.1:2379/", "needs a prefix"),
        ("etcd://127.0.0.1:notaport/x", "not a number"),
        ("etcd://127.0.0.1:70000/x", "out of range"),
        ("etcd://:2379/x", "missing host"),
        ("etcd://127.0.0.1:2379/a//b", "empty path segment"),
        ("zk://127.0.0.1:2181", "needs a prefix"),
        ("zk://127.0.0.1:x/s", "not a number"),
    ],
)
async def test_malformed_uris_fail_with_a_config_error_that_says_why(uri: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        await connect(uri)


def test_good_uris_parse_into_hosts_and_prefix() -> None:
    parsed = parse_uri("etcd://127.0.0.1:2379,localhost:2380/a/b")
    assert parsed.hosts == (("127.0.0.1", 2379), ("localhost", 2380)) and parsed.path == "a/b"
    assert parse_uri("etcd://10.0.0.1/x").hosts == (("10.0.0.1", 2379),)
    assert parse_uri("zk://10.0.0.1/x").hosts == (("10.0.0.1", 2181),)
    assert parse_uri("memory://unit").path == "unit"


def _zk_built() -> bool:
    return importlib.util.find_spec("scriba.meta.zookeeper") is not None


@pytest.mark.parametrize("scheme", ["etcd", "zk"])
async def test_unreachable_server_fails_within_the_connect_timeout_naming_the_address(scheme: str) -> None:
    if scheme == "zk" and not _zk_built():
        pytest.skip("zk driver not built yet")
    port = free_port()  # nothing listens there
    start = time.monotonic()
    with pytest.raises(MetadataUnavailableError, match=re.escape(f"127.0.0.1:{port}")):
        await connect(f"{scheme}://127.0.0.1:{port}/x", connect_timeout_s=1.0)
    assert time.monotonic() - start < 5.0


async def test_unresolvable_etcd_host_is_a_clear_error() -> None:
    with pytest.raises(MetadataUnavailableError, match=r"no-such-host\.invalid"):
        await connect("etcd://no-such-host.invalid:2379/x", connect_timeout_s=1.0)
