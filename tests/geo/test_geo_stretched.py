"""Synchronous geo mode on real processes: a stretched cluster loses a whole region.

Six bookie processes over three regions, two zones each (the layout of
``scriba sandbox --regions 3 --zones-per-region 2``). Ledgers use
``placement="region-aware"`` with ``min_regions_for_durability=2``: the record carries
the rule and the ensemble's regions, and the writer confirms an entry only once acks
from two regions hold it. Mid-stream every bookie of one region is SIGKILLed. One
writer keeps writing (ensemble changes to the surviving regions) and closes; a second
ledger's writer is abandoned at the kill and its ledger is recovered by another client
from the surviving regions alone. Every confirmed entry is read back (acked-set checker).
The region-blind negative control runs in the simulation (tests/sim/test_sim_regions.py).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from scriba.client import Client, ClientConfig, LedgerWriter
from scriba.errors import ScribaError
from scriba.testing.checkers.acked_set import check_acked_set
from scriba.testing.waiting import eventually

REGIONS = ["region-1", "region-2", "region-3"]
ZONES = ["zone-a", "zone-a", "zone-a", "zone-b", "zone-b", "zone-b"]
PASSWORD = b"stretched"
WINDOW = 20
BEFORE_KILL = 200
AFTER_KILL = 200


async def _append(writer: LedgerWriter, tag: str, start: int, count: int,
                  attempted: list[bytes], acked: dict[int, bytes], errors: list[str]) -> None:
    for base in range(start, start + count, WINDOW):
        payloads = [f"{tag}-{i}".encode() for i in range(base, min(base + WINDOW, start + count))]
        attempted.extend(payloads)
        results = await asyncio.wait_for(
            asyncio.gather(*(writer.append_async(p) for p in payloads), return_exceptions=True), 90
        )
        for payload, result in zip(payloads, results, strict=True):
            if isinstance(result, BaseException):
                errors.append(f"{type(result).__name__}: {result}")
            else:
                acked[int(result)] = payload
        if errors:
            return


async def _read_all(client: Client, ledger_id: int) -> list[bytes]:
    reader = await client.open_ledger(ledger_id, password=PASSWORD, recovery=True)
    last = int(reader.metadata.last_entry_id)
    if last < 0:
        return []
    return [e.payload async for e in reader.read(0, last)]


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_losing_a_whole_region_loses_no_confirmed_entry(bookie_cluster: Any, metadata_uri: str) -> None:
    bookie_cluster.start_bookies(6, regions=REGIONS, zones=ZONES)
    region_of = {b.bookie_id: b.region for b in bookie_cluster.bookies}
    config = ClientConfig(add_timeout_s=2.0)
    options = {"min_regions_for_durability": 2}
    async with Client.connect(metadata_uri, config=config, placement="region-aware",
                              placement_options=options) as client, \
            Client.connect(metadata_uri, config=config) as recoverer:
        kept = await client.create_ledger(4, 4, 3, password=PASSWORD)
        abandoned = await client.create_ledger(4, 4, 3, password=PASSWORD)
        record = kept.metadata
        assert record.min_regions_for_durability == 2
        assert record.bookie_regions == {b: region_of[b] for b in record.current_ensemble}

        attempted: dict[str, list[bytes]] = {"kept": [], "abandoned": []}
        acked: dict[str, dict[int, bytes]] = {"kept": {}, "abandoned": {}}
        errors: dict[str, list[str]] = {"kept": [], "abandoned": []}
        for name, writer in (("kept", kept), ("abandoned", abandoned)):
            await _append(writer, name, 0, BEFORE_KILL, attempted[name], acked[name], errors[name])
            assert not errors[name], errors[name][:3]

        # The region holding most of the kept ledger's ensemble goes, every bookie of it.
        doomed = Counter(region_of[b] for b in record.current_ensemble).most_common(1)[0][0]
        victims = [b for b in bookie_cluster.bookies if b.region == doomed]
        await asyncio.gather(*(asyncio.to_thread(b.kill) for b in victims))

        await _append(kept, "kept", BEFORE_KILL, AFTER_KILL, attempted["kept"], acked["kept"], errors["kept"])
        if errors["kept"]:
            # Allowed only as a clear refusal that names the constraint.
            assert any("min_regions_for_durability" in e or "NotEnoughBookies" in e for e in errors["kept"]), (
                errors["kept"][:3]
            )
        else:
            assert len(acked["kept"]) == BEFORE_KILL + AFTER_KILL
            assert len(kept.metadata.ensembles) >= 2, "no ensemble change after the region died"

            # With Qa 3 of Qw 4, entries are confirmed once the first dead bookie is replaced,
            # while the second replacement may still be under way: wait for it, not for a write.
            def off_the_doomed_region() -> bool:
                return not {region_of[b] for b in kept.metadata.current_ensemble} & {doomed}

            await eventually(off_the_doomed_region, 60.0, what="the ensemble off the dead region")
            await kept.close()

        # The abandoned ledger is recovered from the surviving regions by another client.
        read_kept = await _read_all(recoverer, kept.ledger_id)
        read_abandoned = await _read_all(recoverer, abandoned.ledger_id)
        for name, read in (("kept", read_kept), ("abandoned", read_abandoned)):
            result = check_acked_set(attempted[name], acked[name].values(), read)
            assert result.ok, f"{name}: {result.explain()}"
        recovered = await recoverer.ledger_metadata(abandoned.ledger_id)
        for _first, ensemble in recovered.ensembles:
            assert len({recovered.bookie_regions.get(b) for b in ensemble}) >= 2
        try:
            await abandoned.close()
        except ScribaError:
            pass  # fenced by the recovery: expected


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_no_entry_is_confirmed_while_only_one_region_acknowledged_it(
    bookie_cluster: Any, metadata_uri: str, tmp_path: Any
) -> None:
    """Four bookies, two regions; ``region-2`` is reached through the fault proxy. With
    region-2 blackholed, a count-only ledger (W4/A2) confirms entries on region-1's two
    bookies alone, while the same shape with ``min_regions_for_durability=2``
    (``ack_rule_only`` placement) confirms none of its entries; once region-2 is back it
    confirms them all, in order, and every confirmed entry is read back."""
    from scriba.embedded.fault_proxy import RegionLatency
    from scriba.testing.faults import toxiproxy_client

    latency = RegionLatency(0, tmp_path / "faults-proxy.log")
    latency.start()
    try:
        for i in range(4):
            region = REGIONS[i % 2]
            bookie = bookie_cluster.add_bookie(region=region, zone=ZONES[3 * (i // 2)], start=False,
                                               extra_args=latency.advertise_args(region != REGIONS[0]))
            if region != REGIONS[0]:
                latency.add_bookie(bookie.bookie_id, bookie.port, bookie.binary_port)
            bookie.start(60.0)
        api = toxiproxy_client(latency.describe()["api_url"])
        proxies = [api.get_proxy(name) for name in latency.proxy_names]
        config = ClientConfig(add_timeout_s=60.0)  # the cut must not turn into ensemble changes
        async with Client.connect(metadata_uri, config=config) as client:
            stretched = await client.create_ledger(
                4, 4, 2, password=PASSWORD, placement="region-aware",
                placement_options={"min_regions_for_durability": 2, "ack_rule_only": True})
            counting = await client.create_ledger(
                4, 4, 2, password=PASSWORD, placement="region-aware",
                placement_options={"enforce_durability": False})
            assert stretched.metadata.min_regions_for_durability == 2
            assert counting.metadata.min_regions_for_durability == 1
            for writer in (stretched, counting):
                for i in range(5):
                    await writer.append(b"before-%d" % i)
            for p in proxies:  # region-2 goes silent (bytes held, connections open)
                p.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0}, name="cut_up")
                p.add_toxic(type="timeout", stream="downstream", attributes={"timeout": 0}, name="cut_down")
            during = [b"during-%d" % i for i in range(20)]
            held = [asyncio.ensure_future(stretched.append_async(v)) for v in during]
            controls = [asyncio.ensure_future(counting.append_async(v)) for v in during]
            # Region-1 alone confirms the count-only ledger's entries (the control)...
            await asyncio.wait_for(asyncio.gather(*controls), 60)
            # ...and by then, with the same bookies answering, not one of the stretched ones.
            assert not any(f.done() for f in held), [f.result() for f in held if f.done()]
            assert stretched.last_add_confirmed == 4
            for p in proxies:
                for name in list(p.toxics()):
                    p.destroy_toxic(name)
            ids = await asyncio.wait_for(asyncio.gather(*held), 60)
            assert ids == list(range(5, 25))
            for writer in (stretched, counting):
                await writer.close()
                reader = await client.open_ledger(writer.ledger_id, password=PASSWORD)
                read = [e.payload async for e in reader.read(0, 24)]
                attempted = [b"before-%d" % i for i in range(5)] + during
                result = check_acked_set(attempted, attempted, read)
                assert result.ok, result.explain()
    finally:
        latency.stop()
