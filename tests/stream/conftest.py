"""Fixtures of the stream tests on the public API (``stream_site.py``)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from stream_site import BOOKIES, CONFIG, Env


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    uri = f"memory://stream-{uuid.uuid4().hex[:10]}"
    e = Env(uri, BOOKIES, CONFIG)
    await e.start()
    try:
        yield e
    finally:
        await e.close()
