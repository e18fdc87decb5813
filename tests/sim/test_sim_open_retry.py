"""``open_ledger(recovery=True)`` retries a recovery that failed retriably, and counts its attempts.

In-process bookies and ``memory://`` (``scriba.testing.sim``); the recovery driver is wrapped so a
test decides how each attempt ends, and every attempt is counted: a test passes only if
the number of attempts is the one the retry policy promises.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

import scriba.meta
from scriba.client import Client, ClientConfig
from scriba.client import client as client_module
from scriba.client.driver import DriverConfig
from scriba.errors import ScribaError, UnauthorizedError, UnavailableError
from scriba.meta.records import LedgerState
from scriba.testing.sim import StorageTransport, register_bookies

BOOKIES = [f"bk{i}" for i in range(3)]
CONFIG = ClientConfig(
    add_timeout_s=2.0, bookie_wait_s=2.0, recovery_attempts_max=3, recovery_retry_s=0.01,
    driver=DriverConfig(read_timeout_s=2.0, metadata_timeout_s=5.0, long_poll_s=0.2),
)


@dataclass
class Attempts:
    """Wraps ``recover_ledger``: attempt n raises ``errors[n]`` (after recovering, if asked)."""

    errors: list[ScribaError | None]
    recover_first: bool = False
    count: int = 0

    def wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        async def recover(*args: Any, **kwargs: Any) -> Any:
            n, self.count = self.count, self.count + 1
            error = self.errors[n] if n < len(self.errors) else None
            if error is None:
                return await real(*args, **kwargs)
            if self.recover_first:
                await real(*args, **kwargs)  # it did recover; only the answer is lost
            raise error

        return recover


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    store = await scriba.meta.connect(f"memory://open-retry-{uuid.uuid4().hex[:10]}")
    await register_bookies(store, BOOKIES)
    transport = StorageTransport(BOOKIES)
    c = await Client.connect(store.uri, store=store, transport=transport, config=CONFIG)
    try:
        yield c
    finally:
        await c.close()
        await transport.close()
        await store.close()


async def open_ledger(client: Client, attempts: Attempts, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A ledger left open by its writer (2 entries), then opened with recovery."""
    w = await client.create_ledger(3, 3, 2)
    for payload in (b"a", b"b"):
        await w.append(payload)
    monkeypatch.setattr(client_module, "recover_ledger", attempts.wrap(client_module.recover_ledger))
    return await client.open_ledger(w.ledger_id)


async def test_a_recovery_that_failed_retriably_is_tried_again(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts = Attempts([UnavailableError("bookie down")])
    r = await open_ledger(client, attempts, monkeypatch)
    assert attempts.count == 2
    assert r.metadata.state is LedgerState.CLOSED and r.metadata.last_entry_id == 1


async def test_a_non_retriable_failure_is_raised_after_one_attempt(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts = Attempts([UnauthorizedError("wrong key")])
    with pytest.raises(UnauthorizedError):
        await open_ledger(client, attempts, monkeypatch)
    assert attempts.count == 1


async def test_retries_stop_at_recovery_attempts_max(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    attempts = Attempts([UnavailableError(f"down {i}") for i in range(10)])
    with pytest.raises(UnavailableError, match="down 2"):
        await open_ledger(client, attempts, monkeypatch)
    assert attempts.count == CONFIG.recovery_attempts_max


async def test_a_retry_starts_from_a_fresh_read_and_stops_if_the_ledger_was_closed(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts = Attempts([UnavailableError("answer lost")], recover_first=True)
    r = await open_ledger(client, attempts, monkeypatch)
    assert attempts.count == 1  # the re-read found it CLOSED: no second recovery
    assert r.metadata.state is LedgerState.CLOSED and r.metadata.last_entry_id == 1
