"""Check that a ledger's entries are where its metadata says: every replica of its write set.

:func:`check_replicas` reads entries from *every* bookie of each entry's write set
(``LedgerMetadata.write_set``, i.e. ``scriba.quorum``'s rule) and verifies each copy:
digest (when the ledger's password is known, else the header only), ledger and entry
ids. ``sample`` entries per fragment (first, last and random ones between) or all of
them (``sample=None``). The auditor's periodic check marks what it finds; tests use
the full check as their checker ("every entry readable from every bookie of its write
set"). Only confirmed entries are checked: a closed ledger's, and an open ledger's up
to ``lac`` when one is given (else its last segment is skipped).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Collection
from dataclasses import dataclass

from scriba.autorecovery.fragments import Fragment, fragments
from scriba.client.transport import BookieTransport
from scriba.entry import Digest, peek_header, unpack_entry
from scriba.errors import ScribaError
from scriba.ids import BookieId, EntryId
from scriba.meta.records import LedgerMetadata

CONCURRENT_READS_MAX = 64


@dataclass(frozen=True, slots=True, order=True)
class ReplicaProblem:
    segment_first: EntryId
    entry_id: EntryId
    bookie_id: BookieId
    error: str

    def __str__(self) -> str:
        return f"entry {self.entry_id} on {self.bookie_id}: {self.error}"


def _entries(fragment: Fragment, last: int, sample: int | None, rng: random.Random) -> list[int]:
    first = fragment.first_entry_id
    if last < first or (sample is not None and sample <= 0):
        return []
    if sample is None or last - first + 1 <= sample:
        return list(range(first, last + 1))
    picked = {first, last}  # the ends, then random ones between
    while len(picked) < sample:
        picked.add(rng.randint(first, last))
    return sorted(picked)


async def check_replicas(
    transport: BookieTransport,
    md: LedgerMetadata,
    *,
    digest: Digest | None,
    master_key: bytes = b"",
    sample: int | None = None,
    lac: int | None = None,
    skip: Collection[BookieId] = (),
    rng: random.Random | None = None,
    read_timeout_s: float = 5.0,
) -> list[ReplicaProblem]:
    """Every copy that is missing, corrupt or unreadable (``skip``: bookies not asked;
    ``master_key``: the ledger's, for bookies that guard its reads)."""
    rng = rng or random.Random()
    jobs: list[tuple[EntryId, int, BookieId]] = []
    for fragment in fragments(md):
        last = fragment.last_entry_id if fragment.last_entry_id is not None else lac
        if last is None:
            continue
        for e in _entries(fragment, last, sample, rng):
            for bookie in md.write_set(e):
                if bookie not in skip:
                    jobs.append((fragment.first_entry_id, e, bookie))
    gate = asyncio.Semaphore(CONCURRENT_READS_MAX)

    async def one(segment: EntryId, entry_id: int, bookie: BookieId) -> ReplicaProblem | None:
        async with gate:
            try:
                data = await transport.read_entry(bookie, md.ledger_id, EntryId(entry_id),
                                                  master_key=master_key, timeout_s=read_timeout_s)
                if digest is not None:
                    entry = unpack_entry(digest, data)
                    ids = (entry.ledger_id, entry.entry_id)
                else:
                    header = peek_header(data)
                    ids = (header.ledger_id, header.entry_id)
            except ScribaError as exc:
                return ReplicaProblem(segment, EntryId(entry_id), bookie, type(exc).__name__)
            if ids != (md.ledger_id, entry_id):
                return ReplicaProblem(segment, EntryId(entry_id), bookie, f"header names {ids}")
            return None

    found = await asyncio.gather(*(one(*job) for job in jobs))
    return sorted(p for p in found if p is not None)
