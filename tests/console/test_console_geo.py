"""Geo lag charts: the bounded sample window (no I/O), the chart's SVG, and the console
scraping a replicator's ``/metrics`` — the real ``scriba.geo.metrics.GeoMetrics`` gauges,
served by a small HTTP server in the test — into ``/api/geo`` and the ``/geo`` page."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import generate_latest

from scriba.console import svg
from scriba.console.cli import Console, ConsoleConfig
from scriba.console.geo_lag import LagReading, LagWindow, parse_lag
from scriba.embedded.process import free_port
from scriba.geo.metrics import GeoMetrics
from tests.console.conftest import wait_for


def test_parse_reads_the_replicators_gauges() -> None:
    metrics = GeoMetrics()
    metrics.lag_records.labels("prod/orders", "us").set(12)
    metrics.lag_seconds.labels("prod/orders", "us").set(3.5)
    metrics.lag_records.labels("prod/payments", "us").set(0)
    metrics.shipped.labels("prod/orders", "us").set(999)  # not lag: ignored
    text = generate_latest(metrics.registry).decode()
    assert parse_lag(text) == [LagReading("prod/orders", "us", 12.0, 3.5), LagReading("prod/payments", "us", 0.0, 0.0)]
    assert parse_lag("# nothing here\n") == []


def test_window_is_bounded_in_time_samples_and_series() -> None:
    w = LagWindow(window_s=10.0, samples_max=4, series_max=2)
    for t in range(6):
        w.record(float(t), [LagReading("a/s", "us", t, t / 10)])
    [series] = w.series()
    assert [s[0] for s in series["samples"]] == [2.0, 3.0, 4.0, 5.0]  # samples_max
    assert series["records_behind"] == 5 and series["seconds_behind"] == 0.5
    w.record(6.0, [LagReading("b/s", "us", 1, 1), LagReading("c/s", "us", 1, 1)])
    assert [s["stream"] for s in w.series()] == ["a/s", "b/s"]  # series_max: c waits
    w.record(15.5, [LagReading("b/s", "us", 2, 2)])  # a's newest sample (5.0) is older than 15.5 - 10
    assert [s["stream"] for s in w.series()] == ["b/s"]
    assert [s[0] for s in w.series()[0]["samples"]] == [6.0, 15.5]
    w.expire(100.0)
    assert len(w) == 0


def test_chart_draws_each_sample_in_the_window() -> None:
    series = {"stream": "a/s", "source": "us", "samples": [[40.0, 0, 0.0], [70.0, 10, 2.0], [100.0, 5, 1.0]]}
    chart = svg.lag_chart(series, window_s=60.0, now_s=100.0, width=200, height=100)
    records = re.search(r'class="lag-records"[^>]*points="([^"]+)"', chart)
    assert records is not None
    points = [tuple(float(v) for v in p.split(",")) for p in records.group(1).split()]
    assert len(points) == 3
    assert points[0][0] == 56.0 and points[-1][0] == 200 - 56  # oldest at the left edge, newest at the right
    assert points[1][1] < points[2][1] < points[0][1]  # 10 records drawn highest, 0 lowest
    assert 'data-stream="a/s"' in chart and "lag-seconds" in chart


@contextlib.asynccontextmanager
async def geo_console() -> AsyncIterator[tuple[str, GeoMetrics, web.AppRunner, str]]:
    """A replicator's /metrics (the real GeoMetrics gauges, 40 records / 8 s behind) and a console
    scraping it every 0.2 s: (console URL, the gauges, the metrics server, its address)."""
    metrics = GeoMetrics()
    metrics.lag_records.labels("prod/orders", "us").set(40)
    metrics.lag_seconds.labels("prod/orders", "us").set(8.0)

    async def serve_metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", serve_metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    address = f"127.0.0.1:{free_port()}"
    site = web.TCPSite(runner, "127.0.0.1", int(address.rsplit(":", 1)[1]))
    await site.start()
    console = Console(ConsoleConfig(f"memory://geo-{uuid.uuid4().hex[:8]}", "127.0.0.1:0", probe_interval_s=0.2,
                                    geo_metrics=(address,), geo_window_s=60.0))
    url = await console.start()
    try:
        yield url, metrics, runner, address
    finally:
        await console.stop()
        await runner.cleanup()


async def test_console_scrapes_a_replicator_into_api_and_page() -> None:
    async with geo_console() as (url, metrics, runner, address):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async def geo() -> dict[str, Any]:
                async with http.get(url + "api/geo") as reply:
                    assert reply.status == 200
                    doc: dict[str, Any] = await reply.json()
                    return doc

            async def samples(n: int) -> Any:
                doc = await geo()
                return doc if doc["links"] and len(doc["links"][0]["samples"]) >= n else None

            doc = await wait_for("three lag samples", lambda: samples(3), 20.0)
            [link] = doc["links"]
            assert (link["stream"], link["source"], link["endpoint"]) == ("prod/orders", "us", address)
            assert link["records_behind"] == 40 and link["seconds_behind"] == 8.0
            assert doc["endpoints"] == [{"address": address, "up": True, "error": ""}]
            assert doc["window_s"] == 60.0

            metrics.lag_records.labels("prod/orders", "us").set(0)  # caught up: the chart falls to 0
            metrics.lag_seconds.labels("prod/orders", "us").set(0)

            async def caught_up() -> Any:
                doc = await geo()
                return doc if doc["links"][0]["records_behind"] == 0 else None

            doc = await wait_for("the link caught up", caught_up, 20.0)
            values = [s[1] for s in doc["links"][0]["samples"]]
            assert values[0] == 40 and values[-1] == 0
            async with http.get(url + "geo") as reply:
                page = await reply.text()
            assert reply.status == 200
            assert 'class="lag-chart" data-stream="prod/orders" data-source="us"' in page
            assert "prod/orders from us" in page

            await runner.cleanup()  # the replicator goes away: the page says so, the samples stay

            async def down() -> Any:
                doc = await geo()
                return doc if not doc["endpoints"][0]["up"] else None

            doc = await wait_for("the endpoint down", down, 20.0)
            assert doc["endpoints"][0]["error"] and doc["links"]


async def test_no_replicators_configured() -> None:
    console = Console(ConsoleConfig(f"memory://geo-{uuid.uuid4().hex[:8]}", "127.0.0.1:0"))
    url = await console.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async with http.get(url + "api/geo") as reply:
                assert (await reply.json())["links"] == []
            async with http.get(url + "geo") as reply:
                assert reply.status == 200 and "--geo-metrics" in await reply.text()
    finally:
        await console.stop()
