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
from scriba.errors import Status, TooManyRequestsError

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
    is checked with a few whole-stretch operations (entries of one size: one ``struct``
    call reads every header from the batch's blob); anything else goes add by add.
    """
    entries = adds.entries
    n = len(entries)
    lids = adds.ledger_ids
    eids = adds.entry_ids
    keys = adds.master_keys
    recovery = adds.recovery
    blob = adds.blob
    given = adds.sizes
    if blob is not None and given is not None and len(given) == n:
        sizes = given if isinstance(given, list) else list(given)
    else:
        sizes = list(map(len, entries))
    if blob is not None and len(blob) != sum(sizes):
        blob = None  # not the entries' concatenation: ignored
        sizes = list(map(len, entries))
    if blob is None and join:
        blob = b"".join(entries)  # one copy, cheaper than reading headers entry by entry
    statuses: list[Status] = [Status.OK] * n
    runs: list[RunAdd] = []
    rest: list[int] = []
    offset = 0
    for i, j in _segments(lids):
        c = j - i
        lid = lids[i]
        key = keys[i]
        st = states.get(lid)
        seg_sizes = sizes[i:j] if c != n else sizes
        size = seg_sizes[0]
        one_size = seg_sizes.count(size) == c
        seg_bytes = size * c if one_size else sum(seg_sizes)
        run = None
        if (
            st is not None
            and st.master_key == key
            and (keys if c == n else keys[i:j]).count(key) == c
            and (not st.fenced or (recovery is not None and recovery[i:j].count(True) == c))
            and (HEADER_SIZE <= size <= entry_size_max if one_size
                 else min(seg_sizes) >= HEADER_SIZE and max(seg_sizes) <= entry_size_max)
        ):
            seg_eids = eids[i:j] if c != n else eids
            if blob is not None and one_size:  # one size: every header in one call
                vals = _run_struct(c, size).unpack_from(blob, offset)
                got = vals[1::3]
                if vals[0::3].count(lid) == c and got == tuple(seg_eids):
                    first = got[0]
                    consecutive = got[-1] - first == c - 1 and got == tuple(range(first, first + c))
                    if first > st.last_entry_id and (
                        consecutive or all(map(operator.lt, got, islice(got, 1, None)))
                    ):
                        run = RunAdd(lid, seg_eids, entries[i:j] if c != n else entries,
                                     max(vals[2::3]), seg_bytes, consecutive, i, j)
            else:
                seg_entries = entries[i:j] if c != n else entries
                if (
                    list(map(_IDS.unpack_from, seg_entries)) == list(zip(repeat(lid), seg_eids))
                    and seg_eids[0] > st.last_entry_id
                    and all(map(operator.lt, seg_eids, islice(seg_eids, 1, None)))
                ):
                    first = seg_eids[0]
                    run = RunAdd(lid, seg_eids, seg_entries, max(map(_LAC_AT, seg_entries))[0],
                                 seg_bytes, seg_eids[-1] - first == c - 1, i, j)
        offset += seg_bytes
        if run is not None:
            keyed.append((lid, key))
            runs.append(run)
            continue
        sub = adds if c == n else AddColumns(
            lids[i:j], eids[i:j], keys[i:j], entries[i:j],
            None if recovery is None else recovery[i:j],
        )
        sub_statuses, sub_accepted = _admit_each(states, sub, entry_size_max, has_entry, keyed)
        statuses[i:j] = sub_statuses
        rest += [k + i for k in sub_accepted] if i else sub_accepted
    return Admission(statuses, runs, rest, blob, sizes)


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
                if not fut.done():
                    fut.set_result(None)

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
    ) -> LacState:
        """Long poll: the ledger's state once its LAC passes ``previous_lac``, or at the
        deadline (or when ``stopped()``) whatever it is; ``state_of`` raises for an unknown
        ledger at that point."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, 0.0)
        while True:
            st = states.get(ledger_id)
            if st is not None and st.lac > previous_lac:
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
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(ledger_id, []).append(fut)
        self._count += 1
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            pass
        finally:
            self._count -= 1
            futs = self._waiters.get(ledger_id)
            if futs is not None and fut in futs:
                futs.remove(fut)
                if not futs:
                    del self._waiters[ledger_id]


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
