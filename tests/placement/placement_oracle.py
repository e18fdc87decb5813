"""Independent checks of placement constraints, written apart from the policies' own code.

Used by the placement tests as the oracle: each function recomputes a policy's
constraint for every round-robin write set from plain tuples, sharing nothing with
``scriba.placement.spread``/``base`` except the names of the options.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from scriba.placement import BookieNode, Topology

FAIL, SOFT, STRICT = 0, 1, 2

DEFAULTS: dict[str, dict[str, Any]] = {
    "random": {},
    "rack-aware": {"min_racks_per_write_quorum": 2, "enforce": False},
    "zone-aware": {"desired_zones_per_write_quorum": 3, "min_zones_per_write_quorum": 2,
                   "strict": True},
    "region-aware": {"min_regions_for_durability": 2, "enforce_durability": True},
}


def all_write_sets(ensemble: Sequence[str], w: int) -> list[list[str]]:
    e = len(ensemble)
    return [[ensemble[(start + i) % e] for i in range(w)] for start in range(e)]


def place(topology: Topology, bookie: str) -> tuple[str, str, str]:
    node = topology.nodes.get(bookie)  # type: ignore[call-overload]
    if node is None:
        return ("default-region", "default-zone", "default-rack")
    return (node.region, node.zone, node.rack)


def expected_adherence(name: str, options: Mapping[str, Any], topology: Topology,
                       ensemble: Sequence[str], w: int, a: int) -> int:
    """FAIL / SOFT / STRICT for ``ensemble`` under policy ``name``, recomputed from scratch."""
    opts = {**DEFAULTS[name], **options}
    if len(set(ensemble)) != len(ensemble):
        return FAIL
    worst = STRICT
    for ws in all_write_sets(ensemble, w):
        locs = [place(topology, b) for b in ws]
        worst = min(worst, _one_write_set(name, opts, locs, w, a))
    return worst


def _one_write_set(name: str, opts: Mapping[str, Any], locs: list[tuple[str, str, str]],
                   w: int, a: int) -> int:
    if name == "random":
        return STRICT
    if name == "rack-aware":
        need = min(w, opts["min_racks_per_write_quorum"])
        return STRICT if len(set(locs)) >= need else FAIL
    if name == "zone-aware":
        zones = len({(r, z) for r, z, _ in locs})
        if zones < min(w, opts["min_zones_per_write_quorum"]):
            return FAIL
        return STRICT if zones >= min(w, opts["desired_zones_per_write_quorum"]) else SOFT
    if name == "region-aware":
        need = opts["min_regions_for_durability"]
        per_region = sorted(Counter(r for r, _, _ in locs).values(), reverse=True)
        if len(per_region) < need:
            return FAIL
        # every subset of `a` bookies must touch `need` regions: the need-1 fullest
        # regions together must hold fewer than `a` bookies of the write set
        if sum(per_region[: need - 1]) >= a:
            return FAIL
        return STRICT if len(set(locs)) == len(locs) else SOFT
    raise AssertionError(name)


def enforced(name: str, options: Mapping[str, Any]) -> bool:
    opts = {**DEFAULTS[name], **options}
    return bool(opts.get("enforce", opts.get("strict", opts.get("enforce_durability", False))))


def constraint_level(name: str) -> int | None:
    """Index into (region, zone, rack) of the level the hard constraint counts."""
    return {"rack-aware": 2, "zone-aware": 1, "region-aware": 0}.get(name)


def domain(topology: Topology, bookie: str, level: int) -> tuple[str, ...]:
    return place(topology, bookie)[: level + 1]


def uniform_topology(regions: int, zones: int, racks: int, bookies: int,
                     free_bytes: int = 0) -> Topology:
    return Topology.from_nodes(
        BookieNode.at(f"r{r}z{z}k{k}b{b}", f"/r{r}/z{z}/k{k}", free_bytes=free_bytes)
        for r in range(regions) for z in range(zones) for k in range(racks) for b in range(bookies)
    )


def random_topology(rng: random.Random, n: int) -> Topology:
    return Topology.from_nodes(
        BookieNode.at(f"b{i}", f"/r{rng.randrange(3)}/z{rng.randrange(3)}/k{rng.randrange(4)}",
                      writable=rng.random() > 0.2)
        for i in range(n)
    )
