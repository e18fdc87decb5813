"""In-process bookies for the asyncio client: ``InMemoryLedgerStorage`` behind a transport.

The in-memory twin of ``scriba.client.grpc_transport`` (as hashicorp/raft keeps
``InmemTransport`` beside its network transport): the real ``Client``, writers,
readers and recovery run against it in one process, no bookie processes, no sockets.

``StorageTransport`` implements ``BookieTransport`` over one in-memory storage per
bookie (the bookie's twin of the disk storage: same admission, fencing and
master-key rules), batching adds per bookie as the gRPC transport does. Knobs:
``down`` (bookies that answer UNAVAILABLE), ``add_delay_s`` (a slow bookie),
``corrupt`` (a bit flip at rest). ``register_bookies`` publishes their registrations
in a ``memory://`` store so a ``Client`` finds them::

    store = await scriba.meta.connect("memory://demo")
    await register_bookies(store, ["bk0", "bk1", "bk2"])
    transport = StorageTransport(["bk0", "bk1", "bk2"])
    async with Client.connect(store.uri, store=store, transport=transport) as client:
        writer = await client.create_ledger(3, 3, 2)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from scriba.bookie.memory_storage import InMemoryLedgerStorage
from scriba.bookie.storage_api import AddOp, long_poll_entries
from scriba.client.client import Client, ClientConfig
from scriba.client.transport import AddCallback, BookieInfo, LacResult
from scriba.errors import Status, UnavailableError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.connect import connect
from scriba.meta.records import BookieRegistration, bookie_key
from scriba.meta.store import MetadataStore


class StorageTransport:
    def __init__(self, bookie_ids: Iterable[str], *, add_timeout_s: float = 2.0) -> None:
        self.storages: dict[BookieId, InMemoryLedgerStorage] = {
            BookieId(b): InMemoryLedgerStorage() for b in bookie_ids
        }
        self.down: set[BookieId] = set()
        self.add_delay_s: dict[BookieId, float] = {}
        self.add_timeout_s = add_timeout_s
        self._queues: dict[BookieId, list[tuple[AddOp, AddCallback]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.adds = 0
        self.entry_reads = 0  # read_entry calls
        self.range_reads = 0  # read_range calls

    # --- adds ---------------------------------------------------------------------
    def add(
        self, bookie_id: BookieId, ledger_id: LedgerId, entry_id: EntryId, master_key: bytes,
        entry: bytes, on_response: AddCallback, *, recovery: bool = False,
    ) -> None:
        self.adds += 1
        queue = self._queues.get(bookie_id)
        if queue is None:
            queue = self._queues[bookie_id] = []
            task = asyncio.get_running_loop().create_task(self._flush(bookie_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        queue.append((AddOp(ledger_id, entry_id, master_key, entry, recovery), on_response))

    async def _flush(self, bookie_id: BookieId) -> None:
        await asyncio.sleep(0)
        batch = self._queues.pop(bookie_id)
        delay = self.add_delay_s.get(bookie_id, 0.0)
        if bookie_id in self.down or bookie_id not in self.storages:
            statuses = [Status.UNAVAILABLE] * len(batch)
        else:
            if delay:
                await asyncio.sleep(min(delay, self.add_timeout_s))
            if delay >= self.add_timeout_s:
                statuses = [Status.TIMEOUT] * len(batch)
            else:
                statuses = await self.storages[bookie_id].add_batch([op for op, _ in batch])
        for (op, callback), status in zip(batch, statuses, strict=True):
            callback(bookie_id, LedgerId(op.ledger_id), EntryId(op.entry_id), status)

    # --- reads --------------------------------------------------------------------
    def _storage(self, bookie_id: BookieId) -> InMemoryLedgerStorage:
        if bookie_id in self.down or bookie_id not in self.storages:
            raise UnavailableError(f"bookie {bookie_id} is down")
        return self.storages[bookie_id]

    async def read_entry(
        self, bookie_id: BookieId, ledger_id: LedgerId, entry_id: EntryId, *,
        fence: bool = False, master_key: bytes = b"", timeout_s: float | None = None,
    ) -> bytes:
        self.entry_reads += 1
        storage = self._storage(bookie_id)
        if fence:
            await storage.fence(ledger_id, master_key)
        await asyncio.sleep(0)
        return storage.read_entry(ledger_id, entry_id)

    async def read_range(
        self, bookie_id: BookieId, ledger_id: LedgerId, first_entry_id: EntryId,
        last_entry_id: EntryId, *, max_entries: int = 1024, max_bytes: int = 4 * 1024 * 1024,
        master_key: bytes = b"", timeout_s: float | None = None,
    ) -> list[bytes]:
        self.range_reads += 1
        storage = self._storage(bookie_id)
        await asyncio.sleep(0)
        return storage.read_range(ledger_id, first_entry_id, last_entry_id, max_entries, max_bytes)

    async def read_lac(
        self, bookie_id: BookieId, ledger_id: LedgerId, *, fence: bool = False,
        master_key: bytes = b"", timeout_s: float | None = None,
    ) -> LacResult:
        storage = self._storage(bookie_id)
        state = await storage.fence(ledger_id, master_key) if fence else storage.lac_state(ledger_id)
        last = b""
        if state.last_entry_id >= 0:
            last = storage.read_entry(ledger_id, state.last_entry_id)
        return LacResult(EntryId(state.lac), EntryId(state.last_entry_id), last, fenced=state.fenced)

    async def long_poll_lac(
        self, bookie_id: BookieId, ledger_id: LedgerId, previous_lac: EntryId, *,
        wait_s: float, piggyback_entries_max: int = 1, master_key: bytes = b"",
    ) -> LacResult:
        storage = self._storage(bookie_id)
        state = await storage.wait_lac(ledger_id, previous_lac, wait_s)
        entries = long_poll_entries(storage, ledger_id, previous_lac, state.lac, piggyback_entries_max, 1 << 20)
        return LacResult(EntryId(state.lac), EntryId(state.last_entry_id), fenced=state.fenced,
                         piggybacked_entries=tuple(entries))

    async def write_lac(
        self, bookie_id: BookieId, ledger_id: LedgerId, lac: EntryId, master_key: bytes,
        *, hint_only: bool = False,
    ) -> None:
        storage = self._storage(bookie_id)
        if hint_only:
            await asyncio.sleep(0)
            storage.note_lac(ledger_id, lac, master_key)
        else:
            await storage.write_lac(ledger_id, lac, master_key)

    async def bookie_info(self, bookie_id: BookieId, *, timeout_s: float | None = None) -> BookieInfo:
        storage = self._storage(bookie_id)
        free, total = storage.disk_usage()
        return BookieInfo(bookie_id, storage.read_only, free, total)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    # --- test hooks ----------------------------------------------------------------
    def corrupt(self, bookie_id: str, ledger_id: int, entry_id: int) -> None:
        """Flip a bit in one stored copy (as a bad disk would; the bookie still serves it)."""
        entries = self.storages[BookieId(bookie_id)]._entries[ledger_id]
        data = entries[entry_id]
        entries[entry_id] = data[:-1] + bytes([data[-1] ^ 0x01])


async def register_bookies(store: MetadataStore, bookie_ids: Iterable[str]) -> None:
    for i, b in enumerate(bookie_ids):
        registration = BookieRegistration(
            bookie_id=BookieId(b), address=f"memory:{b}", zone=f"zone{i % 3}", rack=f"rack{i}",
            free_bytes=1 << 40, total_bytes=1 << 40,
        )
        await store.create(bookie_key(b), registration.to_bytes(), ephemeral=True)



class InProcessSite:
    """A whole cluster in this process: ``memory://`` metadata and in-memory bookies, shared
    by simulated *processes*. Each :meth:`client` is one process (its own metadata session,
    the shared bookies); :meth:`crash` ends a process's session without closing anything
    cleanly (its locks and ephemerals go); :meth:`close` ends everything this site opened.

        site = InProcessSite(f"memory://t-{uuid.uuid4().hex}", ["bk0", "bk1", "bk2"])
        await site.start()
        client = await site.client()
    """

    def __init__(self, uri: str, bookie_ids: Iterable[str], config: ClientConfig | None = None) -> None:
        self.uri = uri
        self.bookie_ids = list(bookie_ids)
        self.transport = StorageTransport(self.bookie_ids)
        self.config = config
        self.stores: list[MetadataStore] = []
        self.clients: list[Client] = []

    async def start(self) -> None:
        """Register the bookies (their ephemerals live in a session held until close)."""
        store = await connect(self.uri)
        self.stores.append(store)
        await register_bookies(store, self.bookie_ids)

    async def client(self) -> Client:
        store = await connect(self.uri)
        self.stores.append(store)
        client = await Client.connect(self.uri, store=store, transport=self.transport, config=self.config)
        self.clients.append(client)
        return client

    async def crash(self, client: Client) -> None:
        await client.store.close()

    async def close(self) -> None:
        for c in self.clients:
            await c.close()
        for s in self.stores:
            await s.close()
        await self.transport.close()
