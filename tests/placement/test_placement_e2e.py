"""Zone-aware placement end to end: real etcd, real bookie processes in three zones.

1. Ledgers created with ``placement="zone-aware"`` have every write set across >= 2
   zones (checked against the bookies' launch locations with the independent oracle).
2. SIGKILL every bookie of one zone during appends: every confirmed entry is read
   back with its bytes, every segment the writer recorded still spans >= 2 zones on
   every write set, and ledgers created afterwards avoid the dead zone and adhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

import pytest
from placement_oracle import FAIL, SOFT, all_write_sets, expected_adherence

from scriba.client import Client, ClientConfig
from scriba.placement import BookieNode, Topology
from scriba.testing.checkers.acked_set import check_acked_set
from scriba.testing.waiting import eventually

ZONES = ["zone-a", "zone-b", "zone-c"]
ZONE_AWARE = "zone-aware"
SESSION_ARGS = ["--session-timeout-s", "2"]


def launch_topology(cluster: Any, dead: Collection[str] = ()) -> Topology:
    """The topology the test itself launched (not what the client's registry says)."""
    return Topology.from_nodes(
        BookieNode.at(b.bookie_id, f"/{b.region}/{b.zone}/{b.rack}", writable=b.bookie_id not in dead)
        for b in cluster.bookies
    )


def zones_per_write_set(topology: Topology, ensemble: tuple[str, ...], w: int) -> list[int]:
    return [len({topology.location(b).zone for b in ws})  # type: ignore[arg-type]
            for ws in all_write_sets(ensemble, w)]


@pytest.mark.timeout(120)
async def test_zone_aware_ledgers_span_two_zones_on_every_write_set(
        bookie_cluster: Any, metadata_uri: str) -> None:
    bookie_cluster.start_bookies(6, zones=ZONES, racks=["rack-1", "rack-1", "rack-1", "rack-2", "rack-2", "rack-2"])
    topology = launch_topology(bookie_cluster)
    async with Client.connect(metadata_uri, placement=ZONE_AWARE) as client:
        ledgers = []
        for e, w, a in [(3, 3, 2), (3, 3, 2), (3, 2, 2), (6, 3, 2), (6, 2, 2), (3, 3, 3)]:
            writer = await client.create_ledger(e, w, a)
            for i in range(5):
                await writer.append(f"entry-{i}".encode())
            await writer.close()
            ledgers.append((writer.ledger_id, w, a))
        for ledger_id, w, a in ledgers:
            md = await client.ledger_metadata(ledger_id)
            assert md.placement_policy == ZONE_AWARE
            for _, ensemble in md.ensembles:
                spans = zones_per_write_set(topology, ensemble, w)
                assert min(spans) >= 2, (ledger_id, ensemble, spans)
                assert expected_adherence(ZONE_AWARE, md.placement_options, topology, ensemble,
                                          w, a) >= SOFT


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_killing_one_zone_during_writes_loses_nothing_and_keeps_placement(
        bookie_cluster: Any, metadata_uri: str) -> None:
    bookie_cluster.start_bookies(9, zones=ZONES, extra_args=SESSION_ARGS)
    appends, window, kill_after = 1500, 50, 300
    config = ClientConfig(add_timeout_s=3.0)
    async with Client.connect(metadata_uri, placement=ZONE_AWARE, config=config) as client:
        writer = await client.create_ledger(3, 3, 2)
        first_ensemble = writer.metadata.current_ensemble
        victim_zone = next(b.zone for b in bookie_cluster.bookies if b.bookie_id == first_ensemble[0])
        dead = {b.bookie_id for b in bookie_cluster.bookies if b.zone == victim_zone}
        payloads = [f"zone-kill-{i}".encode() for i in range(appends)]
        acked: dict[int, bytes] = {}
        failures: list[str] = []
        killed = False
        loop = asyncio.get_running_loop()
        change_deadline = loop.time() + 30.0
        start = 0
        # Write the planned appends, then (bounded) until the dead zone's failed adds have
        # forced an ensemble change: on a fast client every planned append may be
        # confirmed by the live bookies before the dead one's adds fail.
        while start < appends or (len(writer.metadata.ensembles) == 1 and loop.time() < change_deadline):
            if start >= len(payloads):
                payloads += [f"zone-kill-{i}".encode() for i in range(start, start + window)]
            futures = [writer.append_async(p) for p in payloads[start:start + window]]
            if not killed and start >= kill_after:
                # kill the whole zone while this window is in flight
                await asyncio.gather(*(asyncio.to_thread(b.kill) for b in bookie_cluster.bookies
                                       if b.bookie_id in dead))
                killed = True
            results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 60)
            for payload, result in zip(payloads[start:start + window], results, strict=True):
                if isinstance(result, BaseException):
                    failures.append(f"{type(result).__name__}: {result}")
                else:
                    acked[int(result)] = payload
            if failures:
                break
            start += window
        assert killed
        assert not failures, f"appends failed after {len(acked)} confirmed: {failures[:3]}"
        await writer.close()

        reader = await client.open_ledger(writer.ledger_id, recovery=False)
        md = reader.metadata
        read = [(e.entry_id, e.payload) async for e in reader.read(0, md.last_entry_id)]
        result = check_acked_set(attempted=list(enumerate(payloads)),
                                 acknowledged=list(acked.items()), read=read)
        assert result.ok, result.explain()
        assert len(acked) == len(payloads) >= appends

        launched = launch_topology(bookie_cluster)
        assert len(md.ensembles) > 1, "killing a zone of the ensemble forced no ensemble change"
        for first, ensemble in md.ensembles:
            assert min(zones_per_write_set(launched, ensemble, 3)) >= 2, (first, ensemble)
        # (the last segment may still name a dead bookie: until the registry drops the
        # zone's registrations, a replacement can land on another bookie of that zone)

        # once the registry has dropped the dead zone, new ledgers avoid it and adhere
        await eventually(lambda: not dead & set(client.registry.writable_bookies()), 30, what="the registry to drop the killed zone", interval_s=0.05)
        alive = launch_topology(bookie_cluster, dead)
        for _ in range(5):
            w2 = await client.create_ledger(3, 3, 2)
            ensemble = w2.metadata.current_ensemble
            assert not dead & set(ensemble), ensemble
            assert min(zones_per_write_set(alive, ensemble, 3)) >= 2, ensemble
            assert expected_adherence(ZONE_AWARE, {}, alive, ensemble, 3, 2) != FAIL
            await w2.append(b"after the zone died")
            await w2.close()
