"""A deterministic world for the ledger cores: one seed drives everything.

- ``World``: simulated time and an event heap (ties broken by insertion order), the
  seeded ``rng`` every random choice must come from, and ``clock`` (a
  ``scriba.clock.Clock`` on simulated time) for cores that take one.
- ``Net``: messages delayed by a seeded random amount (so they reorder) and dropped
  with probability ``drop_p``.
- ``SimBookie``: a journal that acknowledges adds only after a simulated fsync; a
  crash loses everything not yet fsynced (adds and fences alike). A fence goes through
  the journal in order, so it answers only once earlier adds are durable and visible.
  ``fencing=False`` is a negative control: the bookie records fences but keeps
  accepting adds; ``ack_before_fsync=True`` another: it acknowledges before the fsync,
  so a crash loses acknowledged adds.
- ``SimMeta``: one ledger record with versions; ``update`` is a CAS loop with delays
  between its read and its write, as ``scriba.meta.update_metadata`` runs it.
- ``SimTransport``: the client side: every request gets exactly one answer, a timeout
  when nothing came back in time.
- ``SimDriver``: carries out the cores' effects in this world (``send_add`` is the
  writer's send of one appended entry to its write set, as ``LedgerWriter`` does it).
- ``read_ledger``: a reader of a closed ledger in this world (replicas tried in a
  seeded order), and ``closed_ledger_problems``, the end-state checks of a recovered
  ledger, for a run's final checks.

Nothing here reads the real clock or an unseeded random source, so a run is a pure
function of its seed.
"""

from __future__ import annotations

import functools
import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scriba.client.effects import (
    CompleteAppends,
    DeliverEntries,
    FailAppends,
    OperationDone,
    OperationFailed,
    ReadEntries,
    ReadLac,
    SendAdd,
    StartTimer,
    WriteMetadata,
)
from scriba.client.read_core import ReadConfig, ReadCore
from scriba.client.transport import LacResult
from scriba.client.write_core import ChooseReplacement
from scriba.entry import HEADER, Digest, Entry
from scriba.errors import BadVersionError, NotEnoughBookiesError, ScribaError, Status
from scriba.ids import BookieId, EntryId
from scriba.meta.records import LedgerMetadata, LedgerState


class World:
    """Simulated time, the event heap and the seeded random source of one run."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.events = 0
        self.clock = SimClock(self)

    def at(self, delay_s: float, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` ``delay_s`` simulated seconds from now."""
        self._seq += 1
        heapq.heappush(self._heap, (self.now + delay_s, self._seq, fn, args))

    def run(self, until_s: float, after_event: Callable[[], None] | None = None) -> None:
        """Run events up to simulated time ``until_s``; ``after_event`` (a checker) after each."""
        heap = self._heap
        while heap and heap[0][0] <= until_s:
            when, _, fn, args = heapq.heappop(heap)
            self.now = when
            fn(*args)
            self.events += 1
            if after_event is not None:
                after_event()
        self.now = max(self.now, until_s)

    @property
    def idle(self) -> bool:
        return not self._heap


class SimClock:
    """``scriba.clock.Clock`` on a world's simulated time."""

    WALL_EPOCH_S = 1_700_000_000.0

    def __init__(self, world: World) -> None:
        self._world = world

    def monotonic(self) -> float:
        return self._world.now

    def wall(self) -> float:
        return self._world.now + self.WALL_EPOCH_S


class Net:
    """Delivers calls after a seeded delay in ``delay_s`` (so they reorder); drops with
    probability ``drop_p`` (change it mid-run to heal)."""

    def __init__(self, world: World, *, delay_s: tuple[float, float], drop_p: float) -> None:
        self.world = world
        self.delay_s = delay_s
        self.drop_p = drop_p

    def send(self, fn: Callable[..., None], *args: Any) -> None:
        rng = self.world.rng
        if self.drop_p and rng.random() < self.drop_p:
            return
        self.world.at(rng.uniform(*self.delay_s), fn, *args)


@dataclass(slots=True)
class _Ledger:
    master_key: bytes
    entries: dict[int, bytes] = field(default_factory=dict)
    lac: int = -1
    fenced: bool = False  # durable
    fenced_mem: bool = False  # in memory (lost on crash unless journaled)
    fence_requested: bool = False  # for the negative control's bookkeeping

    @property
    def last_entry_id(self) -> int:
        return max(self.entries, default=-1)


def _ignore(*_args: Any) -> None:
    pass


class SimBookie:
    def __init__(
        self,
        world: World,
        bookie_id: BookieId,
        *,
        fencing: bool = True,
        ack_before_fsync: bool = False,
        fsync_s: tuple[float, float] = (0.0001, 0.001),
    ) -> None:
        self.world = world
        self.bookie_id = bookie_id
        self.fencing = fencing
        self.ack_before_fsync = ack_before_fsync  # negative control: a crash loses acked adds
        self.fsync_s = fsync_s
        self.up = True
        self.ledgers: dict[int, _Ledger] = {}
        self._journal: list[tuple[str, Any]] = []
        self._epoch = 0
        self._fsync_due = False
        self.crashes = 0

    # --- faults -------------------------------------------------------------------
    def crash(self) -> None:
        if not self.up:
            return
        self.up = False
        self.crashes += 1
        self._epoch += 1
        self._journal.clear()
        self._fsync_due = False
        for state in self.ledgers.values():
            state.fenced_mem = state.fenced

    def restart(self) -> None:
        self.up = True

    def corrupt_one(self, ledger_id: int) -> int | None:
        """Flip a bit of one stored entry at rest (the bookie still serves it); its id."""
        state = self.ledgers.get(ledger_id)
        if state is None or not state.entries:
            return None
        entry_id = self.world.rng.choice(sorted(state.entries))
        data = state.entries[entry_id]
        state.entries[entry_id] = data[:-1] + bytes([data[-1] ^ 0x01])
        return entry_id

    # --- requests (replies go through ``reply`` callbacks) -------------------------
    def add(
        self, ledger_id: int, entry_id: int, master_key: bytes, entry: bytes, recovery: bool,
        reply: Callable[[Status], None],
    ) -> None:
        if not self.up:
            return
        state = self.ledgers.get(ledger_id)
        if state is not None and state.master_key != master_key:
            reply(Status.UNAUTHORIZED)
            return
        if state is not None and state.fenced_mem and not recovery and self.fencing:
            reply(Status.FENCED)
            return
        if self.ack_before_fsync:
            reply(Status.OK)
            reply = _ignore
        self._journal.append(("add", (ledger_id, entry_id, master_key, entry, reply)))
        self._schedule_fsync()

    def read_lac(
        self, ledger_id: int, fence: bool, master_key: bytes,
        reply: Callable[[LacResult | None, Status], None],
    ) -> None:
        if not self.up:
            return
        if fence:
            self._fence(ledger_id, master_key, lambda: reply(self._lac_result(ledger_id), Status.OK))
            return
        state = self.ledgers.get(ledger_id)
        if state is None:
            reply(None, Status.NO_SUCH_LEDGER)
            return
        reply(self._lac_result(ledger_id), Status.OK)

    def read_entry(
        self, ledger_id: int, entry_id: int, fence: bool, master_key: bytes,
        reply: Callable[[bytes | None, Status], None],
    ) -> None:
        if not self.up:
            return
        if fence:
            self._fence(ledger_id, master_key, lambda: self._answer_read(ledger_id, entry_id, reply))
            return
        self._answer_read(ledger_id, entry_id, reply)

    # --- internals -------------------------------------------------------------------
    def _answer_read(
        self, ledger_id: int, entry_id: int, reply: Callable[[bytes | None, Status], None]
    ) -> None:
        state = self.ledgers.get(ledger_id)
        if state is None:
            reply(None, Status.NO_SUCH_LEDGER)
            return
        data = state.entries.get(entry_id)
        if data is None:
            reply(None, Status.NO_SUCH_ENTRY)
        else:
            reply(data, Status.OK)

    def _lac_result(self, ledger_id: int) -> LacResult:
        state = self.ledgers.get(ledger_id)
        if state is None:
            return LacResult(EntryId(-1), EntryId(-1))
        last = state.last_entry_id
        return LacResult(
            EntryId(state.lac), EntryId(last), state.entries.get(last, b""), fenced=state.fenced
        )

    def _fence(self, ledger_id: int, master_key: bytes, then: Callable[[], None]) -> None:
        state = self.ledgers.get(ledger_id)
        if state is None:
            state = self.ledgers[ledger_id] = _Ledger(master_key)
        state.fenced_mem = True
        state.fence_requested = True
        self._journal.append(("fence", (ledger_id, then)))
        self._schedule_fsync()

    def _schedule_fsync(self) -> None:
        if not self._fsync_due:
            self._fsync_due = True
            self.world.at(self.world.rng.uniform(*self.fsync_s), self._fsync, self._epoch)

    def _fsync(self, epoch: int) -> None:
        if epoch != self._epoch or not self.up:
            return
        self._fsync_due = False
        batch, self._journal = self._journal, []
        for kind, args in batch:
            if kind == "add":
                ledger_id, entry_id, master_key, entry, reply = args
                state = self.ledgers.get(ledger_id)
                if state is None:
                    state = self.ledgers[ledger_id] = _Ledger(master_key)
                state.entries.setdefault(entry_id, entry)
                state.lac = max(state.lac, HEADER.unpack_from(entry)[2])
                reply(Status.OK)
            else:
                ledger_id, then = args
                self.ledgers[ledger_id].fenced = True
                then()


class SimMeta:
    """One ledger record, CAS-updated with a delay between read and write."""

    def __init__(self, world: World, record: LedgerMetadata, *, delay_s: tuple[float, float]) -> None:
        self.world = world
        self.record = record
        self.version = 1
        self.delay_s = delay_s
        self.history: list[LedgerMetadata] = [record]

    def _later(self, fn: Callable[..., None], *args: Any) -> None:
        self.world.at(self.world.rng.uniform(*self.delay_s), fn, *args)

    def update(
        self, effect: WriteMetadata,
        done: Callable[[LedgerMetadata | None, ScribaError | None], None],
        attempts_max: int = 32,
    ) -> None:
        attempts = [0]

        def read() -> None:
            self._later(got, self.record, self.version)

        def got(record: LedgerMetadata, version: int) -> None:
            try:
                if not effect.needs_update(record):
                    done(record, None)
                    return
                new = effect.transform(record)
            except ScribaError as exc:
                done(None, exc)
                return
            self._later(write, new, version)

        def write(new: LedgerMetadata, expected: int) -> None:
            if self.version != expected:
                attempts[0] += 1
                if attempts[0] >= attempts_max:
                    self._later(done, None, BadVersionError("gave up"))
                    return
                read()
                return
            self.record = new
            self.version += 1
            self.history.append(new)
            self._later(done, new, None)

        read()


class SimTransport:
    """Client side of the network: one answer per request, TIMEOUT if none in time."""

    def __init__(
        self, world: World, net: Net, bookies: dict[BookieId, SimBookie], *,
        add_timeout_s: float, read_timeout_s: float,
    ) -> None:
        self.world = world
        self.net = net
        self.bookies = bookies
        self.add_timeout_s = add_timeout_s
        self.read_timeout_s = read_timeout_s
        self._pending: dict[int, Callable[..., None]] = {}
        self._next = 0

    def _request(
        self, timeout_s: float, on_answer: Callable[..., None], timeout_args: tuple[Any, ...]
    ) -> Callable[..., None]:
        self._next += 1
        key = self._next
        self._pending[key] = on_answer

        def answer(*args: Any) -> None:
            cb = self._pending.pop(key, None)
            if cb is not None:
                cb(*args)

        def expire() -> None:
            answer(*timeout_args)

        self.world.at(timeout_s, expire)
        return lambda *args: self.net.send(answer, *args)

    def add(
        self, bookie_id: BookieId, ledger_id: int, entry_id: int, master_key: bytes, entry: bytes,
        on_response: Callable[[BookieId, int, int, Status], None], *, recovery: bool = False,
    ) -> None:
        def done(status: Status) -> None:
            on_response(bookie_id, ledger_id, entry_id, status)

        reply = self._request(self.add_timeout_s, done, (Status.TIMEOUT,))
        bookie = self.bookies[bookie_id]
        self.net.send(bookie.add, ledger_id, entry_id, master_key, entry, recovery, reply)

    def read_lac(
        self, bookie_id: BookieId, ledger_id: int, fence: bool, master_key: bytes,
        on_answer: Callable[[LacResult | None, Status], None],
    ) -> None:
        reply = self._request(self.read_timeout_s, on_answer, (None, Status.TIMEOUT))
        self.net.send(self.bookies[bookie_id].read_lac, ledger_id, fence, master_key, reply)

    def read_entry(
        self, bookie_id: BookieId, ledger_id: int, entry_id: int, fence: bool, master_key: bytes,
        on_answer: Callable[[bytes | None, Status], None],
    ) -> None:
        reply = self._request(self.read_timeout_s, on_answer, (None, Status.TIMEOUT))
        self.net.send(self.bookies[bookie_id].read_entry, ledger_id, entry_id, fence, master_key, reply)


def any_spare(world: World, bookie_ids: list[BookieId]) -> ChooseReplacement:
    """A placement stand-in for ``WriteCore``: any bookie not excluded, chosen by the
    world's seed; ``NotEnoughBookiesError`` when none is left."""

    def choose(ensemble: tuple[BookieId, ...], index: int, exclude: frozenset[BookieId]) -> BookieId:
        candidates = [b for b in bookie_ids if b not in exclude]
        if not candidates:
            raise NotEnoughBookiesError("sim: no spare bookie")
        return world.rng.choice(candidates)

    return choose


class SimDriver:
    """Executes one core's effects in the world; hooks report what happened."""

    def __init__(
        self, world: World, core: Any, transport: SimTransport, meta: SimMeta, *,
        ledger_id: int, master_key: bytes,
        on_complete: Callable[[int, int], None] | None = None,
        on_fail: Callable[[int, int, ScribaError], None] | None = None,
        on_deliver: Callable[[tuple[Any, ...]], None] | None = None,
        on_done: Callable[[object], None] | None = None,
        on_failed: Callable[[ScribaError], None] | None = None,
        after: Callable[[], None] | None = None,
        ack_window_s: float | None = None,
    ) -> None:
        self.world = world
        self.core = core
        # With ``ack_window_s`` (and a core that takes batches), OK/failed add answers of
        # one bookie arriving within the window reach ``on_add_responses`` together, as
        # the gRPC transport's run answers do.
        self.ack_window_s = ack_window_s if hasattr(core, "on_add_responses") else None
        self._acks: dict[tuple[BookieId, Status], list[int]] = {}
        self.transport = transport
        self.meta = meta
        self.ledger_id = ledger_id
        self.master_key = master_key
        self.on_complete = on_complete
        self.on_fail = on_fail
        self.on_deliver = on_deliver
        self.on_done = on_done
        self.on_failed = on_failed
        self.after = after
        self.finished = False

    def execute(self, effects: Any) -> None:
        for effect in effects:
            self._one(effect)
        if self.after is not None:
            self.after()

    def _on_add(self, bookie_id: BookieId, _ledger_id: int, entry_id: int, status: Status) -> None:
        key = (bookie_id, status)
        waiting = self._acks.get(key)
        if waiting is None:
            waiting = self._acks[key] = []
            self.world.at(self.ack_window_s or 0.0, self._flush_acks, key)
        waiting.append(entry_id)

    def _flush_acks(self, key: tuple[BookieId, Status]) -> None:
        entry_ids = self._acks.pop(key)
        self.execute(self.core.on_add_responses(key[0], entry_ids, key[1]))

    def send_add(
        self, entry_id: int, packed: bytes, bookies: tuple[BookieId, ...], *, recovery: bool = False
    ) -> None:
        """One entry to the bookies of its write set (``WriteCore.append``'s send, or a
        ``SendAdd`` effect); answers go back to the core."""
        core = self.core
        on_response = (
            self._on_add if self.ack_window_s is not None
            else lambda b, _l, e, s: self.execute(core.on_add_response(b, e, s))
        )
        for bookie_id in bookies:
            self.transport.add(
                bookie_id, self.ledger_id, entry_id, self.master_key, packed, on_response,
                recovery=recovery,
            )

    def _on_entry(self, bookie_id: BookieId, entry_id: int, data: bytes | None, status: Status) -> None:
        self.execute(self.core.on_entry(bookie_id, entry_id, data, status))

    def _one(self, effect: Any) -> None:
        core = self.core
        t = self.transport
        if isinstance(effect, SendAdd):
            self.send_add(effect.entry_id, effect.entry, effect.bookies, recovery=effect.recovery)
        elif isinstance(effect, CompleteAppends):
            if self.on_complete is not None:
                self.on_complete(effect.first, effect.last)
        elif isinstance(effect, FailAppends):
            if self.on_fail is not None:
                self.on_fail(effect.first, effect.last, effect.error)
        elif isinstance(effect, WriteMetadata):
            def done(record: LedgerMetadata | None, error: ScribaError | None) -> None:
                if error is not None:
                    self.execute(core.on_metadata_failed(error))
                else:
                    self.execute(core.on_metadata_written(record))

            self.meta.update(effect, done)
        elif isinstance(effect, ReadLac):
            b = effect.bookie_id
            t.read_lac(
                b, self.ledger_id, effect.fence, self.master_key,
                lambda result, status: self.execute(core.on_lac_response(b, result, status)),
            )
        elif isinstance(effect, ReadEntries):
            b = effect.bookie_id
            for entry_id in effect.entry_ids:
                t.read_entry(
                    b, self.ledger_id, entry_id, effect.fence, self.master_key,
                    functools.partial(self._on_entry, b, entry_id),
                )
        elif isinstance(effect, StartTimer):
            key = effect.key
            self.world.at(effect.delay_s, lambda: self.execute(core.on_timer(key)))
        elif isinstance(effect, DeliverEntries):
            if self.on_deliver is not None:
                self.on_deliver(effect.entries)
        elif isinstance(effect, OperationDone):
            self.finished = True
            if self.on_done is not None:
                self.on_done(effect.value)
        elif isinstance(effect, OperationFailed):
            self.finished = True
            if self.on_failed is not None:
                self.on_failed(effect.error)
        else:
            raise AssertionError(f"unexpected effect {effect!r}")


def read_ledger(
    world: World, record: LedgerMetadata, transport: SimTransport, meta: SimMeta, *,
    ledger_id: int, digest: Digest, master_key: bytes, order_seed: int, run_s: float = 2.0,
) -> tuple[list[Entry], str | None]:
    """Read every entry of the closed ``record`` (replicas in an order seeded by
    ``order_seed``); returns the entries and None, or what was read and why it failed."""
    rng_order = World(order_seed).rng
    got: list[Entry] = []
    failure: list[str] = []
    core = ReadCore(
        record, 0, record.last_entry_id, digest=digest,
        read_order=lambda ws: rng_order.sample(list(ws), len(ws)),
        config=ReadConfig(entries_window=8, batch_entries_max=4, speculative_timeout_s=0.005),
    )
    driver = SimDriver(
        world, core, transport, meta, ledger_id=ledger_id, master_key=master_key,
        on_deliver=lambda entries: got.extend(entries),
        on_failed=lambda err: failure.append(str(err)),
    )
    driver.execute(core.start())
    world.run(world.now + run_s)
    if failure or not driver.finished:
        return got, str(failure or "did not finish")
    return got, None


def closed_ledger_problems(record: LedgerMetadata, recovered: list[LedgerMetadata],
                           confirmed_last: int) -> list[str]:
    """What is wrong with a run's end state: the ledger not CLOSED, a recoverer that
    returned another record, or a confirmed entry beyond the closed end (lost)."""
    if record.state is not LedgerState.CLOSED:
        return [f"ledger not closed at the end ({record.state.value})"]
    last = int(record.last_entry_id)
    problems = [f"a recoverer returned {other.last_entry_id}, the record says {last}"
                for other in recovered if other != record]
    if confirmed_last > last:
        problems.append(f"confirmed entry {confirmed_last} lost: the ledger closed at {last}")
    return problems
