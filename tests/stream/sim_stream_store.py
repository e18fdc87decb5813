"""The stream simulation's metadata store (``sim_stream.py``): the stream record, the
writer lock and ledger ids, every answer after a seeded delay.

- The stream record is the simulation kit's CAS loop (``SimMeta``): a writer's
  ``UpdateStream`` step is tried against the record as it is when it arrives.
- The writer lock: each writer process has a session; ``campaign`` queues it, the lock
  goes to the first live session in the queue, and its token is the store's revision at
  that moment (strictly increasing). A session expires ``SESSION_TTL_S`` after its
  process stops answering (``expire``: crashed, or paused longer than that), which
  releases the lock; the process learns it late or never (``sim_stream_writer.py``).
- Ledgers: each segment ledger's metadata is a ``SimMeta`` of its own; ids are
  allocated in order; deleted ids are remembered for the final checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scriba.meta.records import LedgerMetadata
from scriba.stream.segments import (
    StreamRecord,
)
from scriba.testing.sim import (
    SimMeta,
    World,
)

SESSION_TTL_S = 0.03


class StreamStore:
    def __init__(self, world: World, record: StreamRecord, *, delay_s: tuple[float, float]) -> None:
        self.world = world
        self.delay_s = delay_s
        self.stream = SimMeta(world, record, delay_s=delay_s)  # type: ignore[arg-type]
        self.ledgers: dict[int, SimMeta] = {}
        self.deleted: set[int] = set()
        self._next_ledger_id = 100
        self._next_session = 0
        self._live: set[int] = set()
        self._holder: int | None = None
        self._revision = 0
        self._queue: list[tuple[int, Callable[[int], None]]] = []

    @property
    def record(self) -> StreamRecord:
        record: StreamRecord = self.stream.record  # type: ignore[assignment]
        return record

    def later(self, fn: Callable[..., None], *args: Any) -> None:
        self.world.at(self.world.rng.uniform(*self.delay_s), fn, *args)

    # sessions and the lock (tokens: the store's revision when the lock was taken)
    def new_session(self) -> int:
        self._next_session += 1
        self._live.add(self._next_session)
        return self._next_session

    def campaign(self, session: int, granted: Callable[[int], None]) -> None:
        def arrive() -> None:
            if session in self._live:
                self._queue.append((session, granted))
                self._grant()

        self.later(arrive)

    def _grant(self) -> None:
        while self._holder is None and self._queue:
            session, granted = self._queue.pop(0)
            if session in self._live:
                self._revision += 1
                self._holder = session
                self.later(granted, self._revision)

    def release(self, session: int) -> None:
        if self._holder == session:
            self._holder = None
            self._grant()

    def expire(self, session: int) -> None:
        self._live.discard(session)
        self._queue = [q for q in self._queue if q[0] != session]
        self.release(session)

    # ledgers
    def create_ledger(self, md: LedgerMetadata) -> SimMeta:
        meta = self.ledgers[int(md.ledger_id)] = SimMeta(self.world, md, delay_s=self.delay_s)
        return meta

    def allocate_ledger_id(self) -> int:
        self._next_ledger_id += 1
        return self._next_ledger_id
