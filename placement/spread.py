"""The search every topology-aware policy shares: pick and arrange bookies over write sets.

Write sets are round-robin (``scriba.quorum.write_sets``): an ensemble of ``E`` has
``E`` write sets (one when ``E == W``), and every one of them must meet the policy. A
policy supplies :class:`Rules`: a per-write-set test (hard constraint, strict goal) and
the levels whose spread it wants (region, zone, rack, or staying in the writer's
region). An ensemble's *score* is a tuple compared lexicographically, lower is better::

    (write sets breaking the hard constraint, write sets missing the strict goal,
     per level: pairs of bookies sharing a domain inside a write set, ...)

Search: a greedy pass fills positions one at a time with a bookie from the rack of
least conflict with the positions already filled (ties broken at random, weighted by
free space, which is what spreads load), then a bounded steepest-descent pass of
swaps and replacements runs only if the greedy result breaks a constraint or misses
the strict goal. Inputs: a :class:`~scriba.placement.topology.Topology`, sizes, the
unavailable set, a ``random.Random``. No I/O; deterministic for a given rng state.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from functools import lru_cache
from typing import Protocol

from scriba.ids import BookieId
from scriba.placement.topology import DEFAULT_LOCATION, Location, RackIndex, Topology
from scriba.quorum import write_sets

REGION, ZONE, RACK, LOCAL = 0, 1, 2, 3
LEVEL_NAMES = {REGION: "region", ZONE: "zone", RACK: "rack", LOCAL: "local"}

Keys = tuple[str, str, str]
Score = tuple[int, ...]

LOCAL_SEARCH_ROUNDS_MAX = 24


class Rules(Protocol):
    """What a policy asks of every write set."""

    @property
    def levels(self) -> tuple[int, ...]: ...

    @property
    def local_region(self) -> str | None: ...

    def window_ok(self, keys: Sequence[Keys]) -> tuple[bool, bool]:
        """(hard constraint holds, strict goal holds) for one write set's bookie keys."""
        ...


@lru_cache(maxsize=256)
def pair_weights(ensemble_size: int, write_quorum_size: int) -> tuple[tuple[int, ...], ...]:
    """How many write sets hold both position p and position q."""
    m = [[0] * ensemble_size for _ in range(ensemble_size)]
    for w in write_sets(ensemble_size, write_quorum_size):
        for p in w:
            for q in w:
                if p != q:
                    m[p][q] += 1
    return tuple(tuple(row) for row in m)


@lru_cache(maxsize=4096)
def keys_of(loc: Location) -> Keys:
    return (loc.region_path, loc.zone_path, loc.path)


def ensemble_keys(topology: Topology, ensemble: Sequence[BookieId]) -> list[Keys]:
    nodes = topology.nodes
    out = []
    for b in ensemble:
        node = nodes.get(b)
        out.append(keys_of(node.location if node is not None else DEFAULT_LOCATION))
    return out


def adherence_of(s: Score) -> int:
    """0 FAIL, 1 MEETS_SOFT, 2 MEETS_STRICT from a score over all write sets."""
    return 0 if s[0] else (1 if s[1] else 2)


def score(rules: Rules, keys: Sequence[Keys], windows: Sequence[Sequence[int]]) -> Score:
    hard = strict = 0
    levels = rules.levels
    conflicts = [0] * len(levels)
    for w in windows:
        wk = [keys[i] for i in w]
        ok_hard, ok_strict = rules.window_ok(wk)
        hard += not ok_hard
        strict += not ok_strict
        for j, level in enumerate(levels):
            if level == LOCAL:
                continue
            counts: dict[str, int] = {}
            for k in wk:
                counts[k[level]] = counts.get(k[level], 0) + 1
            conflicts[j] += sum(c * (c - 1) // 2 for c in counts.values())
    local = rules.local_region
    for j, level in enumerate(levels):
        if level == LOCAL and local is not None:
            conflicts[j] = sum(k[REGION] != local for k in keys)
    return (hard, strict, *conflicts)


class Pool:
    """Writable bookies still free to choose in one call, with per-rack remaining weight."""

    __slots__ = ("_open", "_removed_count", "_removed_weight", "_total", "taken", "topology",
                 "weighted")

    def __init__(self, topology: Topology, unavailable: Collection[BookieId], *,
                 weighted: bool = True) -> None:
        self.topology = topology
        self.weighted = weighted
        self.taken: set[BookieId] = set()
        self._removed_weight: dict[int, float] = {}
        self._removed_count: dict[int, int] = {}
        self._total = [r.total_weight if weighted else float(len(r.bookies)) for r in topology.racks]
        self._open: list[tuple[int, RackIndex]] | None = None
        for b in set(unavailable):
            self.take(b)

    def take(self, bookie_id: BookieId) -> None:
        if bookie_id in self.taken:
            return
        self.taken.add(bookie_id)
        i = self.topology.rack_index_of(bookie_id)
        if i is not None:
            self._removed_weight[i] = self._removed_weight.get(i, 0.0) + self._weight(bookie_id)
            n = self._removed_count[i] = self._removed_count.get(i, 0) + 1
            if n == len(self.topology.racks[i].bookies):
                self._open = None

    def give_back(self, bookie_id: BookieId) -> None:
        if bookie_id not in self.taken:
            return
        self.taken.discard(bookie_id)
        i = self.topology.rack_index_of(bookie_id)
        if i is not None:
            self._removed_weight[i] -= self._weight(bookie_id)
            if self._removed_count[i] == len(self.topology.racks[i].bookies):
                self._open = None
            self._removed_count[i] -= 1

    def _weight(self, bookie_id: BookieId) -> float:
        return self.topology.weight(bookie_id) if self.weighted else 1.0

    def open_racks(self) -> list[tuple[int, RackIndex]]:
        """Racks with at least one free bookie (a cached list: do not modify)."""
        if self._open is None:
            rc = self._removed_count
            self._open = [(i, r) for i, r in enumerate(self.topology.racks)
                          if len(r.bookies) > rc.get(i, 0)]
        return self._open

    def domains(self, level: int) -> dict[str, int]:
        """Free bookies per domain at ``level`` (one bucket "*" for LOCAL)."""
        out: dict[str, int] = {}
        for i, rack in enumerate(self.topology.racks):
            n = len(rack.bookies) - self._removed_count.get(i, 0)
            if n:
                key = "*" if level == LOCAL else rack.keys[level]
                out[key] = out.get(key, 0) + n
        return out

    def size(self) -> int:
        return sum(len(r.bookies) - self._removed_count.get(i, 0)
                   for i, r in enumerate(self.topology.racks))

    def draw(self, racks: Sequence[tuple[int, RackIndex]], rng: random.Random) -> BookieId:
        """A free bookie from ``racks``, chosen with probability proportional to its weight."""
        if len(racks) > 1:
            total, removed = self._total, self._removed_weight
            weights = [max(total[i] - removed.get(i, 0.0), 1e-12) for i, _ in racks]
            rack = racks[_weighted_index(weights, rng)][1]
        else:
            rack = racks[0][1]
        taken = self.taken
        if self.weighted:
            free = [(b, w) for b, w in zip(rack.bookies, rack.weights, strict=True) if b not in taken]
        else:
            free = [(b, 1.0) for b in rack.bookies if b not in taken]
        if len(free) == 1:
            return free[0][0]
        return free[_weighted_index([w for _, w in free], rng)][0]


def _weighted_index(weights: Sequence[float], rng: random.Random) -> int:
    x = rng.random() * sum(weights)
    acc = 0.0
    for i, w in enumerate(weights):
        acc += w
        if x < acc:
            return i
    return len(weights) - 1


def greedy(topology: Topology, ensemble_size: int, write_quorum_size: int, rules: Rules,
           pool: Pool, rng: random.Random) -> list[BookieId]:
    """Fill positions 0..E-1, each from the racks of least conflict with filled neighbours.

    Conflict is compared level by level (the rules' order), filtering the candidate
    racks at each level to those of least conflict; a level with no conflict at all
    is skipped, so an unconstrained pick costs one pass over the open racks.
    """
    pw = pair_weights(ensemble_size, write_quorum_size)
    chosen: list[BookieId] = []
    chosen_keys: list[Keys] = []
    levels = rules.levels
    local = rules.local_region
    for p in range(ensemble_size):
        conflict: list[dict[str, int]] = [{} for _ in levels]
        for q, k in enumerate(chosen_keys):
            w = pw[p][q]
            if not w:
                continue
            for j, level in enumerate(levels):
                if level != LOCAL:
                    d = conflict[j]
                    d[k[level]] = d.get(k[level], 0) + w
        candidates = pool.open_racks()
        for j, level in enumerate(levels):
            if len(candidates) <= 1:
                break
            if level == LOCAL:
                if local is None:
                    continue
                near = [c for c in candidates if c[1].keys[REGION] == local]
                candidates = near or candidates
                continue
            d = conflict[j]
            if not d:
                continue
            values = [d.get(c[1].keys[level], 0) for c in candidates]
            low = min(values)
            candidates = [c for c, v in zip(candidates, values, strict=True) if v == low]
        if not candidates:
            break
        b = pool.draw(candidates, rng)
        pool.take(b)
        chosen.append(b)
        chosen_keys.append(keys_of(topology.location(b)))
    return chosen


def improve(topology: Topology, ensemble: list[BookieId], write_quorum_size: int, rules: Rules,
            pool: Pool, rng: random.Random) -> tuple[list[BookieId], Score]:
    """Steepest descent over swaps and replacements until no hard/strict miss is left.

    ``pool`` must already hold the ensemble's bookies as taken. Bounded rounds.
    """
    e = len(ensemble)
    windows = write_sets(e, write_quorum_size)
    keys = ensemble_keys(topology, ensemble)
    current = score(rules, keys, windows)
    for _ in range(LOCAL_SEARCH_ROUNDS_MAX):
        if current[0] == 0 and current[1] == 0:
            break
        best = current
        move: tuple[str, int, int] | None = None
        for i in range(e):
            for j in range(i + 1, e):
                if keys[i] == keys[j]:
                    continue
                keys[i], keys[j] = keys[j], keys[i]
                s = score(rules, keys, windows)
                keys[i], keys[j] = keys[j], keys[i]
                if s < best:
                    best, move = s, ("swap", i, j)
        open_racks = pool.open_racks()
        for i in range(e):
            old = keys[i]
            for r, rack in open_racks:
                if rack.keys == old:
                    continue
                keys[i] = rack.keys
                s = score(rules, keys, windows)
                if s < best:
                    best, move = s, ("replace", i, r)
            keys[i] = old
        if move is None:
            break
        kind, i, j = move
        if kind == "swap":
            ensemble[i], ensemble[j] = ensemble[j], ensemble[i]
            keys[i], keys[j] = keys[j], keys[i]
        else:
            rack = topology.racks[j]
            b = pool.draw([(j, rack)], rng)
            pool.give_back(ensemble[i])
            pool.take(b)
            ensemble[i] = b
            keys[i] = rack.keys
        current = best
    return ensemble, current


def affected_windows(ensemble_size: int, write_quorum_size: int,
                     index: int) -> tuple[tuple[int, ...], ...]:
    return tuple(w for w in write_sets(ensemble_size, write_quorum_size) if index in w)
