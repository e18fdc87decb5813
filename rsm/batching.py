"""Group commit of proposals: one record set per batch, results in batch order.

``add`` queues a proposal; ``take`` returns the next :class:`Batch` to append when
fewer than ``inflight_max`` batches are in flight (so proposals that arrive while
appends are in flight wait and go together into the next record set), at most
``records_max`` proposals or ``bytes_max`` bytes each. ``confirmed(batch_id, positions)``
records where a batch landed and returns the (item, position) pairs now ready to apply:
every batch strictly in send order, a confirmation that overtook an earlier batch
waits for it. ``fail_all`` ends the term: it returns every queued and in-flight item
(their outcome is unknown to the shell; the core only hands them back).

Invariant: items are released exactly once, in the order they were added.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from scriba.config import require
from scriba.invariant import invariant
from scriba.stream import Position

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Batch(Generic[T]):
    batch_id: int
    items: tuple[T, ...]


class ProposalBatcher(Generic[T]):
    def __init__(self, *, records_max: int, bytes_max: int, inflight_max: int) -> None:
        require(records_max >= 1, "batch_records_max", "must be >= 1")
        require(bytes_max >= 1, "batch_bytes_max", "must be >= 1")
        require(inflight_max >= 1, "batches_inflight_max", "must be >= 1")
        self.records_max = records_max
        self.bytes_max = bytes_max
        self.inflight_max = inflight_max
        self._queue: deque[tuple[T, int]] = deque()
        self._inflight: dict[int, Batch[T]] = {}  # sent, not yet released, by id (ids increase)
        self._confirmed: dict[int, Sequence[Position]] = {}
        self._next_id = 0
        self._next_release = 0
        self.queued_bytes = 0

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def add(self, item: T, size_bytes: int) -> None:
        self._queue.append((item, size_bytes))
        self.queued_bytes += size_bytes

    def take(self) -> Batch[T] | None:
        if not self._queue or len(self._inflight) >= self.inflight_max:
            return None
        items: list[T] = []
        total = 0
        while self._queue and len(items) < self.records_max:
            item, size = self._queue[0]
            if items and total + size > self.bytes_max:
                break
            self._queue.popleft()
            self.queued_bytes -= size
            items.append(item)
            total += size
        batch = Batch(self._next_id, tuple(items))
        self._next_id += 1
        self._inflight[batch.batch_id] = batch
        return batch

    def confirmed(self, batch_id: int, positions: Sequence[Position]) -> list[tuple[T, Position]]:
        batch = self._inflight.get(batch_id)
        invariant(batch is not None and batch_id not in self._confirmed, f"batch {batch_id} confirmed twice")
        assert batch is not None
        invariant(len(positions) == len(batch.items),
                  f"batch {batch_id}: {len(positions)} positions for {len(batch.items)} items")
        self._confirmed[batch_id] = positions
        ready: list[tuple[T, Position]] = []
        while self._next_release in self._confirmed:
            done = self._inflight.pop(self._next_release)
            ready.extend(zip(done.items, self._confirmed.pop(self._next_release), strict=True))
            self._next_release += 1
        return ready

    def fail_all(self) -> list[T]:
        """Every item not yet released (in flight, then queued), in order; the batcher is empty after."""
        items = [item for bid in sorted(self._inflight) for item in self._inflight[bid].items]
        items += [item for item, _ in self._queue]
        self._inflight.clear()
        self._confirmed.clear()
        self._queue.clear()
        self.queued_bytes = 0
        self._next_release = self._next_id
        return items
