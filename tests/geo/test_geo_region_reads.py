"""Region-local reads and the region rule through the real ``Client`` (in-process bookies).

A client made with ``location="/region/zone/rack"`` (``Client.connect(local=...)``)
reads each entry from a replica in its own region first (placement's ``read_order``),
and falls back to another region when that replica is down. The same run checks that a
``region-aware`` ledger records ``min_regions_for_durability`` and its ensemble's
regions, and that ``enforce_durability=False`` leaves regions out of the ack rule.
"""

from __future__ import annotations

from collections import Counter

from scriba.client import Client
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.connect import connect
from scriba.meta.records import BookieRegistration, bookie_key
from scriba.stream import open_namespace
from scriba.testing.sim.memory import StorageTransport

REGION_OF = {"e1": "east", "e2": "east", "w1": "west", "w2": "west", "n1": "north", "n2": "north"}


class CountingTransport(StorageTransport):
    """Counts which bookie served each read."""

    def __init__(self, bookie_ids: list[str]) -> None:
        super().__init__(bookie_ids)
        self.served: Counter[str] = Counter()

    async def read_range(self, bookie_id: BookieId, ledger_id: LedgerId, first_entry_id: EntryId,
                         last_entry_id: EntryId, **kw):  # type: ignore[no-untyped-def]
        result = await super().read_range(bookie_id, ledger_id, first_entry_id, last_entry_id, **kw)
        self.served[bookie_id] += len(result)
        return result

    async def read_entry(self, bookie_id: BookieId, ledger_id: LedgerId, entry_id: EntryId, **kw):  # type: ignore[no-untyped-def]
        result = await super().read_entry(bookie_id, ledger_id, entry_id, **kw)
        self.served[bookie_id] += 1
        return result


async def test_clients_read_from_their_own_region_first() -> None:
    store = await connect("memory://geo-region-reads")
    try:
        for i, (b, region) in enumerate(sorted(REGION_OF.items())):
            registration = BookieRegistration(
                bookie_id=BookieId(b), address=f"memory:{b}", region=region, zone=f"z{i % 2}",
                rack=f"k{i}", free_bytes=1 << 40, total_bytes=1 << 40,
            )
            await store.create(bookie_key(b), registration.to_bytes(), ephemeral=True)
        transport = CountingTransport(sorted(REGION_OF))
        async with Client.connect(store.uri, store=store, transport=transport, placement="region-aware",
                                  placement_options={"min_regions_for_durability": 2}) as writer_client:
            writer = await writer_client.create_ledger(3, 3, 3)
            record = writer.metadata
            assert record.min_regions_for_durability == 2
            assert record.bookie_regions == {b: REGION_OF[b] for b in record.current_ensemble}
            for i in range(50):
                await writer.append(b"entry-%d" % i)
            await writer.close()
            loose = await writer_client.create_ledger(
                3, 3, 2, placement="region-aware", placement_options={"enforce_durability": False}
            )
            assert loose.metadata.min_regions_for_durability == 1 and not loose.metadata.bookie_regions
            await loose.close()
        ensemble = record.current_ensemble
        for bookie in ensemble:
            region = REGION_OF[bookie]
            transport.served.clear()
            async with Client.connect(store.uri, store=store, transport=transport,
                                      local=f"/{region}/z0/k0") as reader_client:
                reader = await reader_client.open_ledger(writer.ledger_id)
                got = [e.payload async for e in reader.read(0, 49)]
            assert got == [b"entry-%d" % i for i in range(50)]
            assert set(transport.served) == {bookie}, f"a {region} client read from {dict(transport.served)}"
        # A stream with the same placement: its segments' ledgers carry the rule too.
        async with Client.connect(store.uri, store=store, transport=transport) as stream_client:
            ns = await open_namespace(stream_client, "geo/stretched", create=True, ensemble_size=3,
                                      write_quorum_size=3, ack_quorum_size=3, placement="region-aware",
                                      placement_options={"min_regions_for_durability": 2})
            async with await ns.open_writer("events", create=True) as stream_writer:
                await stream_writer.append(b"one")
            segments = (await ns.info("events")).record.segments
            segment_record = await stream_client.ledger_metadata(segments[0].ledger_id)
            assert segment_record.min_regions_for_durability == 2
            assert len(set(segment_record.bookie_regions.values())) == 3
        # Its own region's replica down: the client reads from another region.
        local = ensemble[0]
        transport.down.add(local)
        transport.served.clear()
        async with Client.connect(store.uri, store=store, transport=transport,
                                  local=f"/{REGION_OF[local]}/z0/k0") as reader_client:
            reader = await reader_client.open_ledger(writer.ledger_id)
            got = [e.payload async for e in reader.read(0, 49)]
        assert len(got) == 50 and local not in transport.served and sum(transport.served.values()) >= 50
    finally:
        await store.close()
