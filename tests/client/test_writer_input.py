"""Bad input to a ledger writer (#23 A1, A2): wrong payload types and oversized payloads.

Every append entry point (``append``, ``append_async``, ``append_callback``,
``SyncLedgerWriter.append`` and ``append_many``) checks its payload before anything changes: a bytes-like payload is
copied into bytes, anything else is a ``TypeError`` naming the type, and a payload whose
packed entry exceeds the bookies' advertised ``entry_size_max`` is an
``EntryTooLargeError`` naming both sizes. Afterwards the writer goes on: the next append
gets the next entry id and ``close()`` returns.

In-process bookies (``InMemoryLedgerStorage``, the bookie's own admission rules behind a
minimal transport) and ``memory://``; ``test_writer_limits_bookie.py`` repeats the
oversized case on real bookie processes.
"""

from __future__ import annotations

import array
import asyncio
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest

import scriba.meta
from scriba.bookie.memory_storage import InMemoryLedgerStorage
from scriba.bookie.storage_api import AddOp
from scriba.client import Client, ClientConfig
from scriba.client.driver import DriverConfig
from scriba.client.sync import SyncLedgerWriter, _LoopThread
from scriba.client.transport import AddCallback
from scriba.client.write_core import WriteConfig
from scriba.client.writer import LedgerWriter, as_payload
from scriba.entry import ENTRY_SIZE_MAX_DEFAULT, HEADER_SIZE, make_digest, unpack_entry
from scriba.errors import BadRequestError, EntryTooLargeError, NoSuchLedgerError, ScribaError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.records import BookieRegistration, bookie_key
from scriba.meta.store import MetadataStore
from scriba.testing.waiting import eventually

BOOKIES = ("bk0", "bk1", "bk2", "bk3")
CONFIG = ClientConfig(
    add_timeout_s=2.0, bookie_wait_s=2.0,
    driver=DriverConfig(read_timeout_s=2.0, metadata_timeout_s=5.0, explicit_lac_delay_s=None),
)
NOT_BYTES_LIKE = [None, "text", 12, 1.5, ["a"], object()]
CRC32C_OVERHEAD = HEADER_SIZE + 4


class MemoryBookies:
    """``add()`` over one ``InMemoryLedgerStorage`` per bookie, answered on a later loop turn."""

    def __init__(self, bookie_ids: Iterable[str], entry_size_max: int) -> None:
        self.storages = {
            BookieId(b): InMemoryLedgerStorage(entry_size_max=entry_size_max) for b in bookie_ids
        }
        self.adds: list[tuple[BookieId, int, int]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def add(
        self, bookie_id: BookieId, ledger_id: LedgerId, entry_id: EntryId, master_key: bytes,
        entry: bytes, on_response: AddCallback, *, recovery: bool = False,
    ) -> None:
        self.adds.append((bookie_id, ledger_id, entry_id))
        op = AddOp(ledger_id, entry_id, master_key, entry, recovery)
        task = asyncio.get_running_loop().create_task(self._add(bookie_id, op, on_response))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _add(self, bookie_id: BookieId, op: AddOp, on_response: AddCallback) -> None:
        (status,) = await self.storages[bookie_id].add_batch([op])
        on_response(bookie_id, LedgerId(op.ledger_id), EntryId(op.entry_id), status)

    async def write_lac(self, bookie_id: BookieId, ledger_id: LedgerId, lac: EntryId, master_key: bytes) -> None:
        await self.storages[bookie_id].write_lac(ledger_id, lac, master_key)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def payloads(self, ledger_id: int) -> list[bytes]:
        """The payloads the ledger's bookies store, in entry order (digests checked; the
        ledgers here have E = Qw, so every bookie of the ensemble holds every entry)."""
        digest = make_digest("crc32c", b"")
        copies = set()
        for storage in self.storages.values():
            try:
                last = storage.lac_state(ledger_id).last_entry_id
            except NoSuchLedgerError:
                continue
            copies.add(tuple(
                unpack_entry(digest, storage.read_entry(ledger_id, e)).payload for e in range(last + 1)
            ))
        (payloads,) = copies
        return list(payloads)


async def registered(store: MetadataStore, limits: dict[str, int]) -> None:
    for i, (b, limit) in enumerate(limits.items()):
        record = BookieRegistration(
            bookie_id=BookieId(b), address=f"memory:{b}", zone=f"z{i % 3}", entry_size_max=limit,
        )
        await store.create(bookie_key(b), record.to_bytes(), ephemeral=True)


class Env:
    def __init__(self, client: Client, bookies: MemoryBookies) -> None:
        self.client = client
        self.bookies = bookies

    async def writer(self) -> LedgerWriter:
        return await self.client.create_ledger(3, 3, 2)


async def open_env(limit: int = ENTRY_SIZE_MAX_DEFAULT) -> tuple[Env, MetadataStore]:
    store = await scriba.meta.connect(f"memory://writer-{uuid.uuid4().hex[:10]}")
    await registered(store, dict.fromkeys(BOOKIES, limit))
    bookies = MemoryBookies(BOOKIES, limit)
    client = await Client.connect(store.uri, store=store, transport=bookies, config=CONFIG)  # type: ignore[arg-type]
    await client.registry.wait_for_bookies(len(BOOKIES), 5.0)
    return Env(client, bookies), store


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    the_env, store = await open_env()
    try:
        yield the_env
    finally:
        await the_env.client.close()
        await the_env.bookies.close()
        await store.close()


async def closes_with(w: LedgerWriter, payloads: list[bytes], env: Env) -> None:
    """The writer still works: close returns and the ledger holds exactly ``payloads``."""
    await asyncio.wait_for(w.close(), 10)
    md = await env.client.ledger_metadata(w.ledger_id)
    assert md.is_closed and md.last_entry_id == len(payloads) - 1
    assert md.length == sum(map(len, payloads)) == w.length
    assert env.bookies.payloads(w.ledger_id) == payloads


# --- A1: payload types --------------------------------------------------------------


def test_as_payload_error_names_the_type() -> None:
    for bad in NOT_BYTES_LIKE:
        with pytest.raises(TypeError) as info:
            as_payload(bad)
        assert str(info.value) == (
            "ledger append: expected a bytes-like payload (bytes, bytearray, memoryview), "
            f"got {type(bad).__name__}"
        )
    raw = b"already bytes"
    assert as_payload(raw) is raw  # the hot path: no copy


@pytest.mark.parametrize("bad", NOT_BYTES_LIKE, ids=lambda b: type(b).__name__)
async def test_append_of_a_non_bytes_payload_raises_and_the_writer_goes_on(env: Env, bad: Any) -> None:
    w = await env.writer()
    assert await w.append(b"before") == 0
    adds = len(env.bookies.adds)
    with pytest.raises(TypeError, match=f"expected a bytes-like payload .*got {type(bad).__name__}$"):
        await w.append(bad)
    with pytest.raises(TypeError, match=f"got {type(bad).__name__}$"):
        w.append_async(bad)
    with pytest.raises(TypeError, match=f"got {type(bad).__name__}$"):
        w.append_callback(bad, lambda entry_id, error: None)
    with pytest.raises(TypeError, match=f"got {type(bad).__name__}$"):
        w.check_payload(bad)
    assert len(env.bookies.adds) == adds and w.pending == 0
    # The next append gets the next id (no entry was half-assigned) and confirms.
    assert await asyncio.wait_for(w.append(b"after"), 10) == 1
    assert await asyncio.wait_for(w.append_async(b"async"), 10) == 2
    await closes_with(w, [b"before", b"after", b"async"], env)


def bytes_like_cases() -> list[tuple[str, Any, bytes]]:
    ints = array.array("i", [1, 2, 3])
    return [
        ("bytearray", bytearray(b"from a bytearray"), b"from a bytearray"),
        ("memoryview", memoryview(b"from a memoryview"), b"from a memoryview"),
        ("memoryview-slice", memoryview(b"0123456789")[2:8], b"234567"),
        ("strided", memoryview(b"a-b-c-d")[::2], b"abcd"),
        ("array", ints, ints.tobytes()),
        ("empty-bytearray", bytearray(), b""),
    ]


@pytest.mark.parametrize(("payload", "expected"), [c[1:] for c in bytes_like_cases()],
                         ids=[c[0] for c in bytes_like_cases()])
async def test_bytes_like_payloads_are_accepted(env: Env, payload: Any, expected: bytes) -> None:
    w = await env.writer()
    assert await w.append(payload) == 0
    assert await w.append_async(payload) == 1
    await closes_with(w, [expected, expected], env)


async def test_a_mutable_payload_is_copied_before_the_call_returns(env: Env) -> None:
    w = await env.writer()
    buffer = bytearray(b"original")
    futures = [w.append_async(buffer)]
    buffer[:] = b"changed!"  # the caller reuses its buffer at once
    futures.append(w.append_async(memoryview(buffer)))
    buffer[:] = b"third..."
    assert await asyncio.gather(*futures) == [0, 1]
    await closes_with(w, [b"original", b"changed!"], env)


async def bounded_client(the_env: Env, store: MetadataStore, entries_inflight_max: int) -> Client:
    """A second client on ``the_env``'s bookies whose writers hold at most
    ``entries_inflight_max`` entries in flight (later appends wait in the writer)."""
    return await Client.connect(
        store.uri, store=store, transport=the_env.bookies,  # type: ignore[arg-type]
        config=ClientConfig(
            add_timeout_s=2.0, bookie_wait_s=2.0,
            driver=DriverConfig(explicit_lac_delay_s=None),
            write=WriteConfig(entries_inflight_max=entries_inflight_max),
        ),
    )


async def test_appends_waiting_for_room_hold_a_copy() -> None:
    """Past the in-flight bound appends wait in the writer: they too keep a copy."""
    the_env, store = await open_env()
    client = await bounded_client(the_env, store, 1)
    try:
        w = await client.create_ledger(3, 3, 2)
        buffer = bytearray(b"A")
        futures = []
        for letter in b"ABCD":
            buffer[0] = letter
            futures.append(w.append_async(buffer))
        assert w.pending == 4
        buffer[0] = ord("Z")
        assert await asyncio.gather(*futures) == [0, 1, 2, 3]
        await w.close()
        assert the_env.bookies.payloads(w.ledger_id) == [b"A", b"B", b"C", b"D"]
    finally:
        await client.close()
        await the_env.client.close()
        await store.close()


def test_sync_writer_checks_payloads_before_appending() -> None:
    """``SyncLedgerWriter``: the same errors, raised in the caller's thread; ``append_many``
    refuses the whole list when one payload is bad."""
    runner = _LoopThread()
    try:

        async def make() -> tuple[Env, MetadataStore, LedgerWriter]:
            e, s = await open_env()
            return e, s, await e.writer()

        sync_env, store, writer = runner.call(make(), 10)
        w = SyncLedgerWriter(runner, writer, 10)
        adds = len(sync_env.bookies.adds)
        for bad in ("text", None, 3):
            with pytest.raises(TypeError, match=f"got {type(bad).__name__}$"):
                w.append(bad)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match=f"got {type(bad).__name__}$"):
                w.append_many([b"fine", bad])  # type: ignore[list-item]
        assert len(sync_env.bookies.adds) == adds
        assert w.append(bytearray(b"one")) == 0
        assert w.append_many([b"two", memoryview(b"three")]) == [1, 2]
        with pytest.raises(EntryTooLargeError):
            w.append_many([b"four", b"x" * ENTRY_SIZE_MAX_DEFAULT])
        assert len(sync_env.bookies.adds) == adds + 3 * 3
        assert w.append(b"four") == 3
        w.close()

        async def check() -> list[bytes]:
            payloads = sync_env.bookies.payloads(writer.ledger_id)
            await sync_env.client.close()
            await store.close()
            return payloads

        assert runner.call(check(), 10) == [b"one", b"two", b"three", b"four"]
    finally:
        runner.stop()


# --- A2: payloads over the bookies' limit ---------------------------------------------


async def test_limit_is_the_smallest_a_registered_bookie_advertises() -> None:
    store = await scriba.meta.connect(f"memory://limits-{uuid.uuid4().hex[:10]}")
    bookies = MemoryBookies(BOOKIES, ENTRY_SIZE_MAX_DEFAULT)
    try:
        async with Client.connect(store.uri, store=store, transport=bookies, config=CONFIG) as client:  # type: ignore[arg-type]
            assert client.registry.entry_size_max == ENTRY_SIZE_MAX_DEFAULT  # none registered
            await registered(store, {"bk0": 4096, "bk1": 1024, "bk2": 8192})
            await client.registry.wait_for_bookies(3, 5.0)
            assert client.registry.entry_size_max == 1024
            await store.delete(bookie_key("bk1"))
            await eventually(lambda: client.registry.entry_size_max == 4096, 5,
                             what="the entry size bound follows the remaining bookies")
    finally:
        await store.close()


async def test_oversized_payload_is_refused_before_anything_is_sent() -> None:
    limit = 4096
    env, store = await open_env(limit)
    try:
        w = await env.writer()
        assert env.client.registry.entry_size_max == limit
        assert w.payload_bytes_max == limit - CRC32C_OVERHEAD
        largest = b"m" * w.payload_bytes_max
        assert await w.append(largest) == 0  # exactly at the limit: accepted by the bookies
        adds = len(env.bookies.adds)
        def by_callback(payload: bytearray) -> None:
            w.append_callback(payload, lambda entry_id, error: None)

        for call in (w.append, w.append_async, by_callback, w.check_payload):
            with pytest.raises(EntryTooLargeError) as info:
                result = call(bytearray(largest + b"!"))
                if asyncio.iscoroutine(result):
                    await result
            assert str(info.value) == (
                f"ledger {w.ledger_id}: payload of {limit - CRC32C_OVERHEAD + 1} bytes exceeds the "
                f"limit of {limit - CRC32C_OVERHEAD} bytes (the bookies' entry_size_max of {limit} "
                f"bytes less {CRC32C_OVERHEAD} bytes of header and digest); nothing was written"
            )
            assert not info.value.retriable and isinstance(info.value, ScribaError | ValueError)
        assert len(env.bookies.adds) == adds and w.pending == 0
        assert await w.append(b"next") == 1
        await closes_with(w, [largest, b"next"], env)
        md = await env.client.ledger_metadata(w.ledger_id)
        assert len(md.ensembles) == 1  # no ensemble change
    finally:
        await env.client.close()
        await store.close()


async def test_hmac_ledgers_leave_less_room_for_the_payload() -> None:
    limit = 4096
    env, store = await open_env(limit)
    try:
        w = await env.client.create_ledger(3, 3, 2, password=b"pw", digest="hmac-sha256")
        assert w.payload_bytes_max == limit - HEADER_SIZE - 32
        with pytest.raises(EntryTooLargeError):
            await w.append(b"h" * (limit - HEADER_SIZE - 31))
        assert await w.append(b"h" * (limit - HEADER_SIZE - 32)) == 0
        await w.close()
    finally:
        await env.client.close()
        await store.close()


def test_registration_record_carries_the_limit() -> None:
    record = BookieRegistration(bookie_id=BookieId("bk9"), address="h:1", entry_size_max=65536)
    assert BookieRegistration.from_bytes(record.to_bytes()) == record
    # A record written before the field existed: the limit those bookies enforced.
    old = record.to_bytes().replace(b', "entry_size_max": 65536', b"")
    assert b"entry_size_max" not in old
    assert BookieRegistration.from_bytes(old).entry_size_max == ENTRY_SIZE_MAX_DEFAULT
    for bad in (b"0", b"-5", b'"big"', b"1.5", b"true"):
        with pytest.raises(BadRequestError, match="malformed"):
            BookieRegistration.from_bytes(record.to_bytes().replace(b"65536", bad))
