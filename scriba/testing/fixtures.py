"""Shared pytest fixtures (enabled by ``pytest_plugins = ["scriba.testing.fixtures"]``).

- ``etcd_cluster`` (session): one real single-member etcd for the whole run.
- ``metadata_uri`` (function): an etcd URI with a fresh prefix, so tests never share records.
- ``bookie_cluster`` (function): a :class:`~scriba.testing.cluster.BookieCluster` on
  ``metadata_uri``; ``bookie_cluster.start_bookies(3, zones=["z1", "z2", "z3"])``.
  Teardown stops only the bookies it started. When the test failed, their logs and
  data dirs are moved to ``$SCRIBA_KEEP_DIR`` (default ``/tmp/scriba-failed``), out of
  pytest's rotating tmp dirs, and the report says where.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from scriba.testing.cluster import BookieCluster


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"scriba_report_{report.when}", report)


def _failed(request: pytest.FixtureRequest) -> bool:
    node = request.node
    return any(
        getattr(getattr(node, f"scriba_report_{when}", None), "failed", False)
        for when in ("setup", "call")
    )


def _keep(directory: Path, test_name: str) -> Path:
    """Move a failed test's dirs out of pytest's rotating tmp dirs (``SCRIBA_KEEP_DIR``)."""
    root = Path(os.environ.get("SCRIBA_KEEP_DIR", Path(tempfile.gettempdir()) / "scriba-failed"))
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in test_name)[:100]
    dest = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-{uuid.uuid4().hex[:6]}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.move(str(directory), dest)
    except OSError:
        return directory  # keep it where it is
    return dest


@pytest.fixture(scope="session")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from scriba.embedded.etcd import EtcdCluster

    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd"), members=1)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A test CA and its certificates (``scriba.testing.pki.TestPki``), one per session."""
    from scriba.testing.pki import TestPki

    return TestPki.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def metadata_uri(etcd_cluster: Any) -> str:
    return str(etcd_cluster.uri(f"t{uuid.uuid4().hex[:12]}"))


@pytest.fixture
def bookie_cluster(
    request: pytest.FixtureRequest, metadata_uri: str, tmp_path: Path
) -> Iterator[BookieCluster]:
    cluster = BookieCluster(tmp_path / "bookies", metadata_uri)
    try:
        yield cluster
    finally:
        cluster.stop_all()
        if _failed(request) and cluster.bookies:
            for b in cluster.bookies:
                print(f"--- tail of {b.log_path} ---\n{b.log_tail(20)}")
            kept = _keep(cluster.base_dir, request.node.name)
            text = cluster.describe().replace(str(cluster.base_dir), str(kept))
            print(f"\n[scriba] test failed; logs and data kept under {kept}:\n{text}")
