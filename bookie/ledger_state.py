"""Per-ledger state kept by a bookie, and the add-admission rules both storages share.

State per ledger: master key (fixed by the first add, fence or explicit LAC), fenced
flag, LAC (max of piggybacked and explicit LACs of stored entries) and the last stored
entry id. Admission (no I/O): read-only -> READ_ONLY; malformed -> BAD_REQUEST; key differs
from the ledger's first -> UNAUTHORIZED; fenced and not a recovery add -> FENCED; already
stored -> OK without a new write; otherwise the add must be journaled before it is OK.
"""

from __future__ import annotations

import asyncio
import operator
import struct
from collections.abc import Callable, Mapping, Sequence
from itertools import groupby, islice, repeat

from scriba.bookie.storage_api import AddColumns, AddOp, LacState
from scriba.entry import HEADER_SIZE
from scriba.errors import NoSuchLedgerError, Status, TooManyRequestsError

LAC_WAITERS_MAX = 100_000
_IDS = struct.Struct(">Qq")  # the ledger and entry ids at the head of a packed entry
_LAC_AT = struct.Struct(">16xq").unpack_from  # an entry's piggybacked LAC


class LedgerState:
    __slots__ = ("explicit_lac", "fenced", "lac", "last_entry_id", "master_key")

    def __init__(
        self,
        master_key: bytes,
        fenced: bool = False,
        lac: int = -1,
        explicit_lac: int = -1,
        last_entry_id: int = -1,
    ) -> None:
        self.master_key = master_key
        self.fenced = fenced
        self.lac = lac
        self.explicit_lac = explicit_lac
        self.last_entry_id = last_entry_id

    def snapshot(self) -> LacState:
        return LacState(self.lac, self.last_entry_id, self.fenced)

    def note_entry(self, entry_id: int, entry: bytes) -> None:
        """Account for a durable stored entry (its piggybacked LAC and id)."""
        if entry_id > self.last_entry_id:
            self.last_entry_id = entry_id
        piggy = int.from_bytes(entry[16:24], "big", signed=True)
        if piggy > self.lac:
            self.lac = piggy


def admit_adds(
    states: dict[int, LedgerState],
    ops: Sequence[AddOp],
    entry_size_max: int,
    has_entry: Callable[[int, int], bool],
    keyed: list[tuple[int, bytes]],
) -> tuple[list[Status], list[int]]:
    """:func:`admit_columns` for a sequence of :class:`AddOp`."""
    return admit_columns(states, AddColumns.of(ops), entry_size_max, has_entry, keyed)


def admit_columns(
    states: dict[int, LedgerState],
    adds: AddColumns,
    entry_size_max: int,
    has_entry: Callable[[int, int], bool],
    keyed: list[tuple[int, bytes]],
) -> tuple[list[Status], list[int]]:
    """Statuses (OK meaning "OK once durable" for the accepted ones) and accepted indexes.

    Creates state for ledgers first seen here. Lists in ``keyed`` each ledger (run) with
    accepted adds and its master key: the caller journals a master-key record for each
    ahead of the adds, so replay never meets an add whose ledger key it does not know
    (even if an earlier record that created the ledger failed to reach the disk).
    """
    adm = admit_runs(states, adds, entry_size_max, has_entry, keyed, join=False)
    if not adm.runs:
        return adm.statuses, adm.rest
    return adm.statuses, adm.accepted()


class LedgerStates:
    """What a storage answers from its ledgers' in-memory states alone (``_states``), one
    code for the disk and the in-memory storage."""

    _states: dict[int, LedgerState]

    def _state(self, ledger_id: int) -> LedgerState:
        st = self._states.get(ledger_id)
        if st is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} not on this bookie")
        return st

    def lac_state(self, ledger_id: int) -> LacState:
        return self._state(ledger_id).snapshot()

    def ledger_master_key(self, ledger_id: int) -> bytes | None:
        st = self._states.get(ledger_id)
        return None if st is None else st.master_key


class RunAdd:
    """Adds of one ledger admitted whole: new ids, increasing (``consecutive``: by one).

    ``start``/``stop``: their indexes in the batch; ``lac``: the highest piggybacked LAC.
    """

    __slots__ = ("consecutive", "entries", "entry_ids", "lac", "ledger_id", "nbytes", "start", "stop")

    def __init__(self, ledger_id: int, entry_ids: Sequence[int], entries: Sequence[bytes],
                 lac: int, nbytes: int, consecutive: bool, start: int, stop: int) -> None:
        self.ledger_id = ledger_id
        self.entry_ids = entry_ids
        self.entries = entries
        self.lac = lac
        self.nbytes = nbytes
        self.consecutive = consecutive
        self.start = start
        self.stop = stop


class Admission:
    """What :func:`admit_runs` decided for a batch.

    ``statuses``: one per add; ``runs``: runs admitted whole; ``rest``: other accepted
    indexes (increasing); ``blob``: every entry of the batch concatenated (given by the
    caller or joined here; None if not asked) and ``sizes`` their sizes, for callers that
    journal the batch.
    """

    __slots__ = ("blob", "count", "rest", "runs", "sizes", "statuses")

    def __init__(self, statuses: list[Status], runs: list[RunAdd], rest: list[int],
                 blob: bytes | None, sizes: list[int]) -> None:
        self.statuses = statuses
        self.runs = runs
        self.rest = rest
        self.blob = blob
        self.sizes = sizes
        self.count = sum(r.stop - r.start for r in runs) + len(rest)

    def accepted(self) -> list[int]:
        out = list(self.rest)
        for r in self.runs:
            out += range(r.start, r.stop)
        out.sort()
        return out


_RUN_STRUCTS: dict[tuple[int, int], struct.Struct] = {}
_RUN_STRUCTS_MAX = 256


def _run_struct(count: int, size: int) -> struct.Struct:
    """Reads (ledger, entry, LAC) of ``count`` packed entries of ``size`` bytes each."""
    key = (count, size)
    st = _RUN_STRUCTS.get(key)
    if st is None:
        if len(_RUN_STRUCTS) >= _RUN_STRUCTS_MAX:
            _RUN_STRUCTS.clear()
        st = _RUN_STRUCTS[key] = struct.Struct(">" + f"Qqq{size - 24}x" * count)
    return st


def _segments(lids: Sequence[int]) -> list[tuple[int, int]]:
    """[start, stop) of each stretch of equal ledger ids."""
    n = len(lids)
    if not n:
        return []
    if lids.count(lids[0]) == n:
        return [(0, n)]
    out: list[tuple[int, int]] = []
    i = 0
    for _, group in groupby(lids):
        j = i + len(list(group))
        out.append((i, j))
        i = j
    return out


def admit_runs(
    states: dict[int, LedgerState],
    adds: AddColumns,
    entry_size_max: int,
    has_entry: Callable[[int, int], bool],
    keyed: list[tuple[int, bytes]],
    *,
    join: bool = True,
) -> Admission:
    """Admit a batch stretch by stretch of one ledger (see :func:`admit_columns`).

    ``join``: when no blob is given, build one (the caller journals it); without it the
    headers are read entry by entry and ``Admission.blob`` is None.

    Hot path: a stretch of new entries of a known ledger with one key and increasing ids
    is admitted whole by :func:`_whole_run` with a few whole-stretch operations; anything
    else goes add by add (:func:`_admit_each`), with the same outcome.
    """
    blob, sizes = _blob_and_sizes(adds, join)
    n = len(sizes)
    lids = adds.ledger_ids
    statuses: list[Status] = [Status.OK] * n
    runs: list[RunAdd] = []
    rest: list[int] = []
    offset = 0  # where the stretch starts in the blob
    for i, j in _segments(lids):
        whole = j - i == n
        seg_sizes = sizes if whole else sizes[i:j]
        run = _whole_run(states.get(lids[i]), adds, i, j, seg_sizes, blob, offset, entry_size_max)
        if run is not None:
            offset += run.nbytes
            keyed.append((run.ledger_id, adds.master_keys[i]))
            runs.append(run)
            continue
        offset += sum(seg_sizes)
        sub = adds if whole else AddColumns(
            lids[i:j], adds.entry_ids[i:j], adds.master_keys[i:j], adds.entries[i:j],
            None if adds.recovery is None else adds.recovery[i:j],
        )
        sub_statuses, sub_accepted = _admit_each(states, sub, entry_size_max, has_entry, keyed)
        statuses[i:j] = sub_statuses
        rest += [k + i for k in sub_accepted] if i else sub_accepted
    return Admission(statuses, runs, rest, blob, sizes)


def _blob_and_sizes(adds: AddColumns, join: bool) -> tuple[bytes | None, list[int]]:
    """The entries' sizes and concatenation: the caller's blob if it is exactly that, else
    one joined here (``join``) or None."""
    entries = adds.entries
    blob = adds.blob
    given = adds.sizes
    if blob is not None and given is not None and len(given) == len(entries):
        sizes = given if isinstance(given, list) else list(given)
    else:
        sizes = list(map(len, entries))
    if blob is not None and len(blob) != sum(sizes):
        blob = None  # not the entries' concatenation: ignored
        sizes = list(map(len, entries))
    if blob is None and join:
        blob = b"".join(entries)  # one copy, cheaper than reading headers entry by entry
    return blob, sizes


def _whole_run(
    st: LedgerState | None, adds: AddColumns, i: int, j: int, sizes: list[int],
    blob: bytes | None, offset: int, entry_size_max: int,
) -> RunAdd | None:
    """The stretch ``[i, j)`` of one ledger admitted whole (``sizes``: its sizes; it starts
    at ``offset`` in ``blob``), or None when it must go add by add: unknown ledger, another
    key, fenced (unless all are recovery adds), a size out of bounds, headers that do not
    name the adds' ids, ids not new and increasing."""
    c = j - i
    whole = c == len(adds.entries)
    keys = adds.master_keys
    key = keys[i]
    recovery = adds.recovery
    size = sizes[0]
    one_size = sizes.count(size) == c
    if (
        st is None
        or st.master_key != key
        or (keys if whole else keys[i:j]).count(key) != c
        or (st.fenced and not (recovery is not None and recovery[i:j].count(True) == c))
        or not (HEADER_SIZE <= size <= entry_size_max if one_size
                else min(sizes) >= HEADER_SIZE and max(sizes) <= entry_size_max)
    ):
        return None
    lid = adds.ledger_ids[i]
    eids = adds.entry_ids if whole else adds.entry_ids[i:j]
    entries = adds.entries if whole else adds.entries[i:j]
    nbytes = size * c if one_size else sum(sizes)
    if blob is not None and one_size:  # one size: every header in one call
        vals = _run_struct(c, size).unpack_from(blob, offset)
        got = vals[1::3]
        if vals[0::3].count(lid) != c or got != tuple(eids):
            return None
        first = got[0]
        consecutive = got[-1] - first == c - 1 and got == tuple(range(first, first + c))
        if first <= st.last_entry_id or not (
            consecutive or all(map(operator.lt, got, islice(got, 1, None)))
        ):
            return None
        lac = max(vals[2::3])
    else:
        if (
            list(map(_IDS.unpack_from, entries)) != list(zip(repeat(lid), eids))
            or eids[0] <= st.last_entry_id
            or not all(map(operator.lt, eids, islice(eids, 1, None)))
        ):
            return None
        consecutive = eids[-1] - eids[0] == c - 1
        lac = max(map(_LAC_AT, entries))[0]
    return RunAdd(lid, eids, entries, lac, nbytes, consecutive, i, j)


def _admit_each(
    states: dict[int, LedgerState],
    adds: AddColumns,
    entry_size_max: int,
    has_entry: Callable[[int, int], bool],
    keyed: list[tuple[int, bytes]],
) -> tuple[list[Status], list[int]]:
    statuses: list[Status] = []
    accepted: list[int] = []
    ok = Status.OK
    bad = Status.BAD_REQUEST
    ids = _IDS.unpack_from
    push = statuses.append
    last_lid = keyed_lid = -1
    st: LedgerState | None = None
    recovery = adds.recovery
    keys = adds.master_keys
    entries = adds.entries
    eids = adds.entry_ids
    for i, lid in enumerate(adds.ledger_ids):
        eid = eids[i]
        entry = entries[i]
        key = keys[i]
        n = len(entry)
        if n < HEADER_SIZE or n > entry_size_max or eid < 0 or ids(entry) != (lid, eid):
            push(bad)
            continue
        if lid != last_lid:
            last_lid = lid
            st = states.get(lid)
            if st is None:
                st = LedgerState(key)
                states[lid] = st
        if st.master_key != key:  # type: ignore[union-attr]
            push(Status.UNAUTHORIZED)
            continue
        if st.fenced and not (recovery is not None and recovery[i]):  # type: ignore[union-attr]
            push(Status.FENCED)
            continue
        push(ok)
        if eid <= st.last_entry_id and has_entry(lid, eid):  # type: ignore[union-attr]
            continue
        if lid != keyed_lid:
            keyed_lid = lid
            keyed.append((lid, key))
        accepted.append(i)
    return statuses, accepted


class LacWaiters:
    """Long-poll waiters per ledger, woken when the ledger's LAC moves (bounded count)."""

    def __init__(self, waiters_max: int = LAC_WAITERS_MAX) -> None:
        self._waiters: dict[int, list[asyncio.Future[None]]] = {}
        self.by_ledger = self._waiters  # read-only view for hot paths: `lid in by_ledger`
        self._count = 0
        self._waiters_max = waiters_max

    def __contains__(self, ledger_id: int) -> bool:
        return ledger_id in self._waiters

    def notify(self, ledger_id: int) -> None:
        futs = self._waiters.pop(ledger_id, None)
        if futs:
            for fut in futs:
                _resolve(fut)

    def notify_all(self) -> None:
        for lid in list(self._waiters):
            self.notify(lid)

    async def wait_for_lac(
        self,
        states: Mapping[int, LedgerState],
        state_of: Callable[[int], LedgerState],
        ledger_id: int,
        previous_lac: int,
        timeout_s: float,
        *,
        stopped: Callable[[], bool] = lambda: False,
        entry: bool = False,
    ) -> LacState:
        """Long poll: the ledger's state once its LAC passes ``previous_lac`` (with
        ``entry``: and entry ``previous_lac + 1`` is stored), or at the deadline (or when
        ``stopped()``) whatever it is; ``state_of`` raises for an unknown ledger at that
        point."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, 0.0)
        while True:
            st = states.get(ledger_id)
            if st is not None and st.lac > previous_lac and (not entry or st.last_entry_id > previous_lac):
                return st.snapshot()
            remaining = deadline - loop.time()
            if remaining <= 0 or stopped():
                return state_of(ledger_id).snapshot()
            await self.wait(ledger_id, remaining)

    async def wait(self, ledger_id: int, timeout_s: float) -> None:
        if timeout_s <= 0:
            return
        if self._count >= self._waiters_max:
            raise TooManyRequestsError(f"{self._count} long polls waiting (limit)")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._waiters.setdefault(ledger_id, []).append(fut)
        self._count += 1
        # The deadline resolves ``fut`` as ``notify`` does. Not ``wait_for``: it wakes this
        # task through a helper future, one loop turn later than ``notify`` resolving ``fut``
        # does (on a bookie whose loop also runs inline fdatasyncs, every turn a long poll's
        # answer waits is felt). Not ``asyncio.timeout``: it needs a task, and a long poll
        # starts eagerly, outside one (``scriba.eager``).
        expiry = loop.call_later(timeout_s, _resolve, fut)
        try:
            await fut
        finally:
            expiry.cancel()
            self._count -= 1
            futs = self._waiters.get(ledger_id)
            if futs is not None and fut in futs:
                futs.remove(fut)
                if not futs:
                    del self._waiters[ledger_id]


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def read_consecutive(
    first_entry: bytes,
    lookup: Callable[[int], bytes | None],
    first: int,
    last: int,
    max_entries: int,
    max_bytes: int,
) -> list[bytes]:
    """``first_entry`` then entries ``first + 1 ..`` from ``lookup`` while they are
    consecutive, up to ``last``, ``max_entries`` and ``max_bytes`` (one rule for both storages)."""
    out = [first_entry]
    size = len(first_entry)
    eid = first + 1
    while eid <= last and len(out) < max_entries:
        data = lookup(eid)
        if data is None or size + len(data) > max_bytes:
            break
        out.append(data)
        size += len(data)
        eid += 1
    return out
