"""Per-ledger state kept by a bookie, and the add-admission rules both storages share.

State per ledger: master key (fixed by the first add, fence or explicit LAC), fenced
flag, LAC (max of piggybacked and explicit LACs of stored entries) and the last stored
entry id. Admission (no I/O): read-only -> READ_ONLY; malformed -> BAD_REQUEST; key differs
from the ledger's first -> UNAUTHORIZED; fenced and not a recovery add -> FENCED; already
stored -> OK without a new write; otherwise the add must be journaled before it is OK.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Mapping, Sequence

from scriba.bookie.storage_api import AddColumns, AddOp, LacState
from scriba.entry import HEADER_SIZE
from scriba.errors import Status, TooManyRequestsError

LAC_WAITERS_MAX = 100_000
_IDS = struct.Struct(">Qq")  # the ledger and entry ids at the head of a packed entry


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

    Hot path: a batch of new entries of one ledger with one key is checked with a few
    whole-batch operations (no Python work per add); anything else goes add by add.
    """
    lids = adds.ledger_ids
    eids = adds.entry_ids
    keys = adds.master_keys
    entries = adds.entries
    n = len(entries)
    if n:
        lid = lids[0]
        key = keys[0]
        st = states.get(lid)
        sizes = list(map(len, entries))
        if (
            st is not None
            and st.master_key == key
            and (not st.fenced or (adds.recovery is not None and all(adds.recovery)))
            and min(eids) > st.last_entry_id
            and lids.count(lid) == n
            and keys.count(key) == n
            and min(sizes) >= HEADER_SIZE
            and max(sizes) <= entry_size_max
            and list(map(_IDS.unpack_from, entries)) == list(zip(lids, eids, strict=True))
        ):
            keyed.append((lid, key))
            return [Status.OK] * n, list(range(n))
    return _admit_each(states, adds, entry_size_max, has_entry, keyed)


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
