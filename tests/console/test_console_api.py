"""The console's JSON API and pages against a real cluster (etcd + bookie processes).

Shapes, paging and search, errors (bad parameters 400, unknown ledger 404), the ledger's
fragments with their zones and placement check, streams' segments, a killed bookie
turning down, and a store that is not there (the console keeps serving and says so; one
that goes away while the console runs: ``test_console_store_outage.py``).
"""

from __future__ import annotations

from typing import Any

import aiohttp

from scriba.console.cli import Console, ConsoleConfig
from scriba.embedded.process import free_port
from tests.console.conftest import ZONES, Populated, wait_for

DOWN_DEADLINE_S = 5.0  # the console's probe interval is 0.5 s here, 1 s by default


async def test_cluster_shows_every_bookie_in_its_zone(populated: Populated) -> None:
    async def all_writable() -> Any:
        _, doc = await populated.get("/api/cluster")
        return doc if doc["counts"]["writable"] == 3 else None

    doc = await wait_for("three writable bookies", all_writable, 10.0)
    assert doc["store"]["uri"] == populated.cluster.metadata_uri
    assert doc["store"]["synced"] is True and doc["store"]["error"] is None
    [region] = doc["regions"]
    assert region["region"] == "r1"
    placed = {(z["zone"], b["bookie_id"]) for z in region["zones"] for r in z["racks"] for b in r["bookies"]}
    assert placed == {("z1", "bookie-0"), ("z2", "bookie-1"), ("z3", "bookie-2")}
    _, bookies = await populated.get("/api/bookies")
    for b in bookies:
        assert b["instance_id"], b  # from its cookie
        assert b["total_bytes"] > 0 and 0 <= b["disk_used"] <= 1, b
    status, page = await populated.get("/")
    assert status == 200
    for b in ("bookie-0", "bookie-1", "bookie-2"):
        assert f'data-bookie="{b}"' in page
    assert "zone z1" in page and "zone z3" in page


async def test_killed_bookie_turns_down(populated: Populated) -> None:
    populated.cluster.kill(1)

    async def bookie1_down() -> Any:
        _, bookies = await populated.get("/api/bookies")
        return {b["bookie_id"]: b["state"] for b in bookies}.get("bookie-1") == "down"

    await wait_for("bookie-1 down", bookie1_down, DOWN_DEADLINE_S)
    _, bookies = await populated.get("/api/bookies")
    states = {b["bookie_id"]: b["state"] for b in bookies}
    assert states == {"bookie-0": "writable", "bookie-1": "down", "bookie-2": "writable"}
    # it keeps its zone while down (the console remembers its last registration)
    assert {b["bookie_id"]: b["zone"] for b in bookies}["bookie-1"] == "z2"


async def test_ledgers_paged_searched_and_errors(populated: Populated) -> None:
    status, doc = await populated.get("/api/ledgers?per_page=1")
    assert status == 200
    ids = [doc["ledgers"][0]["ledger_id"]]
    assert doc["total"] >= 3 and doc["pages"] == doc["total"]  # ours and the stream's segments
    status, doc2 = await populated.get("/api/ledgers?per_page=1&page=2")
    ids.append(doc2["ledgers"][0]["ledger_id"])
    assert ids[0] < ids[1]  # sorted by id, pages do not overlap
    _, found = await populated.get(f"/api/ledgers?q={populated.ledger_id}")
    assert populated.ledger_id in [row["ledger_id"] for row in found["ledgers"]]
    _, owned = await populated.get("/api/ledgers?q=apps/orders")
    assert owned["total"] == 2 and all(row["owner"] == "apps/orders" for row in owned["ledgers"])
    _, closed = await populated.get("/api/ledgers?state=closed")
    assert closed["total"] >= 3 and all(r["state"] == "CLOSED" for r in closed["ledgers"])
    for bad in ("page=x", "page=0", "per_page=100000", "state=melted"):
        status, err = await populated.get(f"/api/ledgers?{bad}")
        assert status == 400 and err["type"] == "BadRequestError", (bad, err)
    status, err = await populated.get("/api/ledgers/abc")
    assert status == 400, err
    status, err = await populated.get("/api/ledgers/987654321")
    assert status == 404 and err["type"] == "NoSuchLedgerError"
    status, page = await populated.get("/ledgers/987654321")
    assert status == 404 and "does not exist" in page


async def test_ledger_fragments_span_zones(populated: Populated) -> None:
    status, doc = await populated.get(f"/api/ledgers/{populated.ledger_id}")
    assert status == 200
    assert doc["state"] == "CLOSED" and doc["last_entry_id"] == 19 and "password_hash" not in doc
    [fragment] = doc["fragments"]
    assert fragment["first_entry_id"] == 0 and fragment["last_entry_id"] == 19
    assert sorted(b["zone"] for b in fragment["bookies"]) == ZONES
    assert fragment["placement"]["adherence"] == "MEETS_STRICT", fragment["placement"]
    assert all(w["zones"] == 3 for w in fragment["placement"]["write_sets"])
    status, page = await populated.get(f"/ledgers/{populated.ledger_id}")
    assert status == 200 and page.count('class="slot"') == 3


async def test_streams_show_segments(populated: Populated) -> None:
    _, doc = await populated.get("/api/streams")
    [ns] = doc["namespaces"]
    [stream] = ns["streams"]
    assert (ns["namespace"], stream["name"]) == ("apps", "orders")
    closed = [s for s in stream["segments"] if s["state"] == "closed"]
    assert [s["records"] for s in closed] == [5, 5]
    status, page = await populated.get("/streams")
    assert status == 200 and page.count('class="segment"') == len(stream["segments"])
    for path in ("/rsm", "/recovery", "/api/rsm", "/api/underreplicated", "/ledgers"):
        status, _ = await populated.get(path)
        assert status == 200, path


def _closed_port() -> int:
    return free_port()  # free a moment ago, and nothing listens there


async def test_store_away_console_keeps_serving() -> None:
    uri = f"etcd://127.0.0.1:{_closed_port()}/nowhere"
    console = Console(ConsoleConfig(uri, "127.0.0.1:0"))
    await console.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async def failing() -> Any:
                async with http.get(console.url + "api/status") as reply:
                    doc = await reply.json()
                return doc if doc["error"] else None

            doc = await wait_for("the store's error reported", failing, 20.0)
            assert doc["synced"] is False and uri in doc["error"]
            async with http.get(console.url) as reply:
                assert reply.status == 200
                assert '<div id="store-status" >' in await reply.text()  # shown, not hidden
    finally:
        await console.stop()

