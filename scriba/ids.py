"""Identifier types shared by every layer."""

from __future__ import annotations

from typing import Final, NewType

LedgerId = NewType("LedgerId", int)
"""A 63-bit ledger id, unique in a cluster (allocated by the metadata store)."""

EntryId = NewType("EntryId", int)
"""An entry's position in its ledger, from 0. ``INVALID_ENTRY_ID`` (-1) means none."""

BookieId = NewType("BookieId", str)
"""A bookie's stable name (defaults to its ``host:port``)."""

INVALID_ENTRY_ID: Final = EntryId(-1)
LEDGER_ID_MAX: Final = (1 << 63) - 1
