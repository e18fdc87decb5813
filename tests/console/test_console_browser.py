"""The console in a real browser (headless Chromium driven by selenium through chromedriver).

The cluster map shows every bookie inside its zone's box; after SIGKILL of one bookie the
open page — refreshed by its own script, never reloaded — shows it down within
``DOWN_DEADLINE_S``; the ledger page draws one ensemble row per fragment with its write
set spanning three zones; the ledgers list shows every ledger, a segment's with its stream; the
streams page shows the stream's segments. A screenshot of
each page is kept (``SCRIBA_CONSOLE_SCREENSHOTS`` or the test's tmp dir).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from scriba.autorecovery.records import AUDIT_REQUEST_KEY, AuditRequest
from scriba.errors import NoSuchKeyError
from scriba.meta import connect
from tests.console.browser import STATES_JS, Browser, missing
from tests.console.conftest import Populated
from tests.console.test_console_geo import geo_console

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))

# probe interval 0.5 s + probe timeout 1 s + page refresh 2 s, with room for a busy machine
DOWN_DEADLINE_S = 10.0


def _shots(tmp_path: Path) -> Path:
    where = Path(os.environ.get("SCRIBA_CONSOLE_SCREENSHOTS", str(tmp_path / "screenshots")))
    where.mkdir(parents=True, exist_ok=True)
    return where


async def test_console_pages_in_chromium(populated: Populated, tmp_path: Path) -> None:
    shots = _shots(tmp_path)
    (tmp_path / "profile").mkdir()
    browser = Browser(tmp_path / "profile")
    await browser.start()
    try:
        # ledger page: one row per fragment, each write set over three zones
        await browser.open(f"{populated.console.url}ledgers/{populated.ledger_id}")
        zones = json.loads(await browser.evaluate(
            "JSON.stringify([...document.querySelectorAll('svg.ledger-map g.slot')].map(s => s.dataset.zone))"))
        assert sorted(zones) == ["z1", "z2", "z3"]
        assert "(3 zones)" in await browser.evaluate("document.getElementById('placement').innerText")
        await browser.screenshot(shots / "ledger.png")

        # the ledgers list: the plain ledger and the stream's segments, each segment with its owner stream
        await browser.open(f"{populated.console.url}ledgers")
        rows = json.loads(await browser.evaluate(
            "JSON.stringify([...document.querySelectorAll('#ledgers tr')].slice(1).map(r => "
            "[...r.cells].map(c => c.innerText.trim())))"))
        assert [str(populated.ledger_id), "CLOSED", "3/3/2"] == rows[0][:3], rows
        assert len(rows) >= 3 and {r[7] for r in rows[1:]} == {"apps/orders"}, rows
        await browser.screenshot(shots / "ledgers.png")

        await browser.open(f"{populated.console.url}streams")
        assert await browser.evaluate("document.querySelectorAll('g.segment').length") >= 2
        await browser.screenshot(shots / "streams.png")

        # the cluster map: every bookie in its zone, writable
        await browser.open(populated.console.url)
        expected = {"bookie-0": "z1", "bookie-1": "z2", "bookie-2": "z3"}
        await browser.wait_for("three writable bookies on the map",
                               f"(s => Object.values(s).filter(v => v[0] === 'writable').length === 3)({STATES_JS.replace('JSON.stringify', '')})",
                               10.0)
        states = json.loads(await browser.evaluate(STATES_JS))
        assert {b: v[1] for b, v in states.items()} == expected
        await browser.screenshot(shots / "cluster.png")

        # SIGKILL one bookie: the open page turns it down by itself (no reload: the marker stays)
        await browser.evaluate("window.__noReload = 'still here'")
        populated.cluster.kill(1)
        await browser.wait_for("bookie-1 down on the open page",
                               f"JSON.parse({STATES_JS})['bookie-1'][0] === 'down'", DOWN_DEADLINE_S)
        assert await browser.evaluate("window.__noReload") == "still here"
        states = json.loads(await browser.evaluate(STATES_JS))
        assert states["bookie-1"] == ["down", "z2", "down"]
        assert states["bookie-0"][0] == states["bookie-2"][0] == "writable"
        await browser.screenshot(shots / "cluster-bookie-down.png")
    finally:
        await browser.stop()


async def test_audit_action_confirmed_in_chromium(acting: tuple[Populated, str], tmp_path: Path) -> None:
    """--allow-actions: the recovery page's "audit now" asks, shows the summary in the confirm box,
    and runs only when Confirm is clicked; Cancel runs nothing."""
    populated, url = acting
    uri = populated.cluster.metadata_uri
    (tmp_path / "profile").mkdir()
    browser = Browser(tmp_path / "profile")
    await browser.start()
    try:
        await browser.open(f"{url}recovery")
        click = "document.querySelector('button.action[data-action=\"audit\"]').click()"
        await browser.evaluate(click)
        summary = await browser.wait_for("the confirm box", "!document.getElementById('confirm-box').hidden && "
                                         "document.getElementById('confirm-summary').textContent", 10.0)
        assert "auditor" in summary
        await browser.evaluate("document.getElementById('confirm-no').click()")
        assert await browser.evaluate("document.getElementById('confirm-box').hidden") is True
        assert await _audit_sequence(uri) is None  # cancelled: nothing asked of the auditor

        await browser.evaluate(click)
        await browser.wait_for("the confirm box again", "!document.getElementById('confirm-box').hidden", 10.0)
        await browser.screenshot(_shots(tmp_path) / "action-confirm.png")
        await browser.evaluate("document.getElementById('confirm-yes').click()")
        text = await browser.wait_for("the action's result", "(t => t.includes('done') && t)"
                                      "(document.getElementById('action-result').textContent)", 20.0)
        assert '"sequence":1' in text, text
        assert await _audit_sequence(uri) == 1
    finally:
        await browser.stop()


async def _audit_sequence(uri: str) -> int | None:
    store = await connect(uri)
    try:
        return AuditRequest.from_bytes((await store.get(AUDIT_REQUEST_KEY)).value).sequence
    except NoSuchKeyError:
        return None
    finally:
        await store.close()


async def test_geo_lag_chart_grows_live_in_chromium(tmp_path: Path) -> None:
    """The /geo page's chart gains samples by itself (no reload), and falls to 0 when the link catches up."""
    points_js = ("(() => { const p = document.querySelector('svg.lag-chart[data-stream=\"prod/orders\"] "
                 "polyline.lag-records'); return p ? p.getAttribute('points').trim().split(/\\s+/).length : 0; })()")
    async with geo_console() as (url, metrics, _runner, _address):
        (tmp_path / "profile").mkdir()
        browser = Browser(tmp_path / "profile")
        await browser.start()
        try:
            await browser.open(f"{url}geo")
            await browser.evaluate("window.__noReload = 'still here'")
            first = await browser.wait_for("a chart with samples", points_js, 20.0)
            await browser.wait_for("more samples without a reload", f"{points_js} > {first}", 20.0)
            metrics.lag_records.labels("prod/orders", "us").set(0)
            await browser.wait_for("the link caught up on the page", "document.querySelector('.geo-link h3')"
                                   ".textContent.includes('— 0 records')", 20.0)
            assert await browser.evaluate("window.__noReload") == "still here"
            await browser.screenshot(_shots(tmp_path) / "geo.png")
        finally:
            await browser.stop()
