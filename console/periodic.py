"""A task that does one round of work every ``interval_s`` until stopped — what the console's
bookie prober, RSM prober and geo scraper share (each a :class:`Periodic` with its ``tick``)."""

from __future__ import annotations

import asyncio
import contextlib


class Periodic:
    name = "console-periodic"

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    async def tick(self) -> None:
        """One round (probe everything once)."""
        raise NotImplementedError

    async def closed(self) -> None:
        """Release what the rounds opened (sessions, connections); after the task ended."""

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.closed()

    async def _run(self) -> None:
        while True:
            await self.tick()
            await asyncio.sleep(self.interval_s)
