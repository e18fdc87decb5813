"""A metadata session's state, shared by the drivers.

States: CONNECTED -> SUSPENDED (the driver cannot reach the store; do not trust
ephemerals or leadership) -> CONNECTED (same session, nothing was lost) or LOST
(the server ended the session: its ephemerals are gone). After LOST the driver
opens a new session and calls :meth:`SessionState.renew`, which reports CONNECTED
with a new ``session_id``.

Inputs: the driver's transitions (``set_state``, ``renew``), always on the event
loop. Outputs: listener calls, in order, one per change, on the event loop.
Invariant: a listener never sees the same state twice in a row, and LOST is
always followed by CONNECTED with a different ``session_id`` before anything else.

:func:`wait_connected` is how a holder of a session waits out SUSPENDED / LOST: it
returns once the session reports CONNECTED, or raises ``MetadataUnavailableError``
at its deadline (the bookie's start-up steps and the election's claim both use it).
"""

from __future__ import annotations

import asyncio
import time

from scriba.errors import MetadataUnavailableError
from scriba.log import get_logger
from scriba.meta.store import Session, SessionListener, SessionState

log = get_logger(__name__)

LISTENERS_MAX = 1024


class BasicSession:
    """Implements ``scriba.meta.store.Session`` for every driver."""

    def __init__(self, session_id: str) -> None:
        self._state = SessionState.CONNECTED
        self._session_id = session_id
        self._listeners: list[SessionListener] = []
        self._changed = asyncio.Event()
        self.changed_at_monotonic = time.monotonic()

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def session_id(self) -> str:
        return self._session_id

    def add_listener(self, listener: SessionListener) -> None:
        if len(self._listeners) >= LISTENERS_MAX:
            raise RuntimeError(f"more than {LISTENERS_MAX} session listeners (a leak?)")
        self._listeners.append(listener)

    def remove_listener(self, listener: SessionListener) -> None:
        try:
            self._listeners.remove(listener)
        except ValueError:
            pass

    def set_state(self, state: SessionState) -> None:
        """Move to ``state`` (no-op if already there) and tell every listener."""
        if state is self._state:
            return
        self._state = state
        self.changed_at_monotonic = time.monotonic()
        log.info("metadata_session_state", state=state.value, session_id=self._session_id)
        for listener in list(self._listeners):
            try:
                listener(state)
            except Exception:  # a listener's bug must not stop the driver
                log.exception("metadata_session_listener_failed", state=state.value)
        self._changed.set()
        self._changed = asyncio.Event()

    def renew(self, session_id: str) -> None:
        """A new session replaced a LOST one: report LOST (if not yet) then CONNECTED."""
        self.set_state(SessionState.LOST)
        self._session_id = session_id
        self.set_state(SessionState.CONNECTED)

    async def wait_change(self, timeout_s: float) -> bool:
        """Wait until the next state change (True) or ``timeout_s`` (False)."""
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


async def wait_connected(session: Session, timeout_s: float) -> None:
    """Return once ``session`` is CONNECTED; ``MetadataUnavailableError`` after ``timeout_s``."""
    if session.state is SessionState.CONNECTED:
        return
    connected = asyncio.Event()

    def on_state(state: SessionState) -> None:
        if state is SessionState.CONNECTED:
            connected.set()

    session.add_listener(on_state)
    try:
        if session.state is not SessionState.CONNECTED:
            await asyncio.wait_for(connected.wait(), max(0.0, timeout_s))
    except TimeoutError:
        raise MetadataUnavailableError(
            f"metadata session still {session.state.value} after {timeout_s:.1f}s"
        ) from None
    finally:
        session.remove_listener(on_state)
