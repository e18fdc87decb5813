"""What each entry log holds: its total bytes and the live bytes of each ledger in it.

A log's *live ratio* is ``live / total``: the share of its bytes the index still points
at. Deleting a ledger makes its bytes in every log dead at once (its rows are dropped);
compaction moves a log's live bytes to the current log. GC removes logs with nothing
live and compacts logs whose ratio is under a threshold (``compaction.py``).

Kept in memory here and in the index (``ledger_index.py``: ``log_totals``,
``ledger_logs``), always written in the same LMDB transaction as the index change that
moves the bytes, so a committed index and its accounting never disagree. A log file with
no totals row was never referenced by a committed index (every commit that points into a
log writes that log's row): it is all dead. Bytes written to a log but not committed (a
crash between the write and the commit) count as dead: at open the total becomes at least
the file's size.

Rows ``(log, ledger) -> live bytes`` never hold 0 (a row that would is deleted).
Invariant: for every log, live bytes <= total bytes, and a ledger's live bytes in a log
are the bytes of that ledger's index records pointing into it.

No I/O here. One thread changes the table (the storage's flusher), any thread reads it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from scriba.log import get_logger

log = get_logger(__name__)

LogLedger = tuple[int, int]  # (log id, ledger id)


@dataclass(frozen=True, slots=True)
class LogUsage:
    """One entry log's figures (a snapshot)."""

    log_id: int
    total_bytes: int
    live_bytes: int

    @property
    def live_ratio(self) -> float:
        return self.live_bytes / self.total_bytes if self.total_bytes > 0 else 0.0

    @property
    def dead_bytes(self) -> int:
        return max(0, self.total_bytes - self.live_bytes)


@dataclass(frozen=True, slots=True)
class LogMetaUpdate:
    """New values to store: ``totals`` per log, ``usage`` per (log, ledger) (0: delete the
    row), and logs to forget entirely (their file is gone)."""

    totals: Mapping[int, int] = field(default_factory=dict)
    usage: Mapping[LogLedger, int] = field(default_factory=dict)
    removed_logs: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.totals or self.usage or self.removed_logs)


class LogMetaTable:
    """Totals and live bytes per ledger of every entry log (see the module docstring)."""

    def __init__(self, totals: Mapping[int, int], live: Mapping[int, Mapping[int, int]]) -> None:
        self._lock = threading.Lock()
        self._totals: dict[int, int] = dict(totals)
        self._live: dict[int, dict[int, int]] = {}
        self._live_sum: dict[int, int] = {}  # sum of each log's _live values
        self._by_ledger: dict[int, set[int]] = {}
        for log_id, per in live.items():
            for lid, n in per.items():
                if n > 0:
                    self._set(log_id, lid, n)
            self._totals.setdefault(log_id, 0)

    # --- reads (any thread) -----------------------------------------------------------

    def usages(self) -> list[LogUsage]:
        with self._lock:
            live = self._live_sum
            return [LogUsage(log_id, total, live.get(log_id, 0)) for log_id, total in sorted(self._totals.items())]

    def usage(self, log_id: int) -> LogUsage | None:
        with self._lock:
            total = self._totals.get(log_id)
            if total is None:
                return None
            return LogUsage(log_id, total, self._live_sum.get(log_id, 0))

    def ledgers_in(self, log_id: int) -> dict[int, int]:
        """Live bytes per ledger in one log (a copy)."""
        with self._lock:
            return dict(self._live.get(log_id, {}))

    def live(self) -> dict[int, dict[int, int]]:
        """Live bytes per ledger of every log (a copy; logs with nothing live left out)."""
        with self._lock:
            return {log_id: dict(per) for log_id, per in self._live.items() if per}

    def __contains__(self, log_id: int) -> bool:
        return log_id in self._totals

    def __len__(self) -> int:
        return len(self._totals)

    # --- updates (the flusher thread) ---------------------------------------------------

    def stage(
        self,
        written: Mapping[int, int],
        added: Mapping[LogLedger, int] = {},
        moved_out: Mapping[LogLedger, int] = {},
    ) -> LogMetaUpdate:
        """The rows after ``written`` bytes were appended per log, of which ``added`` are
        live per (log, ledger), and ``moved_out`` live bytes left their log (compaction).
        Nothing changes until :meth:`apply` (call it once the index committed them)."""
        with self._lock:
            totals = {lid: self._totals.get(lid, 0) + n for lid, n in written.items()}
            usage: dict[LogLedger, int] = {}
            for key, n in added.items():
                usage[key] = usage.get(key, self._live_of(key)) + n
            for key, n in moved_out.items():
                usage[key] = max(0, usage.get(key, self._live_of(key)) - n)
        return LogMetaUpdate(totals, usage)

    def _live_of(self, key: LogLedger) -> int:
        return self._live.get(key[0], {}).get(key[1], 0)

    def forget_live(self, log_id: int) -> LogMetaUpdate:
        """Rows that mark every byte of ``log_id`` dead (its live entries all moved)."""
        with self._lock:
            return LogMetaUpdate({}, {(log_id, lid): 0 for lid in self._live.get(log_id, {})})

    def apply(self, update: LogMetaUpdate) -> None:
        with self._lock:
            for log_id, total in update.totals.items():
                self._totals[log_id] = total
            for (log_id, lid), n in update.usage.items():
                self._set(log_id, lid, n)
                self._totals.setdefault(log_id, 0)
            for log_id in update.removed_logs:
                self._totals.pop(log_id, None)
                for lid in list(self._live.get(log_id, ())):
                    self._set(log_id, lid, 0)

    def drop_ledgers(self, ledger_ids: Iterable[int]) -> int:
        """Forget deleted ledgers (the index dropped their rows); bytes made dead."""
        freed = 0
        with self._lock:
            for lid in ledger_ids:
                for log_id in list(self._by_ledger.get(lid, ())):
                    freed += self._live[log_id][lid]
                    self._set(log_id, lid, 0)
        return freed

    def _set(self, log_id: int, lid: int, n: int) -> None:
        """One row's new value (0: none), keeping the sums and the ledger map (lock held)."""
        per = self._live.setdefault(log_id, {})
        old = per.get(lid, 0)
        if n > 0:
            per[lid] = n
            self._by_ledger.setdefault(lid, set()).add(log_id)
        else:
            per.pop(lid, None)
            logs = self._by_ledger.get(lid)
            if logs is not None:
                logs.discard(log_id)
                if not logs:
                    del self._by_ledger[lid]
        if per:
            self._live_sum[log_id] = self._live_sum.get(log_id, 0) + n - old
        else:
            del self._live[log_id]
            self._live_sum.pop(log_id, None)

    def reconcile(self, file_bytes: Mapping[int, int]) -> LogMetaUpdate:
        """At open: the rows to store so the table matches the log files on disk.

        ``file_bytes``: record bytes of each log file (its size less the file header).
        A file without a row counts as all dead; a total below the file's bytes grows to
        them (bytes written but never committed are dead); a row without a file goes.
        """
        with self._lock:
            totals = {
                log_id: n for log_id, n in file_bytes.items() if self._totals.get(log_id, -1) < n
            }
            gone = tuple(sorted(set(self._totals) - set(file_bytes)))
            lost = {log_id: self._live_sum.get(log_id, 0) for log_id in gone}
        for log_id, n in lost.items():
            if n:
                log.error("entry_log_missing", log_id=log_id, live_bytes=n)
        update = LogMetaUpdate(totals, {}, gone)
        self.apply(update)
        return update
