"""The write core's hot path: CPU per append and per batched ack, against packing alone.

Run: ``.venv/bin/python benchmarks/bench_write_core.py [--entries N] [--rounds R] [--json]``.

``WriteCore.append`` is the one way an entry enters the core (``LedgerWriter`` and the
simulation both use it): it packs the entry (header, CRC32C, payload) and books it in
flight. The baseline, measured in the same run, is the packing alone
(``scriba.entry.pack_entry``), so ``append / pack`` is the core's own overhead. Acks
are the batched path (``on_add_responses``, one call per bookie per run of entries)
that production uses, per entry confirmed. Figures are CPU time (``process_time``), the
best of ``--rounds`` rounds, so a busy machine disturbs them less than wall time.
The ``R2`` shape is the synchronous geo mode (``min_regions_for_durability=2`` over
bookies in two regions): its acks also pass the region check, against the same shape
without it.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from typing import Any

from scriba.client.write_core import WriteCore
from scriba.entry import make_digest, pack_entry
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.records import LedgerMetadata

SHAPES = [(3, 3, 2, 1), (5, 3, 2, 1), (3, 3, 2, 2)]
PAYLOAD = b"v" * 100


def _metadata(e: int, w: int, a: int, regions_min: int = 1) -> LedgerMetadata:
    ensemble = tuple(BookieId(f"bk{i}") for i in range(e))
    regions = {b: f"region{i % regions_min}" for i, b in enumerate(ensemble)} if regions_min > 1 else {}
    return LedgerMetadata(
        ledger_id=LedgerId(1), ensemble_size=e, write_quorum_size=w, ack_quorum_size=a,
        ensembles=((EntryId(0), ensemble),), min_regions_for_durability=regions_min,
        bookie_regions=regions,
    )


def _round(md: LedgerMetadata, entries: int) -> tuple[float, float, float]:
    digest = make_digest("crc32c", b"")
    clock = time.process_time
    t0 = clock()
    for entry_id in range(entries):
        pack_entry(digest, 1, entry_id, entry_id - 1, entry_id * 100, PAYLOAD)
    t1 = clock()
    core = WriteCore(md, digest=digest, choose_replacement=lambda *_: BookieId("none"))
    append = core.append
    t2 = clock()
    for _ in range(entries):
        append(PAYLOAD)
    t3 = clock()
    ids = list(range(entries))
    for bookie_id in md.current_ensemble:
        core.on_add_responses(bookie_id, ids, 0)
    t4 = clock()
    if core.last_add_confirmed != entries - 1:
        raise SystemExit("bench: not every entry was confirmed")
    ns = 1e9 / entries
    return (t1 - t0) * ns, (t3 - t2) * ns, (t4 - t3) * ns


def run(entries: int, rounds: int) -> list[dict[str, Any]]:
    out = []
    gc.disable()
    try:
        for e, w, a, r in SHAPES:
            md = _metadata(e, w, a, r)
            results = [_round(md, entries) for _ in range(rounds)]
            pack, append, acks = (min(r[i] for r in results) for i in range(3))
            out.append({
                "shape": f"E{e}/W{w}/A{a}" + (f" R{r}" if r > 1 else ""), "pack_ns": round(pack), "append_ns": round(append),
                "append_over_pack": round(append / pack, 3), "acks_ns_per_entry": round(acks),
            })
    finally:
        gc.enable()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = run(args.entries, args.rounds)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        print(f"{row['shape']}: append {row['append_ns']} ns ({row['append_over_pack']}x packing "
              f"alone, {row['pack_ns']} ns); batched acks {row['acks_ns_per_entry']} ns per entry")


if __name__ == "__main__":
    main()
