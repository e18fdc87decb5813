"""``while_leaderless``: call again while no leader answers, up to a deadline.

    session = await while_leaderless(rsm.open_session, rsm.config.propose_timeout_s)
    answer = await while_leaderless(lambda: rsm.read(request), rsm.config.read_timeout_s)

``propose``/``submit`` with a session retry so themselves; ``open_session`` and reads
do not, and a server that answers clients on top of a replica (the examples' etcd and
WebHDFS endpoints) wants them to wait out an election — a dead leader's session still
running, a transfer — rather than fail at once. Only ``RsmNotLeaderError`` and
``UnavailableError`` are retried: failures that changed nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from scriba.errors import RsmNotLeaderError, UnavailableError

T = TypeVar("T")
PAUSE_S: Final = 0.05


async def while_leaderless(call: Callable[[], Awaitable[T]], timeout_s: float, pause_s: float = PAUSE_S) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await call()
        except (RsmNotLeaderError, UnavailableError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(pause_s)
