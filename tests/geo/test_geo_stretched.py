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
            after = kept.metadata
            assert len(after.ensembles) >= 2, "no ensemble change after the region died"
            assert not {region_of[b] for b in after.current_ensemble} & {doomed}
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
