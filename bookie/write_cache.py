"""The write cache: journaled entries not yet flushed to entry logs (bounded by bytes).

Tailing readers are served from here without disk reads. A checkpoint swaps the active
cache for an empty one and flushes the full one (sorted by ledger and entry, so each
ledger's entries sit together in the entry log); the flushed cache is dropped only
after the index that points at the copies is committed. Only the event loop touches
a cache while it is active; a cache being flushed is read-only.
"""

from __future__ import annotations


class WriteCache:
    __slots__ = ("bytes", "count", "ledgers")

    def __init__(self) -> None:
        self.ledgers: dict[int, dict[int, bytes]] = {}
        self.bytes = 0
        self.count = 0

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        entries = self.ledgers.get(ledger_id)
        return None if entries is None else entries.get(entry_id)

    def has(self, ledger_id: int, entry_id: int) -> bool:
        entries = self.ledgers.get(ledger_id)
        return entries is not None and entry_id in entries

    def put(self, ledger_id: int, entry_id: int, entry: bytes) -> bool:
        """Keep the first bytes of an entry; False when it was already here."""
        entries = self.ledgers.get(ledger_id)
        if entries is None:
            entries = self.ledgers[ledger_id] = {}
        elif entry_id in entries:
            return False
        entries[entry_id] = entry
        self.bytes += len(entry)
        self.count += 1
        return True

    def drop_ledger(self, ledger_id: int) -> None:
        entries = self.ledgers.pop(ledger_id, None)
        if entries:
            self.bytes -= sum(len(e) for e in entries.values())
            self.count -= len(entries)
