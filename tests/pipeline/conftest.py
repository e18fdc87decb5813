"""One SparkSession (local[2], loopback binds) for every pipeline test: a session costs 9-15 s."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]'")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from scriba.pipeline import local_session

    session = local_session("local[2]", "scriba-tests")
    try:
        yield session
    finally:
        session.stop()
