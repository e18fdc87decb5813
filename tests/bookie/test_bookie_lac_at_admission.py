"""A bookie raises the LAC an entry carries when it admits the entry, before the entry's
journal write and fdatasync (as BookKeeper's ledger storage does on ``addEntry``): a
tailing reader's long poll answers while the fdatasync is still under way, and the add
itself is still acknowledged only once durable. A poll that wants entries with its
answer waits until the first is stored here.

The journal thread is held inside its fdatasync (``HeldSync``), so "the add is not yet
acknowledged" is a fact the test arranges, not a race.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from scriba.bookie.fileio import OsFileIO
from scriba.bookie.storage import open_storage
from scriba.bookie.storage_api import AddOp, StorageConfig
from scriba.entry import Crc32cDigest, pack_entry
from scriba.errors import Status

WAIT_S = 20.0
KEY = b"k" * 32
DIGEST = Crc32cDigest()
LEDGER = 5


class HeldSync(OsFileIO):
    """Holds the journal thread in its next fdatasync (once armed) until released."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def fdatasync(self, fd: int) -> None:
        if self.armed and threading.current_thread().name == "scriba-journal":
            self.armed = False
            self.entered.set()
            self.release.wait(WAIT_S)
        super().fdatasync(fd)


def add(entry_id: int, lac: int) -> AddOp:
    return AddOp(LEDGER, entry_id, KEY, pack_entry(DIGEST, LEDGER, entry_id, lac, 0, b"e%d" % entry_id))


async def test_a_long_poll_answers_with_a_carried_lac_before_the_carrying_entry_is_durable(tmp_path: Path) -> None:
    fio = HeldSync()
    config = StorageConfig(tmp_path / "journal", tmp_path / "ledgers", checkpoint_interval_s=3600,
                           journal_sync_inline_when_idle=False)  # every sync on the (held) journal thread
    storage = await open_storage(config, fileio=fio)
    try:
        assert await storage.add_batch([add(0, -1), add(1, 0)]) == [Status.OK, Status.OK]
        assert storage.lac_state(LEDGER).lac == 0
        poll = asyncio.ensure_future(storage.wait_lac(LEDGER, 0, WAIT_S))  # waits for LAC > 0
        fio.armed = True
        adding = asyncio.ensure_future(storage.add_batch([add(2, 1)]))  # carries LAC 1
        assert await asyncio.to_thread(fio.entered.wait, WAIT_S), "the journal never synced"
        state = await asyncio.wait_for(poll, WAIT_S)
        assert state.lac == 1, "the long poll did not see the LAC entry 2 carries"
        assert not adding.done(), "entry 2 was acknowledged before its fdatasync returned"
        assert state.last_entry_id == 1  # entry 2 is not stored (readable) yet
        fio.release.set()
        assert await asyncio.wait_for(adding, WAIT_S) == [Status.OK]
        assert storage.lac_state(LEDGER).last_entry_id == 2
    finally:
        fio.release.set()
        await storage.close()


async def test_a_long_poll_that_carries_entries_waits_until_the_first_is_stored_here(tmp_path: Path) -> None:
    """The LAC can pass an entry this bookie holds but has not made durable yet (entries 1
    and 2 in one held batch, 2 carrying LAC 1): a poll asking for entries
    (``entry=True``) answers once entry 1 is stored, so its answer carries it, rather
    than at once with nothing to carry (the reader would then read it from the replicas);
    a poll asking for the LAC alone answers at once."""
    fio = HeldSync()
    config = StorageConfig(tmp_path / "journal", tmp_path / "ledgers", checkpoint_interval_s=3600,
                           journal_sync_inline_when_idle=False)
    storage = await open_storage(config, fileio=fio)
    try:
        assert await storage.add_batch([add(0, -1)]) == [Status.OK]
        carrying = asyncio.ensure_future(storage.wait_lac(LEDGER, 0, WAIT_S, entry=True))
        fio.armed = True
        adding = asyncio.ensure_future(storage.add_batch([add(1, 0), add(2, 1)]))
        assert await asyncio.to_thread(fio.entered.wait, WAIT_S), "the journal never synced"
        lac_only = await asyncio.wait_for(storage.wait_lac(LEDGER, 0, WAIT_S), WAIT_S)
        assert (lac_only.lac, lac_only.last_entry_id) == (1, 0)
        assert not carrying.done(), "answered before entry 1 was stored (held in its fdatasync)"
        fio.release.set()
        state = await asyncio.wait_for(carrying, WAIT_S)
        assert state.lac == 1 and state.last_entry_id >= 1
        assert await asyncio.wait_for(adding, WAIT_S) == [Status.OK, Status.OK]
    finally:
        fio.release.set()
        await storage.close()


async def test_a_refused_entry_raises_no_lac(tmp_path: Path) -> None:
    """Only admitted entries count: one under another master key (UNAUTHORIZED) or sent
    to a fenced ledger carries no LAC in."""
    config = StorageConfig(tmp_path / "journal", tmp_path / "ledgers", checkpoint_interval_s=3600)
    storage = await open_storage(config)
    try:
        assert await storage.add_batch([add(0, -1)]) == [Status.OK]
        forged = AddOp(LEDGER, 1, b"x" * 32, pack_entry(DIGEST, LEDGER, 1, 0, 0, b"forged"))
        assert await storage.add_batch([forged]) == [Status.UNAUTHORIZED]
        assert storage.lac_state(LEDGER).lac == -1
        await storage.fence(LEDGER, KEY)
        assert await storage.add_batch([add(1, 0)]) == [Status.FENCED]
        assert storage.lac_state(LEDGER).lac == -1
    finally:
        await storage.close()
