"""The console's decode cache is bounded by the live records, by construction (#22's flat
memory): the mirror tells it of every key that goes, however it goes — a deletion, a record
below a deleted stream, a key missing at a resync — so after any number of create/delete
cycles it holds no decode of a deleted key. Negative control: the same churn through a
cache the mirror does not tell (as the old rule was until it reached 2 x live + 1000
entries) grows by one decode per deleted record."""

from __future__ import annotations

import uuid
from typing import Any

from scriba.console.cli import Console
from scriba.console.decode_cache import MISS, DecodeCache
from scriba.console.mirror import Mirror
from scriba.console.views import LedgerQuery, Model
from scriba.meta import connect
from scriba.meta.records import LEDGERS_PREFIX, LedgerMetadata, ledger_key
from scriba.meta.store import MetadataStore
from scriba.stream import segments as sg
from scriba.stream.position import Position
from scriba.testing.waiting import eventually

LIVE = 20  # ledgers alive at any time
CYCLES = 60  # each creates BATCH ledgers, shows them, deletes BATCH older ones
BATCH = 10
DEADLINE_S = 30.0


def _ledger(lid: int) -> bytes:
    return LedgerMetadata(lid, 1, 1, 1, ((0, ("b1",)),)).to_bytes()


def _shown(model: Model) -> list[int]:
    return [row["ledger_id"] for row in model.ledgers(LedgerQuery(per_page=500))["ledgers"]]


def _streams(model: Model) -> list[dict[str, Any]]:
    return [s for ns in model.streams()["namespaces"] for s in ns["streams"]]


def test_a_decode_is_good_for_its_version_and_goes_with_its_key() -> None:
    cache = DecodeCache()
    assert cache.get("d", "k", 1) is MISS
    cache.put("d", "k", 1, None)  # a record may decode to None: still a hit
    cache.put("e", "k", 1, "other decoder")
    assert cache.get("d", "k", 1) is None and cache.get("e", "k", 1) == "other decoder"
    assert cache.get("d", "k", 2) is MISS  # the key changed: decode again
    cache.put("d", "k", 2, "new")
    assert (cache.get("d", "k", 2), len(cache)) == ("new", 2)  # replaced, not added
    cache.forget("k")
    assert (cache.get("d", "k", 2), cache.get("e", "k", 1), len(cache), cache.keys()) == (MISS, MISS, 0, set())
    cache.forget("never there")  # harmless


async def test_cache_stays_within_the_live_records_over_many_cycles(memory_console: tuple[MetadataStore, Console]) -> None:
    store, console = memory_console
    model = console.model
    deaf = Model(console.mirror)  # the negative control: a cache the mirror does not tell of deletions
    deaf.decoded = DecodeCache()
    next_id, sizes, deaf_sizes = 1, [], []
    for lid in range(next_id, next_id + LIVE):
        await store.create(ledger_key(lid), _ledger(lid))
    next_id += LIVE
    for cycle in range(CYCLES):
        new = range(next_id, next_id + BATCH)
        for lid in new:
            await store.create(ledger_key(lid), _ledger(lid))
        next_id += BATCH
        want = list(range(next_id - LIVE - BATCH, next_id))
        await eventually(lambda want=want: _shown(model) == want, DEADLINE_S, what=f"cycle {cycle}: new ledgers shown")
        assert model.ledgers(LedgerQuery(per_page=500))["total"] == LIVE + BATCH
        deaf.ledgers(LedgerQuery(per_page=500))
        for lid in want[:BATCH]:
            await store.delete(ledger_key(lid))
        await eventually(lambda: len(console.mirror.records(LEDGERS_PREFIX)) == LIVE, DEADLINE_S,
                         what=f"cycle {cycle}: the old ledgers gone")
        live = set(console.mirror.records(LEDGERS_PREFIX))
        assert model.decoded.keys() <= live, "a deleted ledger's decode is still cached"
        sizes.append(len(model.decoded))
        deaf_sizes.append(len(deaf.decoded))

    deleted = CYCLES * BATCH
    assert max(sizes) <= LIVE, sizes  # never more than the live ledgers, at any cycle
    assert deaf_sizes[-1] >= deleted, deaf_sizes  # the control grew by every deletion ...
    assert deaf_sizes[-1] < 2 * LIVE + 1000  # ... and the old rule would not yet have pruned it
    assert deaf_sizes == sorted(deaf_sizes) and deaf_sizes[-1] > deaf_sizes[0] + deleted - 2 * BATCH


async def test_records_below_a_deleted_stream_leave_the_cache(memory_console: tuple[MetadataStore, Console]) -> None:
    store, console = memory_console
    model = console.model
    await store.create(sg.namespace_key("apps"), sg.NamespaceRecord("apps").to_bytes())
    await store.create(sg.stream_key("apps", "s"), sg.StreamRecord("s").to_bytes())
    for name in ("c1", "c2"):
        await store.create(sg.cursor_key("apps", "s", name), sg.CursorRecord(name, Position(0, 3)).to_bytes())
    cursor_keys = {sg.cursor_key("apps", "s", n) for n in ("c1", "c2")}
    await eventually(lambda: [len(s["cursors"]) for s in _streams(model)] == [2], DEADLINE_S,
                     what="the stream with its two cursors")
    assert cursor_keys <= model.decoded.keys()
    # only the stream is deleted: its cursors' watch stops and takes their records (and decodes) along
    await store.delete(sg.stream_key("apps", "s"))
    await eventually(lambda: not _streams(model), DEADLINE_S, what="the stream gone")
    assert not (cursor_keys | {sg.stream_key("apps", "s")}) & model.decoded.keys()
    assert model.decoded.keys() == {sg.namespace_key("apps")}


async def test_keys_gone_while_the_store_was_away_leave_the_cache() -> None:
    """A resync drops the keys the store no longer has; the mirror tells the cache of those too."""
    uri = f"memory://console-cache-{uuid.uuid4().hex[:8]}"
    store = await connect(uri)
    connects = 0

    async def counting_connect(u: str) -> MetadataStore:
        nonlocal connects
        connects += 1
        return await connect(u)

    mirror = Mirror(uri, counting_connect)
    model = Model(mirror)
    for lid in (1, 2, 3):
        await store.create(ledger_key(lid), _ledger(lid))
    mirror.start()
    try:
        await mirror.wait_synced(30.0)
        assert model.ledgers(LedgerQuery())["total"] == 3
        assert model.decoded.keys() == {ledger_key(lid) for lid in (1, 2, 3)}
        # the mirror's own session to the store is lost; ledger 2 is deleted meanwhile
        await mirror.stop()
        await store.delete(ledger_key(2))
        assert ledger_key(2) in model.decoded.keys()  # the last copy is kept while away
        mirror.start()
        await eventually(lambda: connects == 2 and mirror.synced and ledger_key(2) not in mirror.records(LEDGERS_PREFIX),
                         DEADLINE_S, what="resynced without ledger 2")
        assert model.decoded.keys() == {ledger_key(1), ledger_key(3)}
    finally:
        await mirror.stop()
        await store.close()
