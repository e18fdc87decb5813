"""R4: SIGKILL a random bookie every 2 s during 10,000 appends (E3/W3/A2, one spare).

The killed bookie is restarted (same id, dirs, port) before the next kill, so at most
one of the four is down at a time and an ensemble can always be formed. Passes when
every confirmed entry is read back with its bytes (acked-set checker) and the
ledger's metadata shows the ensemble changes the kills forced.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from scriba.client import Client, ClientConfig
from scriba.testing.checkers.acked_set import check_acked_set

APPENDS = 10_000
WINDOW = 100  # appends in flight
RATE_PER_S = 900  # spread the appends over ~11 s so that several kills land mid-stream
KILL_INTERVAL_S = 2.0
PASSWORD = b"r4"


async def _killer(cluster: Any, stop: asyncio.Event, rng: random.Random, kills: list[str]) -> None:
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), KILL_INTERVAL_S)
            return
        except TimeoutError:
            pass
        victim = rng.randrange(len(cluster))
        bookie = cluster[victim]
        await asyncio.to_thread(bookie.kill)
        kills.append(bookie.bookie_id)
        await asyncio.to_thread(bookie.start, 30.0)  # back before the next kill


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_r4_kill_a_bookie_every_2s_loses_no_confirmed_entry(bookie_cluster: Any, metadata_uri: str) -> None:
    bookie_cluster.start_bookies(4)
    rng = random.Random(4)
    config = ClientConfig(add_timeout_s=3.0)
    async with Client.connect(metadata_uri, config=config) as client:
        writer = await client.create_ledger(3, 3, 2, password=PASSWORD)
        payloads = [f"r4-{i}".encode() for i in range(APPENDS)]
        acked: dict[int, bytes] = {}
        failures: list[str] = []
        stop = asyncio.Event()
        kills: list[str] = []
        killer = asyncio.create_task(_killer(bookie_cluster, stop, rng, kills))
        t0 = time.monotonic()
        try:
            for start in range(0, APPENDS, WINDOW):
                futures = [writer.append_async(p) for p in payloads[start : start + WINDOW]]
                results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 60)
                for payload, result in zip(payloads[start : start + WINDOW], results, strict=True):
                    if isinstance(result, BaseException):
                        failures.append(f"{type(result).__name__}: {result}")
                    else:
                        acked[int(result)] = payload
                if failures:
                    break
                pace = (start + WINDOW) / RATE_PER_S - (time.monotonic() - t0)
                if pace > 0:
                    await asyncio.sleep(pace)
        finally:
            stop.set()
            await killer
        assert not failures, f"appends failed: {failures[:3]} after {len(acked)} confirmed, kills {kills}"
        await writer.close()
        assert len(kills) >= 3, f"only {len(kills)} kills happened during the appends"

        reader = await client.open_ledger(writer.ledger_id, password=PASSWORD, recovery=False)
        metadata = reader.metadata
        read = [(e.entry_id, e.payload) async for e in reader.read(0, metadata.last_entry_id)]
    result = check_acked_set(
        attempted=list(enumerate(payloads)), acknowledged=list(acked.items()), read=read
    )
    assert result.ok, result.explain()
    assert len(acked) == APPENDS
    assert metadata.last_entry_id == APPENDS - 1
    assert len(metadata.ensembles) > 1, f"no ensemble change recorded despite kills {kills}"
    print(f"R4: {len(acked)} confirmed, 0 lost, {len(kills)} kills, {len(metadata.ensembles) - 1} ensemble changes")
    assert [first for first, _ in metadata.ensembles] == sorted(first for first, _ in metadata.ensembles)
