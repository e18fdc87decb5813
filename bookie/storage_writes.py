"""The add path of ``DiskLedgerStorage`` (a layer of it, see ``storage_parts``).

``add_columns`` (``add_batch``) admits adds (``ledger_state.admit_runs``: a stretch of new
entries of one ledger is checked whole), encodes the accepted ones as ONE journal record
(after a master-key record per ledger of the batch) with one copy of the entries
(``adds_record``), and awaits the journal's group commit; when the group is durable,
``_on_durable`` (event loop, in journal order) appends each admitted run to the write
cache, then the batch returns. The LACs the admitted entries carry are raised at
admission, before the journal write (``_raise_carried_lacs``): tailing readers' long
polls answer without waiting for this bookie's fdatasync of the entry that brought the
news. The journal's queue is bounded (``journal_queue_bytes_max``) and the write cache
too (an add waits for a running checkpoint when the cache is twice its bound).

Fences and explicit LACs are journaled with the ledger's master-key record before they
are answered; an explicit LAC is visible at once (the writer confirmed it).

Invariant: an add is OK only after its journal record's fdatasync returned.
"""

from __future__ import annotations

import asyncio
import struct
import sys
from array import array
from collections.abc import Sequence
from typing import Any, Final

import google_crc32c

from scriba.bookie import journal as jr
from scriba.bookie.journal import DiskFullError, JournalPosition
from scriba.bookie.ledger_state import Admission, LedgerState, RunAdd, admit_runs
from scriba.bookie.storage_api import AddColumns, AddOp, LacState
from scriba.bookie.storage_checkpoints import StorageCheckpoints
from scriba.errors import BookieReadOnlyError, Status, StorageError, UnauthorizedError
from scriba.invariant import InvariantViolation
from scriba.log import get_logger

__all__ = ["StorageWrites", "adds_record"]

log = get_logger(__name__)

_ADDS: Final = 1
_LAC: Final = 2
_U32: Final = struct.Struct(">I")
_U32_ARRAY_OK: Final = array("I").itemsize == 4
_KEY_RECORDS_MAX: Final = 100_000
_crc_value = google_crc32c.value
_crc_extend = google_crc32c.extend


def adds_record(
    sizes: Sequence[int], blob: bytes | None, entries: Sequence[bytes], prefix: list[bytes]
) -> bytes:
    """``prefix`` (framed records) then one framed journal ADDS record, in one buffer.

    The entries come with their ``sizes``, concatenated in ``blob`` when the caller has
    that; the bytes are exactly ``b"".join(prefix) + journal.encode_adds(entries)`` (the
    journal's format), built with one copy of the entries and whole-batch operations.
    """
    n = len(sizes)
    size = sizes[0]
    if sizes.count(size) == n:
        lens = _U32.pack(size) * n
    elif _U32_ARRAY_OK:
        arr = array("I", sizes)
        if sys.byteorder == "little":
            arr.byteswap()
        lens = arr.tobytes()
    else:
        lens = struct.pack(f">{n}I", *sizes)
    head = b"\x01" + _U32.pack(n) + lens
    if blob is not None:
        body_len = _U32.pack(len(head) + len(blob))
        crc = _crc_extend(_crc_extend(_crc_value(body_len), head), blob)
        prefix += (body_len, _U32.pack(crc), head, blob)
        return b"".join(prefix)
    body_len = _U32.pack(len(head) + sum(sizes))
    crc = _crc_extend(_crc_value(body_len), head)
    for entry in entries:
        crc = _crc_extend(crc, entry)
    prefix += (body_len, _U32.pack(crc), head)
    prefix += entries
    return b"".join(prefix)


class StorageWrites(StorageCheckpoints):
    """Adds, fences and explicit LACs, and the journal's durable callback."""

    def _on_durable(self, tokens: list[Any], pos: JournalPosition) -> None:
        states = self._states
        cache = self._cache
        dirty = self._dirty
        waiters = self._waiters
        st: LedgerState | None
        for token in tokens:
            if token is None:
                continue
            if token[0] == _ADDS:
                _, adds, rest, runs = token
                for run in runs:
                    self._apply_run(run)
                if rest:
                    self._apply_each(adds.ledger_ids, adds.entry_ids, adds.entries, rest)
            else:  # explicit LAC
                _, lid, lac = token
                st = states.get(lid)
                if st is not None:
                    st.explicit_lac = max(st.explicit_lac, lac)
                    if lac > st.lac:
                        st.lac = lac
                        waiters.notify(lid)
                    dirty.add(lid)
        self._applied_pos = pos
        if cache.bytes >= self._cache_bytes_max and (
            self._flush_task is None or self._flush_task.done()
        ):
            self._flush_task = self._loop.create_task(self.checkpoint())

    def _apply_run(self, run: RunAdd) -> None:
        """Durable new entries of one ledger into the write cache (whole-run operations)."""
        lid = run.ledger_id
        st = self._states.get(lid)
        if st is None:
            return  # deleted meanwhile
        eids = run.entry_ids
        if eids[0] <= st.last_entry_id:  # another batch stored some of these meanwhile
            self._apply_each([lid] * len(eids), eids, run.entries, range(len(eids)))
            return
        if run.consecutive:
            self._cache.append_run(lid, eids[0], run.entries, run.nbytes)
        else:
            put = self._cache.put
            for eid, entry in zip(eids, run.entries, strict=True):
                put(lid, eid, entry)
        st.last_entry_id = eids[-1]
        self._dirty.add(lid)
        if run.lac > st.lac or st.lac >= eids[0]:  # an LAC, or entries it covers a poll waits to carry
            st.lac = max(st.lac, run.lac)
            if lid in self._waiters.by_ledger:
                self._waiters.notify(lid)

    def _apply_each(
        self, lids: Sequence[int], eids: Sequence[int], datas: Sequence[bytes], indexes: Sequence[int]
    ) -> None:
        """Durable adds one by one (any order, any ledgers; already stored ones skipped)."""
        states = self._states
        put = self._cache.put
        waiters = self._waiters
        waiting = waiters.by_ledger
        dirty = self._dirty
        from_bytes = int.from_bytes
        last_lid = -1
        st: LedgerState | None = None
        for i in indexes:
            lid = lids[i]
            if lid != last_lid:
                last_lid = lid
                st = states.get(lid)
                if st is None:
                    continue  # deleted meanwhile
                dirty.add(lid)
            elif st is None:
                continue
            eid = eids[i]
            if eid <= st.last_entry_id:
                if self._has_entry(lid, eid):
                    continue
            else:
                st.last_entry_id = eid
            data = datas[i]
            put(lid, eid, data)
            piggy = from_bytes(data[16:24], "big", signed=True)
            if piggy > st.lac or st.lac >= eid:  # an LAC, or an entry it covers a poll waits to carry
                st.lac = max(st.lac, piggy)
                if lid in waiting:
                    waiters.notify(lid)

    def _refused(self) -> Status | None:
        if self._switch.failed:
            return Status.STORAGE
        if self._switch.read_only or self._closed:
            return Status.READ_ONLY
        return None

    async def add_batch(self, ops: Sequence[AddOp]) -> list[Status]:
        return await self.add_columns(AddColumns.of(ops))

    async def add_columns(self, adds: AddColumns) -> list[Status]:
        refused = self._refused()
        if refused is not None:
            return [refused] * len(adds)
        keyed: list[tuple[int, bytes]] = []
        adm = admit_runs(self._states, adds, self._entry_size_max, self._has_entry, keyed)
        statuses = adm.statuses
        if not adm.count:
            return statuses
        if self._raise_carried_lacs(adm, adds):
            await asyncio.sleep(0)  # the long polls just woken answer before this batch's (inline) fdatasync
        while (
            self._cache.bytes >= 2 * self._cache_bytes_max
            and self._flush_task is not None
            and not self._flush_task.done()
        ):
            await asyncio.shield(self._flush_task)
        while self._journal_queued_bytes > self._config.journal_queue_bytes_max:
            self._journal_room.clear()
            await self._journal_room.wait()  # bounded queue: woken as groups complete
        prefix = [self._key_record(lid, key) for lid, key in keyed]
        if adm.count == len(adds):
            record = adds_record(adm.sizes, adm.blob, adds.entries, prefix)
        else:
            entries = adds.entries
            chosen = [entries[i] for i in adm.accepted()]
            record = adds_record(list(map(len, chosen)), None, chosen, prefix)
        journal = self._journal
        if journal is None:
            raise InvariantViolation("add_batch before open")
        size = len(record)
        self._journal_queued_bytes += size
        try:
            await journal.submit(record, (_ADDS, adds, adm.rest, adm.runs))
        except StorageError as exc:
            bad = Status.READ_ONLY if isinstance(exc, DiskFullError) else Status.STORAGE
            for i in adm.accepted():
                statuses[i] = bad
        finally:
            self._journal_queued_bytes -= size
            if self._journal_queued_bytes <= self._config.journal_queue_bytes_max:
                self._journal_room.set()
        return statuses

    def _raise_carried_lacs(self, adm: Admission, adds: AddColumns) -> bool:
        """Raise each ledger's LAC to the highest LAC its admitted entries carry, now,
        before they are durable here (as BookKeeper's ledger storage does on ``addEntry``):
        a carried LAC is the writer's statement that every entry up to it is confirmed on
        an ack quorum, true whether or not this bookie keeps these entries, so tailing
        readers may learn it one journal write + fdatasync earlier. Whether a long poll
        was woken (``_on_durable`` raises it again, a no-op then)."""
        states = self._states
        waiting = self._waiters.by_ledger
        woke = False
        for run in adm.runs:
            st = states.get(run.ledger_id)
            if st is not None and run.lac > st.lac:
                st.lac = run.lac
                if run.ledger_id in waiting:
                    self._waiters.notify(run.ledger_id)
                    woke = True
        for i in adm.rest:
            lid = adds.ledger_ids[i]
            st = states.get(lid)
            piggy = int.from_bytes(adds.entries[i][16:24], "big", signed=True)
            if st is not None and piggy > st.lac:
                st.lac = piggy
                if lid in waiting:
                    self._waiters.notify(lid)
                    woke = True
        return woke

    def _key_record(self, ledger_id: int, key: bytes) -> bytes:
        """The framed master-key record of a ledger (kept: one per batch is journaled)."""
        got = self._key_records.get(ledger_id)
        if got is not None and got[0] == key:
            return got[1]
        if len(self._key_records) >= _KEY_RECORDS_MAX:
            self._key_records.clear()
        record = jr.encode_master_key(ledger_id, key)
        self._key_records[ledger_id] = (key, record)
        return record

    def _state_for_write(self, ledger_id: int, master_key: bytes) -> tuple[LedgerState, bytes]:
        if self._switch.failed:
            raise StorageError(f"storage failed: {self._switch.failed}")
        st = self._states.get(ledger_id)
        if st is None:
            st = self._states[ledger_id] = LedgerState(master_key)
        elif st.master_key != master_key:
            raise UnauthorizedError(f"ledger {ledger_id}: master key mismatch")
        # always journaled with the record: replay must know the key (see admit_adds)
        return st, jr.encode_master_key(ledger_id, master_key)

    async def fence(self, ledger_id: int, master_key: bytes) -> LacState:
        st, key_record = self._state_for_write(ledger_id, master_key)
        st.fenced = True
        self._dirty.add(ledger_id)
        await self._journal_write(key_record + jr.encode_fence(ledger_id), None)
        log.info("ledger_fenced", ledger_id=ledger_id, lac=st.lac)
        return st.snapshot()

    async def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> None:
        if self._switch.read_only and not self._switch.failed:
            raise BookieReadOnlyError(f"read-only: {self._switch.reason}")
        st, key_record = self._state_for_write(ledger_id, master_key)
        # Visible at once, before the record is durable: the writer confirmed every entry
        # up to ``lac`` (on an ack quorum) before sending it, so it is true whether or not
        # this bookie keeps the record; tailing readers learn it now.
        self._raise_lac(st, ledger_id, lac)
        await self._journal_write(
            key_record + jr.encode_explicit_lac(ledger_id, lac), (_LAC, ledger_id, lac)
        )

    def note_lac(self, ledger_id: int, lac: int, master_key: bytes) -> None:
        st = self._state(ledger_id)
        if st.master_key != master_key:
            raise UnauthorizedError(f"ledger {ledger_id}: master key mismatch")
        self._raise_lac(st, ledger_id, lac)

    def _raise_lac(self, st: LedgerState, ledger_id: int, lac: int) -> None:
        if lac > st.lac:
            st.lac = lac
            self._waiters.notify(ledger_id)
