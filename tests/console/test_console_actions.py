"""The console's actions (``--allow-actions``): refused without the flag, two POSTs with a
confirmation token, checked input, and what they do in the store (real etcd + bookies).

The leadership transfer is exercised on real replica processes in
``test_console_rsm_live.py``; the confirmation book's rules in ``test_console_confirmations.py``.
"""

from __future__ import annotations

from typing import Any

from scriba.autorecovery.records import (
    AUDIT_REQUEST_KEY,
    AuditRequest,
    Decommission,
    decommission_key,
)
from scriba.console.cli import Console, ConsoleConfig
from scriba.errors import NoSuchKeyError
from scriba.meta import connect
from tests.console.conftest import Populated, wait_for


# --- over HTTP, on a real cluster -------------------------------------------------------------
async def _post(p: Populated, url: str, path: str, body: Any, **kw: Any) -> tuple[int, Any]:
    async with p.http.post(url.rstrip("/") + path, json=body, **kw) as reply:
        return reply.status, await reply.json()


async def _stored(uri: str, key: str) -> bytes | None:
    store = await connect(uri)
    try:
        return (await store.get(key)).value
    except NoSuchKeyError:
        return None
    finally:
        await store.close()


async def test_actions_are_refused_without_the_flag(populated: Populated) -> None:
    url = populated.console.url
    for kind in ("audit", "decommission", "transfer-leadership"):
        status, doc = await _post(populated, url, f"/api/actions/{kind}", {"full": True})
        assert status == 403 and "--allow-actions" in doc["error"], doc
        assert doc["type"] == "ActionRefusedError"
    async with populated.http.get(url + "api/actions/audit") as reply:
        assert reply.status == 405  # POST only
    status, page = await populated.get("/recovery")
    assert status == 200 and 'data-action="audit"' not in page  # no buttons either
    assert await _stored(populated.cluster.metadata_uri, AUDIT_REQUEST_KEY) is None


async def test_audit_asks_then_runs_once(acting: tuple[Populated, str]) -> None:
    p, url = acting
    uri = p.cluster.metadata_uri
    status, doc = await _post(p, url, "/api/actions/audit", {"full": True})
    assert status == 200 and doc["confirm"] and "full" in doc["summary"], doc
    assert await _stored(uri, AUDIT_REQUEST_KEY) is None  # asking does nothing yet
    token = doc["confirm"]
    status, wrong = await _post(p, url, "/api/actions/audit", {"full": False, "confirm": token})
    assert status == 403 and "another action" in wrong["error"]
    status, doc = await _post(p, url, "/api/actions/audit", {"full": True})
    token = doc["confirm"]
    status, done = await _post(p, url, "/api/actions/audit", {"full": True, "confirm": token})
    assert status == 200 and done["done"] is True and done["result"] == {"sequence": 1, "full": True}, done
    raw = await _stored(uri, AUDIT_REQUEST_KEY)
    assert raw is not None and AuditRequest.from_bytes(raw) == AuditRequest(1, True)
    status, again = await _post(p, url, "/api/actions/audit", {"full": True, "confirm": token})
    assert status == 403 and "already used" in again["error"]
    raw = await _stored(uri, AUDIT_REQUEST_KEY)
    assert raw is not None and AuditRequest.from_bytes(raw).sequence == 1  # the replay did nothing


async def test_bad_and_cross_site_requests_are_refused(acting: tuple[Populated, str]) -> None:
    p, url = acting
    status, doc = await _post(p, url, "/api/actions/reboot", {})
    assert status == 400 and "unknown action" in doc["error"]
    status, doc = await _post(p, url, "/api/actions/decommission", {"bookie_id": "bookie-99"})
    assert status == 400 and "no bookie" in doc["error"]
    status, doc = await _post(p, url, "/api/actions/transfer-leadership", {"group": "a/b", "replica_id": "r1"})
    assert status == 400 and "no live replica" in doc["error"]
    status, doc = await _post(p, url, "/api/actions/audit", [1, 2])
    assert status == 400 and "JSON object" in doc["error"]
    async with p.http.post(url + "api/actions/audit", data={"full": "true"}) as reply:  # an HTML form's body
        assert reply.status == 400 and "application/json" in (await reply.json())["error"]
    status, doc = await _post(p, url, "/api/actions/audit", {}, headers={"Origin": "http://evil.example"})
    assert status == 403 and "cross-origin" in doc["error"]
    status, doc = await _post(p, url, "/api/actions/audit", {"confirm": "made-up"})
    assert status == 403 and "unknown" in doc["error"]
    assert await _stored(p.cluster.metadata_uri, AUDIT_REQUEST_KEY) is None


async def test_the_authorize_hook_decides_who_acts(populated: Populated) -> None:
    console = Console(ConsoleConfig(populated.cluster.metadata_uri, "127.0.0.1:0", allow_actions=True),
                      authorize=lambda request: "admin" if request.headers.get("X-Test-Admin") else None)
    url = await console.start()
    try:
        await console.mirror.wait_synced(20.0)
        status, doc = await _post(populated, url, "/api/actions/audit", {})
        assert status == 403 and "not an admin identity" in doc["error"]
        status, doc = await _post(populated, url, "/api/actions/audit", {}, headers={"X-Test-Admin": "1"})
        assert status == 200 and doc["confirm"]
    finally:
        await console.stop()


async def test_decommission_marks_the_bookies_ledgers(acting: tuple[Populated, str]) -> None:
    p, url = acting
    _, doc = await _post(p, url, "/api/actions/decommission", {"bookie_id": "bookie-1"})
    status, done = await _post(p, url, "/api/actions/decommission", {"bookie_id": "bookie-1",
                                                                     "confirm": doc["confirm"]})
    assert status == 200, done
    result = done["result"]
    assert result["state"] == "DRAINING" and result["ledgers_marked"] >= 1, result
    raw = await _stored(p.cluster.metadata_uri, decommission_key("bookie-1"))
    assert raw is not None and Decommission.from_bytes(raw).state.value == "DRAINING"

    async def marked() -> Any:  # the recovery page (through the watched mirror) lists them
        _, rows = await p.get("/api/underreplicated")
        return [r for r in rows if "bookie-1" in r["bookies"]]

    rows = await wait_for("bookie-1's ledgers marked", marked, 10.0)
    assert p.ledger_id in [r["ledger_id"] for r in rows]
    assert len(rows) == result["ledgers_marked"]

    async def draining() -> Any:  # and the bookie shows as draining (the others do not)
        _, bookies = await p.get("/api/bookies")
        return {b["bookie_id"]: b["decommission"] for b in bookies}

    drains = await wait_for("bookie-1 draining", lambda: _when(draining, lambda d: d.get("bookie-1")), 10.0)
    assert drains == {"bookie-0": "", "bookie-1": "DRAINING", "bookie-2": ""}
    _, page = await p.get("/")
    assert '<td class="b-drain">DRAINING</td>' in page


async def _when(fetch: Any, ok: Any) -> Any:
    doc = await fetch()
    return doc if ok(doc) else None
