"""Id ranges (``scriba.meta.id_ranges``) against a memory store with counted and faulty operations.

The contract suite proves uniqueness and no reuse on every driver; these tests add what
needs a fault at an exact point (a CAS whose outcome is unknown), the adaptive range
sizes, the round trips a refill costs, and a negative control: a store whose
compare-and-set ignores the version makes two allocators hand out the same ids, and the
uniqueness check sees it.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from scriba.errors import BadRequestError, InternalError, MetadataError, MetadataUnavailableError
from scriba.meta import id_ranges
from scriba.meta.id_ranges import RANGE_MAX, IdRanges
from scriba.meta.memory import MemoryStore, drop_memory_space
from scriba.meta.store import Versioned


class Recording:
    """A counter store over a memory store that counts calls and can fail on purpose."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.calls: Counter[str] = Counter()
        self.fail_after_set = 0  # the next n sets apply, then raise "outcome unknown"
        self.ignore_version = False  # a broken compare-and-set (the negative control)

    async def get(self, key: str) -> Versioned[bytes]:
        self.calls["get"] += 1
        return await self.store.get(key)

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> int:
        self.calls["create"] += 1
        return await self.store.create(key, value, ephemeral=ephemeral)

    async def set(self, key: str, value: bytes, *, expected_version: int) -> int:
        self.calls["set"] += 1
        await asyncio.sleep(0)  # let other allocators interleave, as a network would
        if self.ignore_version:
            expected_version = (await self.store.get(key)).version
        version = await self.store.set(key, value, expected_version=expected_version)
        if self.fail_after_set:
            self.fail_after_set -= 1
            raise MetadataUnavailableError("set: no answer (outcome unknown)")
        return version


@pytest.fixture
async def memory() -> AsyncIterator[MemoryStore]:
    name = f"ids-{uuid.uuid4().hex[:8]}"
    store = await MemoryStore.open(f"memory://{name}")
    yield store
    await store.close()
    drop_memory_space(name)


async def counter(store: MemoryStore, name: str = "ledger") -> int:
    return int((await store.get(f"ids/{name}")).value)


async def test_ranges_double_from_one_up_to_the_maximum(memory: MemoryStore) -> None:
    ids = IdRanges(memory, range_max=8)
    got = [await ids.allocate("ledger") for _ in range(1 + 2 + 4 + 8 + 8)]
    assert got == list(range(1, 24))  # one client alone: dense
    assert await counter(memory) == 23  # reserved 1, 2, 4, 8, 8: exactly what was handed out


async def test_a_refill_covers_every_waiting_caller_at_once(memory: MemoryStore) -> None:
    rec = Recording(memory)
    ids = IdRanges(rec, range_max=RANGE_MAX)
    got = await asyncio.gather(*(ids.allocate("ledger") for _ in range(100)))
    assert sorted(got) == list(range(1, 101))
    assert rec.calls["create"] + rec.calls["set"] <= 3  # not one write per id


async def test_a_refill_nobody_raced_costs_one_write_and_no_read(memory: MemoryStore) -> None:
    rec = Recording(memory)
    ids = IdRanges(rec, range_max=4)
    for _ in range(1 + 2 + 4):
        await ids.allocate("ledger")
    assert rec.calls == Counter(get=1, create=1, set=2)  # the get found nothing; then CAS only
    other = IdRanges(memory, range_max=4)
    await other.allocate("ledger")  # another client raced: the next refill must read again
    rec.calls.clear()
    assert await ids.allocate("ledger") > 8
    assert rec.calls == Counter(set=2, get=1)  # a lost CAS, a read, a CAS


async def test_clients_racing_for_ranges_never_share_an_id(memory: MemoryStore) -> None:
    allocators = [IdRanges(Recording(memory), range_max=4) for _ in range(4)]
    per_client: list[list[int]] = [[] for _ in allocators]

    async def run(i: int) -> None:
        for _ in range(100):
            per_client[i % 4].append(await allocators[i % 4].allocate("ledger"))

    await asyncio.gather(*(run(i) for i in range(16)))
    ids = [i for p in per_client for i in p]
    assert len(ids) == 1600 and len(set(ids)) == 1600
    for p in per_client:
        assert all(a < b for a, b in itertools.pairwise(p))


async def test_negative_control_a_cas_that_ignores_the_version_hands_out_an_id_twice(
    memory: MemoryStore,
) -> None:
    broken = [Recording(memory) for _ in range(4)]
    for rec in broken:
        rec.ignore_version = True
    allocators = [IdRanges(rec, range_max=4) for rec in broken]
    ids = await asyncio.gather(*(a.allocate("ledger") for a in allocators for _ in range(50)))
    assert len(set(ids)) < len(ids)  # the uniqueness check above would catch this


async def test_a_cas_with_an_unknown_outcome_skips_its_range_and_reuses_nothing(
    memory: MemoryStore,
) -> None:
    rec = Recording(memory)
    ids = IdRanges(rec, range_max=4)
    first = [await ids.allocate("ledger") for _ in range(3)]  # ranges of 1 and 2
    rec.fail_after_set = 1  # the next reservation (ids 4..7) applies but its answer is lost
    after = [await ids.allocate("ledger") for _ in range(4)]
    assert first == [1, 2, 3]
    assert min(after) > 7, "ids of a reservation whose outcome was unknown were handed out"
    assert after == sorted(after)
    other = IdRanges(memory)
    assert await other.allocate("ledger") > max(after)


async def test_each_sequence_counts_on_its_own(memory: MemoryStore) -> None:
    ids = IdRanges(memory)
    assert [await ids.allocate("a") for _ in range(3)] == [1, 2, 3]
    assert await ids.allocate("b") == 1


async def test_a_deleted_counter_never_takes_a_client_backwards(memory: MemoryStore) -> None:
    ids = IdRanges(memory, range_max=2)
    got = [await ids.allocate("ledger") for _ in range(5)]
    await memory.delete("ids/ledger")  # an operator's mistake
    later = [await ids.allocate("ledger") for _ in range(5)]
    assert min(later) > max(got)


async def test_the_floor_starts_a_new_counter_above_older_ids(memory: MemoryStore) -> None:
    async def floor(name: str) -> int:
        return 1000

    ids = IdRanges(memory, floor=floor)
    assert await ids.allocate("ledger") == 1001


async def test_an_exhausted_sequence_says_so(memory: MemoryStore) -> None:
    await memory.create("ids/ledger", str(id_ranges.ID_MAX - 1).encode())
    ids = IdRanges(memory)
    assert await ids.allocate("ledger") == id_ranges.ID_MAX
    with pytest.raises(MetadataError, match="exhausted"):
        await ids.allocate("ledger")


async def test_a_corrupt_counter_is_an_internal_error_not_a_reset(memory: MemoryStore) -> None:
    await memory.create("ids/ledger", b"forty-two")
    with pytest.raises(InternalError, match="not a number"):
        await IdRanges(memory).allocate("ledger")


@pytest.mark.parametrize("name", ["", "a/b"])
async def test_a_sequence_name_is_one_path_segment(memory: MemoryStore, name: str) -> None:
    with pytest.raises(BadRequestError, match="one path segment"):
        await IdRanges(memory).allocate(name)
