"""In-memory twin of the bookie's ledger storage (for unit tests and simulation).

Same contract and admission rules as ``DiskLedgerStorage`` (``ledger_state.admit_columns``):
master key fixed by the first add/fence, fencing, idempotent re-add keeping the first
bytes, long-poll ``wait_lac``, and the read-only switch. Everything is "durable" at once.
Test hooks: :meth:`fail_disk` (as if an fsync failed) and :meth:`set_disk_usage`.
"""

from __future__ import annotations

import asyncio
import operator
import struct
from collections.abc import Callable, Collection, Sequence
from itertools import islice

from scriba.bookie.ledger_state import (
    LacWaiters,
    LedgerState,
    LedgerStates,
    admit_columns,
    read_consecutive,
)
from scriba.bookie.storage_api import AddColumns, AddOp, LacState, ReadOnlySwitch
from scriba.entry import ENTRY_SIZE_MAX_DEFAULT
from scriba.errors import (
    BookieReadOnlyError,
    NoSuchEntryError,
    Status,
    StorageError,
    UnauthorizedError,
)

__all__ = ["InMemoryLedgerStorage"]

_LAC_AT_16 = struct.Struct(">16xq").unpack_from  # an entry's piggybacked LAC


class InMemoryLedgerStorage(LedgerStates):
    def __init__(
        self,
        *,
        entry_size_max: int = ENTRY_SIZE_MAX_DEFAULT,
        disk_total_bytes: int = 1 << 40,
        lac_wait_timeout_s_max: float = 120.0,
    ) -> None:
        self._entry_size_max = entry_size_max
        self._states: dict[int, LedgerState] = {}
        self._entries: dict[int, dict[int, bytes]] = {}
        self._switch = ReadOnlySwitch()
        self._waiters = LacWaiters()
        self._disk = (disk_total_bytes, disk_total_bytes)
        self._lac_wait_timeout_s_max = lac_wait_timeout_s_max
        self._closed = False

    # --- writes -----------------------------------------------------------------

    def _has_entry(self, ledger_id: int, entry_id: int) -> bool:
        entries = self._entries.get(ledger_id)
        return entries is not None and entry_id in entries

    async def add_batch(self, ops: Sequence[AddOp]) -> list[Status]:
        return await self.add_columns(AddColumns.of(ops))

    async def add_columns(self, adds: AddColumns) -> list[Status]:
        if self._switch.failed:
            return [Status.STORAGE] * len(adds)
        if self._switch.read_only or self._closed:
            return [Status.READ_ONLY] * len(adds)
        statuses, accepted = admit_columns(
            self._states, adds, self._entry_size_max, self._has_entry, []
        )
        lids, eids, entries = adds.ledger_ids, adds.entry_ids, adds.entries
        n = len(eids)
        if n and len(accepted) == n and lids.count(lids[0]) == n:
            # the common batch: new entries of one ledger in increasing order
            st = self._states[lids[0]]
            if eids[0] > st.last_entry_id and all(map(operator.lt, eids, islice(eids, 1, None))):
                self._entries.setdefault(lids[0], {}).update(zip(eids, entries, strict=True))
                st.last_entry_id = eids[-1]
                piggy = max(map(_LAC_AT_16, entries))[0]
                if piggy > st.lac:
                    st.lac = piggy
                    self._waiters.notify(lids[0])
                await asyncio.sleep(0)
                return statuses
        for i in accepted:
            lid = lids[i]
            eid = eids[i]
            entry = entries[i]
            stored = self._entries.setdefault(lid, {})
            if eid not in stored:
                stored[eid] = entry
            st = self._states[lid]
            before = st.lac
            st.note_entry(eid, entry)
            if st.lac != before:
                self._waiters.notify(lid)
        await asyncio.sleep(0)
        return statuses

    def _state_for_write(self, ledger_id: int, master_key: bytes) -> LedgerState:
        if self._switch.failed:
            raise StorageError(f"storage failed: {self._switch.failed}")
        st = self._states.get(ledger_id)
        if st is None:
            st = LedgerState(master_key)
            self._states[ledger_id] = st
        elif st.master_key != master_key:
            raise UnauthorizedError(f"ledger {ledger_id}: master key mismatch")
        return st

    async def fence(self, ledger_id: int, master_key: bytes) -> LacState:
        st = self._state_for_write(ledger_id, master_key)
        st.fenced = True
        await asyncio.sleep(0)
        return st.snapshot()

    async def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> None:
        if self._switch.read_only and not self._switch.failed:
            raise BookieReadOnlyError(f"read-only: {self._switch.reason}")
        st = self._state_for_write(ledger_id, master_key)
        if lac > st.explicit_lac:
            st.explicit_lac = lac
        if lac > st.lac:
            st.lac = lac
            self._waiters.notify(ledger_id)
        await asyncio.sleep(0)

    def note_lac(self, ledger_id: int, lac: int, master_key: bytes) -> None:
        st = self._state(ledger_id)
        if st.master_key != master_key:
            raise UnauthorizedError(f"ledger {ledger_id}: master key mismatch")
        if lac > st.lac:
            st.lac = lac
            self._waiters.notify(ledger_id)

    async def delete_ledgers(self, ledger_ids: Collection[int]) -> None:
        for lid in ledger_ids:
            self._states.pop(lid, None)
            self._entries.pop(lid, None)
            self._waiters.notify(lid)
        await asyncio.sleep(0)

    # --- reads ------------------------------------------------------------------

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        st = self._state(ledger_id)
        if entry_id == -1:
            entry_id = st.last_entry_id
        data = self._entries.get(ledger_id, {}).get(entry_id)
        if data is None:
            raise NoSuchEntryError(f"ledger {ledger_id} entry {entry_id} not stored")
        return data

    def read_range(
        self, ledger_id: int, first: int, last: int, max_entries: int, max_bytes: int
    ) -> list[bytes]:
        entries = self._entries.get(ledger_id, {})
        return read_consecutive(
            self.read_entry(ledger_id, first), entries.get, first, last, max_entries, max_bytes
        )

    async def wait_lac(self, ledger_id: int, previous_lac: int, timeout_s: float, *, entry: bool = False) -> LacState:
        # entries are stored when admitted here: ``entry`` needs no wait of its own
        return await self._waiters.wait_for_lac(
            self._states, self._state, ledger_id, previous_lac,
            min(timeout_s, self._lac_wait_timeout_s_max), entry=entry,
        )

    def ledger_ids(self) -> list[int]:
        return sorted(self._states)

    # --- state ------------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        return self._switch.read_only

    @property
    def read_only_reason(self) -> str:
        return self._switch.reason

    def disk_usage(self) -> tuple[int, int]:
        return self._disk

    def add_state_listener(self, cb: Callable[[bool, str], None]) -> None:
        self._switch.add_listener(cb)

    async def set_read_only(self, read_only: bool, reason: str) -> None:
        self._switch.update(forced=(reason or "operator") if read_only else "")

    def fail_disk(self, reason: str) -> None:
        """Test hook: behave as after a failed fsync (read-only until restart)."""
        self._switch.update(failed=reason or "disk failed")

    def set_disk_usage(self, free: int, total: int, *, full: bool | None = None) -> None:
        """Test hook: report this usage; ``full`` switches the disk-full cause."""
        self._disk = (free, total)
        if full is not None:
            self._switch.update(disk_full="disk full" if full else "")

    async def checkpoint(self) -> None:
        await asyncio.sleep(0)

    async def close(self) -> None:
        self._closed = True
        self._waiters.notify_all()
        await asyncio.sleep(0)
