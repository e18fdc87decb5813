"""The pipeline tests' bookies; their SparkSession is the run-wide ``spark`` fixture (tests/conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]'")


@pytest.fixture(scope="session")
def uri(etcd_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """3 real bookie processes (zones z1..z3) on real etcd, shared by the pipeline tests."""
    from scriba.testing.cluster import BookieCluster

    metadata = str(etcd_cluster.uri(f"p{uuid.uuid4().hex[:8]}"))
    bookies = BookieCluster(tmp_path_factory.mktemp("bookies"), metadata)
    bookies.start_bookies(3, zones=["z1", "z2", "z3"])
    try:
        yield metadata
    finally:
        bookies.stop_all()
