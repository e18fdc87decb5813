"""The adds queued and in flight to each bookie, batched into messages: no I/O.

Theory of operation. Python gRPC moves a few thousand *messages* per second, so the
adds to one bookie travel in ``AddBatch`` messages, and inside a message the adds of
one ledger travel as an ``AddRun`` (entry ids and sizes packed, the packed entries
concatenated in one bytes field): no protobuf object per entry. ``BookieAdds`` holds
one bookie's side of it (the steps below), ``AddBatcher`` every bookie's and the one
push per entry; the transport (``grpc_transport.py``) owns the streams, the tasks and
the callbacks, and asks them what to send and whom an answer is for.

- ``AddBatcher.push(bookies, key, entry_id, entry)`` appends the add, for each bookie of
  the write set, to that bookie's open :class:`AddRun` (a new run when the open one's
  adds differ in ``key`` = callback, ledger, flags, master key and answer style, or it
  is full: ``batch_entries_max`` adds / ``batch_bytes_max`` bytes). No object per add:
  the entry id and the entry's bytes (the same object for every bookie of a write set)
  go into two lists; one call per entry, however many bookies (the hot path). Each
  key has its own open run while queued, so adds of interleaved ledgers travel as one
  run per ledger per message (a run's deadline is its first add's). It
  returns only the bookies that need the transport: WAKE (the sender should look),
  REFUSED (over ``inflight_bytes_hard_max``), STOPPED (the transport has not
  ``start``ed that bookie's stream, or ``stop``ped it: nothing was queued).
- ``BookieAdds.ready()`` applies the send rule: send while anything is queued, except that while
  ``batch_entries_max * batches_inflight_max`` adds are unanswered a partial message is
  held back until it fills or answers arrive (Nagle-like; one add in flight is never
  delayed). ``take_message(parts)`` moves whole runs, at least one, into one message of
  at most ``batch_entries_max`` adds and ``batch_bytes_max`` bytes, and registers their
  ids as sent.
- ``answer(ledger_id, ids)`` matches a bookie's answer to the runs that sent those ids
  with a few C-level dict operations (an add sent again while still pending waits in
  ``dups``, FIFO per id) and returns them grouped by run.
- ``expired(now)`` lists the runs whose deadline (``add_timeout_s`` after the run was
  opened) has passed, oldest first; ``drain()`` empties everything and returns each
  run's unanswered ids, for the transport to answer when the stream fails.

Invariants: every pushed add is returned exactly once, by ``answer`` or by ``drain``;
``inflight_bytes`` is the bytes of the unanswered runs (released when a run's last add
is answered) and a push beyond ``inflight_bytes_hard_max`` is refused (unless nothing
is in flight: one entry larger than the bound still goes); runs are kept in creation
order, so deadlines ascend.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from typing import Any, Final

from scriba.client.transport import TransportConfig
from scriba.proto import scriba_pb2 as pb
from scriba.proto.packed import varint

RunKey = tuple[Any, int, int, bytes, bool]
"""``(callback, ledger_id, flags, master_key, per_entry)``: what a run's adds share."""

QUEUED: Final = 0  # push: queued (never returned: the bookie is left out)
WAKE: Final = 1  # push: queued, and the sender should look (first add, or a full batch)
REFUSED: Final = 2  # push: over inflight_bytes_hard_max, not queued
STOPPED: Final = 3  # push: the bookie's stream is not started, not queued

_AddRun: Final = pb.AddRun
_RUNS_TAG: Final = b"\x12"  # AddBatch.runs: field 2, length-delimited
_ENTRIES_TAG: Final = b"\x32"  # AddRun.entries: field 6, length-delimited


class AddRun:
    """Adds of one ledger to one bookie that share master key, flags and callback."""

    __slots__ = (
        "callback",
        "deadline",
        "entries",
        "entry_ids",
        "flags",
        "key",
        "ledger_id",
        "master_key",
        "per_entry",
        "remaining",
        "sent",
        "size",
    )

    def __init__(self, key: RunKey, deadline: float) -> None:
        self.key = key
        # callback: an AddRunCallback, or an AddCallback answered add by add (per_entry)
        self.callback, self.ledger_id, self.flags, self.master_key, self.per_entry = key
        self.deadline = deadline
        self.entry_ids: list[int] = []
        self.entries: list[bytes] = []
        self.size = 0  # bytes of entries
        self.remaining = 0  # adds sent and not yet answered
        self.sent = False


def encode_run(run: AddRun, parts: list[bytes]) -> None:
    """Append ``run`` as one ``AddBatch.runs`` element on the wire to ``parts``.

    The ids, sizes and key go through protobuf (C); the entries field is framed by
    hand so that the entries are copied once, by the final ``b"".join``.
    """
    entries = run.entries
    head = _AddRun(
        ledger_id=run.ledger_id,
        master_key=run.master_key,
        flags=run.flags,
        entry_ids=run.entry_ids,
        sizes=list(map(len, entries)),
    ).SerializeToString()
    size = run.size
    if not size:  # proto3 leaves an empty bytes field out
        parts += (_RUNS_TAG, varint(len(head)), head)
        return
    size_varint = varint(size)
    parts += (_RUNS_TAG, varint(len(head) + 1 + len(size_varint) + size), head, _ENTRIES_TAG, size_varint)
    parts += entries


def _group(ids: Sequence[int], runs: Sequence[AddRun | None]) -> dict[AddRun, list[int]]:
    """Answered ids by the run that sent them (ids no run waits for are dropped)."""
    groups: dict[AddRun, list[int]] = {}
    for entry_id, run in zip(ids, runs, strict=True):
        if run is not None:
            groups.setdefault(run, []).append(entry_id)
    return groups


class BookieAdds:
    """One bookie's queued and unanswered adds (see the module docstring)."""

    __slots__ = (
        "_bytes_max",
        "_entries_max",
        "_window",
        "dups",
        "inflight_bytes",
        "ledgers",
        "open_runs",
        "queue",
        "queued_entries",
        "runs",
        "sent_unanswered",
    )

    def __init__(self, config: TransportConfig) -> None:
        self._entries_max = config.batch_entries_max
        self._bytes_max = config.batch_bytes_max
        self._window = config.send_window_entries
        self.queue: list[AddRun] = []  # runs not sent yet, in creation order
        # queued runs still taking adds, by key: adds of many ledgers interleaved (streams,
        # RSM groups, topics) still travel as one run per ledger per message, not one each
        self.open_runs: dict[RunKey, AddRun] = {}
        self.queued_entries = 0  # adds in ``queue``
        self.runs: dict[AddRun, None] = {}  # every unanswered run (queued or sent), creation order
        # sent and unanswered: ledger id -> entry id -> the run that sent it (the oldest);
        # an add sent again while it is pending waits in ``dups`` (FIFO per key)
        self.ledgers: dict[int, dict[int, AddRun]] = {}
        self.dups: dict[tuple[int, int], list[AddRun]] = {}
        self.inflight_bytes = 0  # bytes of the unanswered runs
        self.sent_unanswered = 0  # adds taken into messages, not yet answered

    # --- queueing (AddBatcher.push fills the runs) ------------------------------------
    def new_run(self, key: RunKey, deadline: float) -> AddRun:
        run = AddRun(key, deadline)
        self.queue.append(run)
        self.runs[run] = None
        self.open_runs[key] = run
        return run

    def ready(self) -> bool:
        """Whether a message should be sent now (the Nagle-like rule)."""
        queued = self.queued_entries
        return bool(queued) and (queued >= self._entries_max or self.sent_unanswered < self._window)

    def wants_more(self) -> bool:
        """After an answer: adds are queued and the send window has room."""
        return bool(self.queued_entries) and self.sent_unanswered < self._window

    def take_message(self, parts: list[bytes], encode: Callable[[AddRun, list[bytes]], None] | None = None) -> int:
        """Move whole queued runs (at least one, within the batch limits) into ``parts``
        as one message (each run by ``encode``: ``encode_run`` for gRPC); returns the
        number of adds taken."""
        encode = encode or encode_run
        entries_max, bytes_max = self._entries_max, self._bytes_max
        queue = self.queue
        count = size = taken = 0
        for run in queue:
            n = len(run.entry_ids)
            if taken and (count + n > entries_max or size + run.size > bytes_max):
                break
            taken += 1
            count += n
            size += run.size
            self._register(run)
            encode(run, parts)
        if taken == len(queue):
            self.queue = []
            self.open_runs = {}
        else:
            open_runs = self.open_runs
            for run in queue[:taken]:
                if open_runs.get(run.key) is run:
                    del open_runs[run.key]
            del queue[:taken]
        self.queued_entries -= count
        self.sent_unanswered += count
        return count

    def _register(self, run: AddRun) -> None:
        """``run`` is being sent: map its ids to it (an id already pending waits in dups)."""
        ids = run.entry_ids
        run.sent = True
        run.remaining = len(ids)
        pending = self.ledgers.get(run.ledger_id)
        if pending is None:
            pending = self.ledgers[run.ledger_id] = {}
        if pending and not pending.keys().isdisjoint(ids):
            for entry_id in ids:  # rare: a re-send of an add still pending
                if entry_id in pending:
                    self.dups.setdefault((run.ledger_id, entry_id), []).append(run)
                else:
                    pending[entry_id] = run
            return
        before = len(pending)
        pending.update(dict.fromkeys(ids, run))
        if len(pending) - before != len(ids):  # rare: one id twice in the run
            for entry_id, times in Counter(ids).items():
                if times > 1:
                    self.dups.setdefault((run.ledger_id, entry_id), []).extend([run] * (times - 1))

    # --- answers ----------------------------------------------------------------------
    def answer(self, ledger_id: int, ids: list[int]) -> tuple[Iterable[tuple[AddRun, list[int]]], bool]:
        """One bookie answer for ``ids`` of ``ledger_id``: the runs that sent them, with
        their ids, and whether a run was completed (its bytes released)."""
        n = len(ids)
        unanswered = self.sent_unanswered - n
        self.sent_unanswered = unanswered if unanswered > 0 else 0
        pending = self.ledgers.get(ledger_id)
        if pending is None:
            return (), False  # nothing of this ledger is pending (answered already)
        groups: Any
        if self.dups:
            groups = self._match_with_dups(ledger_id, pending, ids)
        else:
            runs = list(map(pending.pop, ids, repeat(None)))
            run = runs[0]
            groups = ((run, ids),) if run is not None and runs.count(run) == n else _group(ids, runs).items()
        if not pending:
            del self.ledgers[ledger_id]
        finished = False
        for run, entry_ids in groups:
            remaining = run.remaining - len(entry_ids)
            run.remaining = remaining
            if remaining <= 0:
                del self.runs[run]
                self.inflight_bytes -= run.size
                finished = True
        return groups, finished

    def _match_with_dups(
        self, ledger_id: int, pending: dict[int, AddRun], ids: list[int]
    ) -> Iterable[tuple[AddRun, list[int]]]:
        """Answered ids by run when some adds were sent again while pending (FIFO per id)."""
        runs: list[AddRun | None] = []
        dups = self.dups
        for entry_id in ids:
            run = pending.pop(entry_id, None)
            runs.append(run)
            if run is None:
                continue
            key = (ledger_id, entry_id)
            waiting = dups.get(key)
            if waiting:
                pending[entry_id] = waiting.pop(0)
                if not waiting:
                    del dups[key]
        return _group(ids, runs).items()

    # --- deadlines and failure -------------------------------------------------------------
    def expired(self, now: float) -> list[AddRun]:
        """Unanswered runs whose deadline has passed, oldest first."""
        expired: list[AddRun] = []
        for run in self.runs:  # creation order: deadlines ascend
            if run.deadline > now:
                break
            expired.append(run)
        return expired

    def drain(self) -> list[tuple[AddRun, list[int]]]:
        """Forget every queued and unanswered add; returns them by run (each add once)."""
        runs, ledgers, dups = self.runs, self.ledgers, self.dups
        self.runs, self.ledgers, self.dups = {}, {}, {}
        self.queue, self.open_runs, self.queued_entries = [], {}, 0
        self.sent_unanswered = 0
        self.inflight_bytes = 0
        left: dict[AddRun, list[int]] = {}  # sent runs: their unanswered ids
        for pending in ledgers.values():
            for entry_id, run in pending.items():
                left.setdefault(run, []).append(entry_id)
        for (_ledger_id, entry_id), waiting in dups.items():
            for run in waiting:
                left.setdefault(run, []).append(entry_id)
        out: list[tuple[AddRun, list[int]]] = []
        for run in runs:
            entry_ids = left.get(run) if run.sent else run.entry_ids
            if entry_ids:
                out.append((run, entry_ids))
        return out

    def pending(self) -> int:
        """Adds not yet answered (queued, sent, or sent again while pending)."""
        return (
            self.queued_entries
            + sum(map(len, self.ledgers.values()))
            + sum(map(len, self.dups.values()))
        )


class AddBatcher:
    """Every bookie's :class:`BookieAdds` for one transport, and which bookies take adds
    now (the transport ``start``s a bookie when its stream task starts and ``stop``s it
    when the stream fails or closes)."""

    __slots__ = ("_accepting", "_adds", "_bytes_max", "_clock", "_config", "_entries_max", "_hard_max", "_timeout_s")

    def __init__(self, config: TransportConfig, clock: Callable[[], float]) -> None:
        self._config = config
        self._entries_max = config.batch_entries_max
        self._bytes_max = config.batch_bytes_max
        self._hard_max = config.resolved_inflight_bytes_hard_max
        self._timeout_s = config.add_timeout_s
        self._clock = clock
        self._adds: dict[Any, BookieAdds] = {}
        self._accepting: dict[Any, BookieAdds] = {}

    def bookie(self, bookie_id: Any) -> BookieAdds:
        """The adds of ``bookie_id`` (created empty on first use)."""
        adds = self._adds.get(bookie_id)
        if adds is None:
            adds = self._adds[bookie_id] = BookieAdds(self._config)
        return adds

    def start(self, bookie_id: Any) -> None:
        self._accepting[bookie_id] = self.bookie(bookie_id)

    def stop(self, bookie_id: Any) -> None:
        self._accepting.pop(bookie_id, None)

    def push(
        self, bookies: Iterable[Any], key: RunKey, entry_id: int, entry: bytes
    ) -> list[tuple[Any, int]] | None:
        """Queue the add to each of ``bookies``; returns ``(bookie_id, WAKE | REFUSED |
        STOPPED)`` for the bookies that need the transport, None when none does.

        The hot path (once per entry): the limits are read once, the per-bookie work is
        inline, and the codes are literals."""
        size = len(entry)
        hard_max, entries_max, bytes_max = self._hard_max, self._entries_max, self._bytes_max
        accepting = self._accepting
        attention: list[tuple[Any, int]] | None = None
        for bookie_id in bookies:
            adds = accepting.get(bookie_id)
            if adds is None:
                code = 3  # STOPPED
            else:
                inflight = adds.inflight_bytes
                if inflight and inflight + size > hard_max:
                    code = 2  # REFUSED (one entry larger than the bound still goes alone)
                else:
                    adds.inflight_bytes = inflight + size
                    run = adds.open_runs.get(key)
                    if run is None:
                        run = adds.new_run(key, self._clock() + self._timeout_s)
                    ids = run.entry_ids
                    ids.append(entry_id)
                    run.entries.append(entry)
                    run_size = run.size + size
                    run.size = run_size
                    if len(ids) >= entries_max or run_size >= bytes_max:
                        del adds.open_runs[key]
                    queued = adds.queued_entries + 1
                    adds.queued_entries = queued
                    if queued != 1 and queued != entries_max:
                        continue  # QUEUED
                    code = 1  # WAKE: the first queued add, or a full batch's worth
            if attention is None:
                attention = [(bookie_id, code)]
            else:
                attention.append((bookie_id, code))
        return attention
