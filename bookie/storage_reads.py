"""The read path of ``DiskLedgerStorage`` (a layer of it, see ``storage_parts``).

An entry is looked up in the write cache, then in the cache being flushed, then through
the LMDB index in the entry logs. A range read takes consecutive entries a stretch at a
time: a slice of a write-cache run, or the records an index run record holds back to back
in one ``pread`` (entries outside runs one by one), up to ``max_entries`` and
``max_bytes``. An entry corrupt at rest ends a range after the entries before it; read
from it, it raises ``CorruptEntryError``. Reads keep working in read-only mode.
Long polls on the LAC wait in ``ledger_state.LacWaiters`` (bounded by
``lac_wait_timeout_s_max``).
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate

import lmdb

from scriba.bookie.storage_api import LacState
from scriba.bookie.storage_parts import StorageParts
from scriba.errors import CorruptEntryError, NoSuchEntryError, StorageError

__all__ = ["StorageReads"]


class StorageReads(StorageParts):
    """Entry, range and LAC reads (see the module docstring)."""

    def _lookup(self, ledger_id: int, entry_id: int) -> bytes | None:
        data = self._cache.get(ledger_id, entry_id)
        if data is not None:
            return data
        if self._flushing is not None:
            data = self._flushing.get(ledger_id, entry_id)
            if data is not None:
                return data
        try:
            loc = self._index.get(ledger_id, entry_id)
        except lmdb.Error as exc:
            raise StorageError(f"index read failed: {exc}") from exc
        if loc is None:
            return None
        try:
            return self._logs.read(loc, ledger_id, entry_id)
        except OSError as exc:
            raise StorageError(f"entry log read failed: {exc}") from exc

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        st = self._state(ledger_id)
        if entry_id == -1:
            entry_id = st.last_entry_id
        data = self._lookup(ledger_id, entry_id) if entry_id >= 0 else None
        if data is None:
            raise NoSuchEntryError(f"ledger {ledger_id} entry {entry_id} not stored")
        return data

    def read_range(
        self, ledger_id: int, first: int, last: int, max_entries: int, max_bytes: int
    ) -> list[bytes]:
        """Consecutive entries from ``first``, a stretch at a time: a slice of a write-cache
        run, or the records an index run record holds back to back in one ``pread``
        (entries outside runs one by one). An entry corrupt at rest ends the range after
        the entries before it (the next range read from it raises ``CorruptEntryError``)."""
        self._state(ledger_id)
        out: list[bytes] = []
        nbytes = 0
        eid = first
        count_max = min(last - first + 1, max_entries)
        while len(out) < count_max:
            want = count_max - len(out)
            error: CorruptEntryError | None = None
            got = self._cache.run_from(ledger_id, eid, want)
            if not got and self._flushing is not None:
                got = self._flushing.run_from(ledger_id, eid, want)
            if not got:
                got, error = self._read_logged(ledger_id, eid, want)
            if not got:
                if out:
                    break
                if error is not None:
                    raise error
                raise NoSuchEntryError(f"ledger {ledger_id} entry {eid} not stored")
            ends = list(accumulate(map(len, got), initial=nbytes))
            fit = max(bisect_right(ends, max_bytes) - 1, 0 if out else 1)
            out += got[:fit] if fit < len(got) else got
            if fit < len(got) or error is not None:
                break
            nbytes = ends[-1]
            eid += len(got)
        return out

    def _read_logged(
        self, ledger_id: int, entry_id: int, count_max: int
    ) -> tuple[list[bytes], CorruptEntryError | None]:
        """Up to ``count_max`` consecutive entries from ``entry_id`` out of the entry logs:
        those that verify, and the error of the corrupt one that ends them (if any)."""
        try:
            span = self._index.span(ledger_id, entry_id, count_max)
            if span is not None:
                return self._logs.read_span(span[0], span[1], ledger_id, entry_id)
            data = self._lookup(ledger_id, entry_id)
        except CorruptEntryError as exc:
            return [], exc
        except lmdb.Error as exc:
            raise StorageError(f"index read failed: {exc}") from exc
        except OSError as exc:
            raise StorageError(f"entry log read failed: {exc}") from exc
        return ([] if data is None else [data]), None

    async def wait_lac(self, ledger_id: int, previous_lac: int, timeout_s: float, *, entry: bool = False) -> LacState:
        return await self._waiters.wait_for_lac(
            self._states, self._state, ledger_id, previous_lac,
            min(timeout_s, self._config.lac_wait_timeout_s_max),
            stopped=lambda: self._closed, entry=entry,
        )

    def ledger_ids(self) -> list[int]:
        return sorted(self._states)
