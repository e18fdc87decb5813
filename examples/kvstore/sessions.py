"""``ConnectionSessions``: one exactly-once RSM session per client connection.

Every write a client connection sends (gRPC's peer, ``ipv4:host:port``: one TCP
connection, many multiplexed calls) is proposed under that connection's
:class:`~scriba.rsm.ClientSession`, opened on its first write. A proposal the RSM
retries after a fail-over keeps its session and sequence number, so it is applied
once; separate connections never share a session's sequence space.

Bounds: at most ``sessions_max`` sessions are held; the least recently used one is
dropped first, and any not used for ``idle_s``. Dropping only forgets it here: the
replicated session expires on the RSM's own clock (``session_ttl_ms``), and a
connection that comes back after that simply gets a new one. Two first writes of
one connection racing each other open a single session. The clock is passed in.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from scriba.rsm import ClientSession

SESSIONS_MAX = 10_000
IDLE_S = 300.0


class ConnectionSessions:
    def __init__(self, open_session: Callable[[], Awaitable[ClientSession]], *, sessions_max: int = SESSIONS_MAX,
                 idle_s: float = IDLE_S, clock: Callable[[], float] = time.monotonic) -> None:
        if sessions_max < 1 or idle_s <= 0:
            raise ValueError("sessions_max must be >= 1 and idle_s > 0")
        self._open = open_session
        self.sessions_max = sessions_max
        self.idle_s = idle_s
        self._clock = clock
        self._held: OrderedDict[str, tuple[asyncio.Future[ClientSession], float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    async def get(self, peer: str) -> ClientSession:
        """The session of connection ``peer``, opened on first use."""
        now = self._clock()
        self._drop_idle(now)
        held = self._held.get(peer)
        if held is None:
            future: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
            self._held[peer] = (future, now)
            while len(self._held) > self.sessions_max:
                self._held.popitem(last=False)
            try:
                future.set_result(await self._open())
            except BaseException as exc:
                if self._held.get(peer, (None,))[0] is future:
                    del self._held[peer]  # the next write of this connection tries again
                future.set_exception(exc)
                future.exception()  # retrieved: the waiters below re-raise it
                raise
            return future.result()
        self._held[peer] = (held[0], now)
        self._held.move_to_end(peer)
        return await asyncio.shield(held[0])

    def _drop_idle(self, now: float) -> None:
        while self._held:
            peer, (future, used) = next(iter(self._held.items()))
            if now - used < self.idle_s or not future.done():
                return
            del self._held[peer]
