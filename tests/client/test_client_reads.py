"""Catch-up reads through the public Client API against real bookie processes (packed
range reads from entry logs), with bits flipped at rest on two of three replicas (R9)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from scriba.bookie import entry_log as el
from scriba.bookie.storage import open_storage
from scriba.bookie.storage_api import StorageConfig
from scriba.client import Client, ClientConfig
from scriba.client.driver import DriverConfig
from scriba.embedded.bookie import BookieProcess
from scriba.testing.diskfaults import flip_bit

CONFIG = ClientConfig(
    add_timeout_s=5.0, bookie_wait_s=20.0,
    driver=DriverConfig(read_timeout_s=5.0, metadata_timeout_s=10.0, long_poll_s=0.5),
)
ENTRIES = 3000
# each corrupted entry keeps one good replica; each bookie is bad for two of the three
# entries, so whichever bookie the reader tries first, it must fall back at least twice
CORRUPT = {100: (0, 1), 1500: (1, 2), 2999: (0, 2)}


async def corrupt_at_rest(bookie: BookieProcess, ledger_id: int, entry_ids: list[int]) -> None:
    """Flip one payload bit of each entry in the stopped bookie's entry logs."""
    config = StorageConfig(bookie.journal_dir / "journal", bookie.data_dir / "ledgers", checkpoint_interval_s=3600)
    storage = await open_storage(config)
    try:
        locations = [storage._index.get(ledger_id, e) for e in entry_ids]
    finally:
        await storage.close()
    for loc in locations:
        assert loc is not None, "the entry was expected in an entry log"
        log_id, offset, length = loc
        flip_bit(Path(config.ledger_dir) / "entrylogs" / f"{log_id:08x}{el.SUFFIX}", offset + el.REC_HEADER_SIZE + length - 1)


async def test_catch_up_read_takes_entries_corrupt_at_rest_from_another_replica(bookie_cluster: Any) -> None:
    bookies = bookie_cluster.start_bookies(3)
    rng = random.Random(23)
    payloads = [rng.randbytes(rng.randrange(50, 1200)) for _ in range(ENTRIES)]
    async with Client.connect(bookie_cluster.metadata_uri, config=CONFIG) as client:
        await client.registry.wait_for_bookies(3, 20.0)
        writer = await client.create_ledger(3, 3, 2, password=b"pw")
        assert await asyncio.gather(*map(writer.append_async, payloads)) == list(range(ENTRIES))
        await writer.close()
        ledger_id = int(writer.ledger_id)
    for index, bookie in enumerate(bookies):  # a graceful stop checkpoints: entries in entry logs
        bookie.stop()
        await corrupt_at_rest(bookie, ledger_id, [e for e, bad in CORRUPT.items() if index in bad])
        bookie.start()
    async with Client.connect(bookie_cluster.metadata_uri, config=CONFIG) as client:
        await client.registry.wait_for_bookies(3, 20.0)
        reader = await client.open_ledger(ledger_id, password=b"pw")
        for first in (0, 1400):
            got = [e async for e in reader.read(first)]
            assert [e.entry_id for e in got] == list(range(first, ENTRIES))
            assert [e.payload for e in got] == payloads[first:], "a corrupt payload was returned"
