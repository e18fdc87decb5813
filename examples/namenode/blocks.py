"""File data in ledgers: a block is one ledger of fixed-size entries, closed when full.

    writer = BlockWriter(client, replication=3, block_size=64 << 20)
    async for chunk in body: await writer.write(chunk)
    blocks = await writer.finish()           # [Block(ledger_id, length, crc32c, entry_bytes)]
    async for piece in read_range(client, blocks, offset, length): ...
    await block_locations(client, blocks, offset, length)   # WebHDFS BlockLocation objects

A block's ledger has ensemble = write quorum = ``min(replication, 3)`` bookies and ack
quorum ``min(2, write quorum)``: HDFS's replication is the ledger's write quorum.
Entries are ``entry_bytes`` long (the last may be short), so the entry holding a byte
offset is ``offset // entry_bytes`` — OPEN with an offset reads only what it needs.
Appends are pipelined (``append_async``) and awaited when the block closes; only a
closed block (every entry confirmed, the ledger closed) is named in an edit record.
The block's CRC32C covers its bytes in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Final

import google_crc32c

from scriba.client import Client, LedgerWriter
from scriba.errors import ScribaError
from scriba.examples.namenode.edits import Block

ENTRY_BYTES: Final = 256 * 1024
PASSWORD: Final = b"scriba-namenode"
INFLIGHT_ENTRIES_MAX: Final = 64


def quorums(replication: int) -> tuple[int, int, int]:
    write = max(1, min(replication, 3))
    return write, write, min(2, write)


class BlockWriter:
    def __init__(self, client: Client, *, replication: int, block_size: int,
                 entry_bytes: int = ENTRY_BYTES) -> None:
        self.client = client
        self.replication = replication
        self.block_size = max(block_size, 1)
        self.entry_bytes = min(entry_bytes, self.block_size)
        self._ledger: LedgerWriter | None = None
        self._pending: list[asyncio.Future[int]] = []
        self._buffer = bytearray()
        self._block_bytes = 0
        self._crc = 0

    async def write(self, data: bytes) -> list[Block]:
        """Buffer ``data``; returns the blocks that closed meanwhile (to record now)."""
        self._buffer += data
        closed: list[Block] = []
        while len(self._buffer) >= self.entry_bytes:
            room = min(self.entry_bytes, self.block_size - self._block_bytes)
            block = await self._append(bytes(self._buffer[:room]))
            del self._buffer[:room]
            if block is not None:
                closed.append(block)
        return closed

    async def finish(self) -> list[Block]:
        """Write what is buffered and close the open block; the blocks closed by this call."""
        closed: list[Block] = []
        while self._buffer:
            room = min(self.entry_bytes, self.block_size - self._block_bytes, len(self._buffer))
            block = await self._append(bytes(self._buffer[:room]))
            del self._buffer[:room]
            if block is not None:
                closed.append(block)
        if self._ledger is not None:
            closed.append(await self._close())
        return closed

    async def abort(self) -> None:
        if self._ledger is not None:
            ledger, self._ledger = self._ledger, None
            await ledger.abort()

    async def _append(self, payload: bytes) -> Block | None:
        if self._ledger is None:
            ensemble, write, ack = quorums(self.replication)
            self._ledger = await self.client.create_ledger(ensemble, write, ack, password=PASSWORD,
                                                           custom_metadata={"application": "scriba-namenode"})
        self._pending.append(self._ledger.append_async(payload))
        if len(self._pending) >= INFLIGHT_ENTRIES_MAX:
            await asyncio.gather(*self._pending)
            self._pending.clear()
        self._crc = google_crc32c.extend(self._crc, payload)
        self._block_bytes += len(payload)
        if self._block_bytes >= self.block_size:
            return await self._close()
        return None

    async def _close(self) -> Block:
        assert self._ledger is not None
        ledger, self._ledger = self._ledger, None
        await asyncio.gather(*self._pending)
        self._pending.clear()
        await ledger.close()
        block = Block(int(ledger.ledger_id), self._block_bytes, self._crc, self.entry_bytes)
        self._block_bytes, self._crc = 0, 0
        return block


async def read_range(client: Client, blocks: list[Block], offset: int, length: int) -> AsyncIterator[bytes]:
    """The file's bytes ``[offset, offset + length)`` across its blocks, in order."""
    start = 0
    end = offset + length
    for block in blocks:
        block_end = start + block.length_bytes
        if block_end > offset and start < end and block.length_bytes > 0:
            lo, hi = max(offset, start) - start, min(end, block_end) - start  # within the block
            first, last = lo // block.entry_bytes, (hi - 1) // block.entry_bytes
            reader = await client.open_ledger(block.ledger_id, PASSWORD, recovery=False)
            try:
                async for entry in reader.read(first, last):
                    base = entry.entry_id * block.entry_bytes
                    yield entry.payload[max(lo - base, 0):hi - base]
            finally:
                await reader.close()
        start = block_end
        if start >= end:
            return


async def block_locations(client: Client, blocks: list[Block], offset: int, length: int) -> list[dict[str, Any]]:
    """WebHDFS ``BlockLocation`` objects of the blocks overlapping ``[offset, offset + length)``:
    a block's hosts are the bookies of its ledger's last ensemble (where its entries are read)."""
    out: list[dict[str, Any]] = []
    start = 0
    for block in blocks:
        end = start + block.length_bytes
        if end > offset and start < offset + length:
            metadata = await client.ledger_metadata(block.ledger_id)
            bookies = list(metadata.ensembles[-1][1])
            names = [_address(client, b) for b in bookies]
            registrations = client.registry.registrations
            paths = [f"/{r.region}/{r.zone}/{r.rack}/{name}" if (r := registrations.get(b)) else f"/default/{name}"
                     for b, name in zip(bookies, names, strict=True)]
            out.append({"offset": start, "length": block.length_bytes, "corrupt": False,
                        "hosts": [n.rpartition(":")[0] for n in names], "names": names,
                        "topologyPaths": paths, "cachedHosts": [], "storageIds": [str(b) for b in bookies],
                        "storageTypes": ["DISK"] * len(bookies)})
        start = end
    return out


def _address(client: Client, bookie: Any) -> str:
    try:
        return client.registry.address(bookie)
    except ScribaError:
        return f"{bookie}:0"
