"""Headless Chromium driven by selenium, through Debian's ``chromedriver``.

Just what the console's tests need: open a page, evaluate JavaScript in it (to read the
DOM as the live page has it, after its script ran), take a screenshot. The browser is
Debian's ``chromium`` and the driver Debian's ``chromium-driver`` (both installed by
.ci/run); the tests skip where either is absent.

Selenium never fetches anything: the driver is given by path in the ``Service``, so
Selenium Manager (which would otherwise look for, and download, a driver and a browser)
is never run, and ``SE_OFFLINE`` tells it to stay offline should anything call it.

The consoles under test run in the test's own event loop, so every selenium call (a
blocking HTTP request to chromedriver) runs in a worker thread: the loop keeps serving
the pages the browser asks for. Every wait is bounded: the page-load and script
timeouts below, chromedriver's start, and each :meth:`Browser.wait_for`'s deadline.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from scriba.testing.waiting import eventually

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
PAGE_LOAD_TIMEOUT_S = 30.0
SCRIPT_TIMEOUT_S = 30.0

os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager, if anything reached it: no downloads


def missing() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    if CHROMIUM is None:
        return "chromium is not installed (apt-get install chromium)"
    if CHROMEDRIVER is None:
        return "chromedriver is not installed (apt-get install chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


class Browser:
    def __init__(self, profile_dir: Path) -> None:
        if (why := missing()) is not None:
            raise RuntimeError(why)
        self._profile = profile_dir
        self._driver: Any = None

    async def start(self) -> None:
        self._driver = await asyncio.to_thread(self._start)

    def _start(self) -> Any:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", f"--user-data-dir={self._profile}", "--window-size=1400,1000"):
            options.add_argument(arg)
        service = Service(executable_path=str(CHROMEDRIVER), log_output=subprocess.DEVNULL)
        driver = webdriver.Chrome(options=options, service=service)
        try:
            driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
            driver.set_script_timeout(SCRIPT_TIMEOUT_S)
        except BaseException:
            driver.quit()
            raise
        return driver

    async def stop(self) -> None:
        if self._driver is not None:
            driver, self._driver = self._driver, None
            await asyncio.to_thread(driver.quit)  # ends chromium, then chromedriver (waited for)

    def _live(self) -> Any:
        if self._driver is None:
            raise RuntimeError("browser not started")
        return self._driver

    async def open(self, url: str) -> None:
        await asyncio.to_thread(self._live().get, url)  # returns once the document has loaded
        await self.wait_for("document loaded", "document.readyState === 'complete' && location.href", 20.0)

    async def evaluate(self, expression: str) -> Any:
        """The value of the JavaScript ``expression`` in the open page (JSON-like values)."""
        return await asyncio.to_thread(self._live().execute_script, f"return ({expression});")

    async def wait_for(self, what: str, expression: str, deadline_s: float) -> Any:
        return await eventually(lambda: self.evaluate(expression), deadline_s, what=what, interval_s=0.2)

    async def screenshot(self, path: Path) -> Path:
        """The whole page (beyond the window too), as PNG."""
        doc = await asyncio.to_thread(self._live().execute_cdp_cmd, "Page.captureScreenshot",
                                      {"format": "png", "captureBeyondViewport": True})
        await asyncio.to_thread(path.write_bytes, base64.b64decode(doc["data"]))
        return path


STATES_JS = """JSON.stringify(Object.fromEntries([...document.querySelectorAll('g.bookie')].map(g => {
  const b = g.querySelector('rect').getBBox();
  const zone = [...document.querySelectorAll('rect.zone')].find(z => {
    const r = z.getBBox();
    return b.x >= r.x && b.x + b.width <= r.x + r.width && b.y >= r.y && b.y + b.height <= r.y + r.height;
  });
  return [g.dataset.bookie, [g.dataset.state, zone ? zone.dataset.zone : null,
                             g.querySelector('.b-state').textContent]];
})))"""
"""A JS expression: JSON of {bookie id: [state, zone whose box contains it, state text]}
read from the cluster map's SVG as the page shows it now."""


def parse_states(text: str) -> dict[str, list[str]]:
    doc: dict[str, list[str]] = json.loads(text)
    return doc
