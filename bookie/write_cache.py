"""The write cache: journaled entries not yet flushed to entry logs (bounded by bytes).

Tailing readers are served from here without disk reads. A checkpoint swaps the active
cache for an empty one and flushes the full one (ledger by ledger, so each ledger's
entries sit together in the entry log); the flushed cache is dropped only after the
index that points at the copies is committed. Only the event loop touches a cache while
it is active; a cache being flushed is read-only.

Per ledger the entries are kept as *runs* -- lists of entries with consecutive ids, in
increasing order of first id -- plus a dict for entries that arrived out of order. The
common add (a batch of new consecutive entries of one ledger) extends the last run with
one list operation; a flush takes whole runs (no sort, no lookup per entry); a read is a
list index (the last run) or a bisect over the run starts, and a range read one list
slice per run. Invariant: runs and the dict
never hold the same id twice, and the runs of a ledger do not overlap.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence


class LedgerEntries:
    """The cached entries of one ledger (see the module docstring)."""

    __slots__ = ("extra", "last", "runs", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []  # first entry id of each run, increasing
        self.runs: list[list[bytes]] = []  # runs[i] holds ids starts[i] .. starts[i] + len - 1
        self.extra: dict[int, bytes] = {}  # out-of-order entries (no id of any run)
        self.last = -1  # the highest entry id held

    def get(self, entry_id: int) -> bytes | None:
        starts = self.starts
        if starts:
            run = self.runs[-1]
            k = entry_id - starts[-1]
            if 0 <= k < len(run):
                return run[k]
            if k < 0 and len(starts) > 1:
                i = bisect_right(starts, entry_id) - 1
                if i >= 0:
                    run = self.runs[i]
                    k = entry_id - starts[i]
                    if k < len(run):
                        return run[k]
        extra = self.extra
        return extra.get(entry_id) if extra else None

    def run_from(self, entry_id: int, count_max: int) -> list[bytes]:
        """Up to ``count_max`` consecutive entries from ``entry_id`` held in one run (one
        list slice), or the out-of-order entry ``entry_id`` alone; [] when not held."""
        starts = self.starts
        if starts:
            i = len(starts) - 1
            if entry_id < starts[i]:
                i = bisect_right(starts, entry_id) - 1
            if i >= 0:
                k = entry_id - starts[i]
                run = self.runs[i]
                if k < len(run):
                    return run[k : k + count_max]
        data = self.extra.get(entry_id) if self.extra else None
        return [] if data is None else [data]

    def append_run(self, first: int, entries: Sequence[bytes]) -> None:
        """Consecutive entries from ``first``; caller guarantees ``first > self.last``."""
        starts = self.starts
        if starts and first == self.last + 1 and starts[-1] + len(self.runs[-1]) == first:
            self.runs[-1] += entries
        else:
            starts.append(first)
            self.runs.append(list(entries))
        self.last = first + len(entries) - 1

    def put(self, entry_id: int, entry: bytes) -> bool:
        """Keep the first bytes of an entry; False when it was already here."""
        if entry_id > self.last:
            starts = self.starts
            if starts and entry_id == self.last + 1 and starts[-1] + len(self.runs[-1]) == entry_id:
                self.runs[-1].append(entry)
            else:
                starts.append(entry_id)
                self.runs.append([entry])
            self.last = entry_id
            return True
        if self.get(entry_id) is not None:
            return False
        self.extra[entry_id] = entry
        return True

    def items(self) -> Iterator[tuple[int, bytes]]:
        for first, run in zip(self.starts, self.runs, strict=True):
            yield from zip(range(first, first + len(run)), run, strict=True)
        yield from self.extra.items()

    def nbytes(self) -> int:
        return sum(sum(map(len, run)) for run in self.runs) + sum(map(len, self.extra.values()))

    def __len__(self) -> int:
        return sum(map(len, self.runs)) + len(self.extra)


class WriteCache:
    __slots__ = ("bytes", "count", "ledgers")

    def __init__(self) -> None:
        self.ledgers: dict[int, LedgerEntries] = {}
        self.bytes = 0
        self.count = 0

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        entries = self.ledgers.get(ledger_id)
        return None if entries is None else entries.get(entry_id)

    def run_from(self, ledger_id: int, entry_id: int, count_max: int) -> list[bytes]:
        """Consecutive entries from ``entry_id`` (see :meth:`LedgerEntries.run_from`)."""
        entries = self.ledgers.get(ledger_id)
        return [] if entries is None else entries.run_from(entry_id, count_max)

    def has(self, ledger_id: int, entry_id: int) -> bool:
        entries = self.ledgers.get(ledger_id)
        return entries is not None and entries.get(entry_id) is not None

    def put(self, ledger_id: int, entry_id: int, entry: bytes) -> bool:
        """Keep the first bytes of an entry; False when it was already here."""
        entries = self.ledgers.get(ledger_id)
        if entries is None:
            entries = self.ledgers[ledger_id] = LedgerEntries()
        if not entries.put(entry_id, entry):
            return False
        self.bytes += len(entry)
        self.count += 1
        return True

    def append_run(self, ledger_id: int, first: int, entries: Sequence[bytes], nbytes: int) -> bool:
        """New consecutive entries ``first ..`` of a ledger (``nbytes`` their total size).

        Whole-run operation when every id is above those cached for the ledger; else
        entry by entry (ids already here keep their first bytes). False if nothing new
        was taken by the whole-run path (the caller may then not assume the run is new).
        """
        led = self.ledgers.get(ledger_id)
        if led is None:
            led = self.ledgers[ledger_id] = LedgerEntries()
        if first > led.last:
            led.append_run(first, entries)
            self.bytes += nbytes
            self.count += len(entries)
            return True
        for eid, entry in zip(range(first, first + len(entries)), entries, strict=True):
            self.put(ledger_id, eid, entry)
        return False

    def drop_ledger(self, ledger_id: int) -> None:
        entries = self.ledgers.pop(ledger_id, None)
        if entries is not None:
            self.bytes -= entries.nbytes()
            self.count -= len(entries)

    def segments(self) -> Iterator[tuple[int, Sequence[int], list[bytes]]]:
        """(ledger id, entry ids, entries) in ledger order: whole runs, then the stragglers."""
        for lid in sorted(self.ledgers):
            led = self.ledgers[lid]
            for first, run in zip(led.starts, led.runs, strict=True):
                yield lid, range(first, first + len(run)), run
            if led.extra:
                eids = sorted(led.extra)
                yield lid, eids, list(map(led.extra.__getitem__, eids))
