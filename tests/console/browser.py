"""Headless Chromium driven over the DevTools protocol (a websocket; aiohttp's client).

Just what the console's tests need: open a page, evaluate JavaScript in it (to read the
DOM as the live page has it, after its script ran), take a screenshot. Chromium is
Debian's ``chromium`` (installed by .ci/run and scripts/test.sh); the tests skip where
it is absent.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
START_TIMEOUT_S = 30.0


class Browser:
    def __init__(self, profile_dir: Path) -> None:
        if CHROMIUM is None:
            raise RuntimeError("chromium is not installed")
        self._profile = profile_dir
        self._proc: asyncio.subprocess.Process | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            str(CHROMIUM), *["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--user-data-dir={self._profile}", "--window-size=1400,1000", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = self._profile / "DevToolsActivePort"
        end = time.monotonic() + START_TIMEOUT_S
        while not (text := await asyncio.to_thread(_read, port_file)):
            if time.monotonic() > end or self._proc.returncode is not None:
                raise RuntimeError(f"chromium did not start (exit {self._proc.returncode})")
            await asyncio.sleep(0.1)
        port = int(text.splitlines()[0])
        self._http = aiohttp.ClientSession()
        async with self._http.get(f"http://127.0.0.1:{port}/json/list") as reply:
            targets = await reply.json()
        page = next(t for t in targets if t["type"] == "page")
        self._ws = await self._http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)

    async def stop(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()
        if self._proc is not None:
            self._proc.terminate()
            try:
                async with asyncio.timeout(10):
                    await self._proc.wait()
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        if self._ws is None:
            raise RuntimeError("browser not started")
        call_id = next(self._ids)
        await self._ws.send_json({"id": call_id, "method": method, "params": params})
        async with asyncio.timeout(30):
            while True:
                msg = await self._ws.receive_json()
                if msg.get("id") == call_id:
                    if "error" in msg:
                        raise RuntimeError(f"{method}: {msg['error']}")
                    result: dict[str, Any] = msg.get("result", {})
                    return result

    async def open(self, url: str) -> None:
        await self.call("Page.enable")
        await self.call("Page.navigate", url=url)
        await self.wait_for("document loaded", "document.readyState === 'complete' && location.href", 20.0)

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, what: str, expression: str, deadline_s: float) -> Any:
        end = time.monotonic() + deadline_s
        value: Any = None
        while time.monotonic() < end:
            value = await self.evaluate(expression)
            if value:
                return value
            await asyncio.sleep(0.2)
        raise AssertionError(f"{what}: not within {deadline_s} s (last: {value!r})")

    async def screenshot(self, path: Path) -> Path:
        doc = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        await asyncio.to_thread(path.write_bytes, base64.b64decode(doc["data"]))
        return path


def _read(path: Path) -> str:
    return path.read_text().strip() if path.exists() else ""


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
