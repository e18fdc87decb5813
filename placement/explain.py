"""Explanations for ``scriba shell placement-explain`` and ``placement-check``.

Plain functions returning JSON-ready dicts (and text renderings of them) so a CLI can
print either. ``explain_new_ensemble`` shows the ensemble a policy would pick now and
why, or why it cannot; ``check_ledger`` gives each segment of a ledger its adherence,
per-write-set spread and the problems found. No I/O: the CLI reads the metadata and
builds the Topology.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from scriba.errors import ConfigError, NotEnoughBookiesError
from scriba.ids import BookieId
from scriba.placement.policy import PlacementPolicy
from scriba.placement.spread import write_sets
from scriba.placement.topology import Topology


def _write_set_rows(topology: Topology, ensemble: Sequence[BookieId],
                    write_quorum_size: int) -> list[dict[str, Any]]:
    rows = []
    for w in write_sets(len(ensemble), write_quorum_size):
        locs = [topology.location(ensemble[i]) for i in w]
        rows.append({
            "first_position": w[0],
            "bookies": [ensemble[i] for i in w],
            "regions": len({loc.region_path for loc in locs}),
            "zones": len({loc.zone_path for loc in locs}),
            "racks": len({loc.path for loc in locs}),
        })
    return rows


def _bookie_rows(topology: Topology, ensemble: Sequence[BookieId]) -> list[dict[str, Any]]:
    rows = []
    for b in ensemble:
        node = topology.nodes.get(b)
        rows.append({
            "bookie_id": b,
            "location": topology.location(b).path,
            "state": "unknown" if node is None else ("writable" if node.writable else "read-only"),
        })
    return rows


def explain_new_ensemble(policy: PlacementPolicy, topology: Topology, ensemble_size: int,
                         write_quorum_size: int, ack_quorum_size: int, *,
                         exclude: Collection[BookieId] = frozenset(),
                         local: str | None = None) -> dict[str, Any]:
    """What ``policy`` would choose now, and why (``ok`` False with ``error`` if it cannot)."""
    out: dict[str, Any] = {
        "policy": policy.name,
        "options": policy.options,
        "ensemble_size": ensemble_size,
        "write_quorum_size": write_quorum_size,
        "ack_quorum_size": ack_quorum_size,
        "excluded": sorted(exclude),
        "local": local,
        "topology": topology.summary(),
    }
    try:
        result = policy.new_ensemble(topology, ensemble_size, write_quorum_size, ack_quorum_size,
                                     exclude=exclude, local=local)
    except (NotEnoughBookiesError, ConfigError) as exc:
        out.update(ok=False, error=str(exc), error_type=type(exc).__name__)
        return out
    _, problems = policy.assess(topology, result.bookies, write_quorum_size, ack_quorum_size)
    out.update(
        ok=True,
        ensemble=_bookie_rows(topology, result.bookies),
        adherence=result.adherence.value,
        reasons=list(result.reasons),
        problems=problems,
        write_sets=_write_set_rows(topology, result.bookies, write_quorum_size),
    )
    return out


def check_ledger(policy: PlacementPolicy, topology: Topology,
                 ensembles: Sequence[tuple[int, Sequence[BookieId]]] | Sequence[Sequence[BookieId]],
                 write_quorum_size: int, ack_quorum_size: int) -> list[dict[str, Any]]:
    """One row per segment: first entry, bookies, adherence, write-set spread, problems.

    ``ensembles`` is ``LedgerMetadata.ensembles`` (``(first_entry_id, ensemble)`` pairs)
    or plain ensembles (first entries then read as segment numbers).
    """
    rows = []
    for n, item in enumerate(ensembles):
        if len(item) == 2 and isinstance(item[0], int) and not isinstance(item[1], str):
            first, ensemble = int(item[0]), tuple(item[1])  # type: ignore[arg-type]
        else:
            first, ensemble = n, tuple(item)  # type: ignore[arg-type]
        adherence, problems = policy.assess(topology, ensemble, write_quorum_size, ack_quorum_size)
        rows.append({
            "segment": n,
            "first_entry_id": first,
            "ensemble": _bookie_rows(topology, ensemble),
            "adherence": adherence.value,
            "problems": problems,
            "write_sets": _write_set_rows(topology, ensemble, write_quorum_size),
        })
    return rows


def format_explain_text(doc: dict[str, Any]) -> str:
    lines = [f"policy {doc['policy']} {doc['options']}  "
             f"E={doc['ensemble_size']} W={doc['write_quorum_size']} A={doc['ack_quorum_size']}"]
    topo = doc["topology"]
    lines.append(f"topology: {topo['bookies']} bookies, {topo['writable']} writable, "
                 f"{topo['read_only']} read-only")
    if not doc["ok"]:
        lines.append(f"cannot place: {doc['error']}")
        return "\n".join(lines)
    lines.append(f"adherence: {doc['adherence']}")
    for i, b in enumerate(doc["ensemble"]):
        lines.append(f"  [{i}] {b['bookie_id']:<24} {b['location']}")
    lines.extend(f"why: {r}" for r in doc["reasons"])
    lines.extend(f"problem: {p}" for p in doc["problems"])
    return "\n".join(lines)


def format_check_text(ledger_id: int, rows: Sequence[dict[str, Any]]) -> str:
    lines = []
    for row in rows:
        bookies = ", ".join(f"{b['bookie_id']}{b['location']}" for b in row["ensemble"])
        lines.append(f"ledger {ledger_id} segment {row['segment']} (from entry "
                     f"{row['first_entry_id']}): {row['adherence']}  [{bookies}]")
        lines.extend(f"  - {p}" for p in row["problems"])
    return "\n".join(lines)
